"""CLI: ``python -m tetrajet_jax.evaluation [--tasks all] [--limit N] [--model unigram]``.

Scores a weight-free baseline (uniform or unigram logits) on the downstream
tasks, which checks the request files, the tokenizer and the scorer end to
end; a trained model calls `evaluate_downstream` with its own logits_fn.

``python -m tetrajet_jax.evaluation --run RESULTS/ARM [--step N] [--tasks ...]
[--limit N] [--val-batches N]`` evaluates a saved checkpoint of a training run
instead (`tetrajet_jax.train.evaluate_run`: validation loss, perplexity,
bits per byte and the downstream tasks, written to
``RESULTS/ARM/eval_step{N}.json``).
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp

from tetrajet_jax.data import locate
from tetrajet_jax.data.eval_requests import TASKS, task_spec
from tetrajet_jax.evaluation.downstream import evaluate_downstream, format_results, unigram_logits_fn


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if any(a == "--run" or a.startswith("--run=") for a in argv):
    # A saved run needs the trainer, a layer above this package: imported only when asked for.
    from tetrajet_jax.train import evaluate_run  # pylint: disable=import-outside-toplevel

    return evaluate_run.main(argv)
  p = argparse.ArgumentParser(prog="python -m tetrajet_jax.evaluation",
                              description="Score a baseline model on the downstream tasks "
                              "(a sanity check of the scorer; models call evaluate_downstream). With --run "
                              "RESULTS/ARM: evaluate a saved checkpoint of a training run (--run RESULTS/ARM --help).")
  p.add_argument("--tasks", default="all", help=f"comma-separated from {list(TASKS)} or 'all'")
  p.add_argument("--limit", type=int, default=None)
  p.add_argument("--model", choices=["uniform", "unigram"], default="unigram")
  p.add_argument("--tokenizer", default=locate.DEFAULT_TOKENIZER)
  p.add_argument("--max-len", type=int, default=1024)
  p.add_argument("--batch-size", type=int, default=32)
  args = p.parse_args(argv)
  tasks = list(TASKS) if args.tasks == "all" else [t for t in args.tasks.split(",") if t]
  try:
    for t in tasks:
      task_spec(t)
    data = locate.locate_data(args.tokenizer, verify=False)
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  tok = data.tokenizer()
  if args.model == "uniform":
    fn = jax.jit(lambda t: jnp.zeros(t.shape + (tok.vocab_size,), jnp.float32))
  else:
    fn = unigram_logits_fn(data.tokens("train"), tok.vocab_size)
  t0 = time.time()
  results = evaluate_downstream(fn, tok, tasks, limit=args.limit, max_len=args.max_len,
                                batch_size=args.batch_size, eval_dir=data.eval_dir)
  print(format_results(results))
  print(f"({args.model} model, {time.time() - t0:.1f} s)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
