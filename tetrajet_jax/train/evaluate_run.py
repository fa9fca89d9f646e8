"""Evaluating a saved run's checkpoint: ``python -m tetrajet_jax.evaluation --run RESULTS/ARM``.

Rebuilds the run's trainer from ``RESULTS/ARM/config.json`` (the TrainConfig
under ``"train"``) and its data (``"data_root"``, else the data named
``"data"`` wherever `locate_data` finds it), restores a checkpoint of
``RESULTS/ARM/checkpoints`` (``--step N``, default the newest intact one) and
scores it: validation loss, perplexity and bits per byte, and the downstream
tasks. Writes ``RESULTS/ARM/eval_step{N}.json``. The run's own files
(metrics, config, checkpoints) are only read.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from tetrajet_jax.data import locate
from tetrajet_jax.data.eval_requests import TASKS
from tetrajet_jax.evaluation.downstream import TaskResult, evaluate_downstream, format_results
from tetrajet_jax.train.checkpointing import Checkpointer, CheckpointError
from tetrajet_jax.train.config import TrainConfig, TrainData
from tetrajet_jax.train.trainer import Trainer

DOWNSTREAM_BATCH = 32  # rows per downstream scoring call


class RunError(ValueError):
  """The folder is not a saved run this code can evaluate."""


def load_run_config(run_dir: Path) -> tuple[TrainConfig, dict[str, Any]]:
  """(the run's TrainConfig, the whole config.json)."""
  path = run_dir / "config.json"
  if not path.is_file():
    raise RunError(f"{path} does not exist; --run takes an arm's folder of a results folder "
                   "(it holds config.json and checkpoints/).")
  saved = json.loads(path.read_text(encoding="utf-8"))
  fields = {f.name for f in dataclasses.fields(TrainConfig)}
  unknown = sorted(set(saved["train"]) - fields)
  if unknown:
    raise RunError(f"{path}: unknown TrainConfig fields {unknown}; it was written by another version.")
  return TrainConfig(**saved["train"]), saved


def locate_run_data(saved: dict[str, Any], data_root: str | None = None) -> locate.DataPaths:
  """The run's data: ``data_root`` (a ``tokenized/<name>`` folder), else config.json's, else by name."""
  root = data_root or saved.get("data_root")
  if root:
    root = Path(root)
    if not root.is_dir():
      raise FileNotFoundError(f"the run's data folder {root} does not exist; pass --data-root "
                              "TOKENIZED_FOLDER (a tokenized/<name> folder).")
    base = root.parents[1]  # <base>/tokenized/<name>, for a bundle and a cache alike
    return locate.locate_data(root.name, bundle_dir=base / "_no_bundle", cache_dir=base, verify=True)
  return locate.locate_data(saved["data"], verify=True)


def evaluate_run(run_dir: str | Path, *, step: int | None = None, tasks: list[str] | None = None,
                 limit: int | None = None, val_batches: int | None = None, data_root: str | None = None,
                 batch_size: int = DOWNSTREAM_BATCH) -> dict[str, Any]:
  """Scores checkpoint ``step`` (None: the newest intact) of the run in ``run_dir``; writes and returns
  ``eval_step{N}.json``'s content.

  Args:
    run_dir: an arm's folder (config.json, checkpoints/).
    step: checkpoint step; None = the newest intact one.
    tasks: downstream tasks (None or [] = none).
    limit: questions per task (None: all).
    val_batches: validation batches (None: the whole split).
    data_root: the data's tokenized/<name> folder (default: the run's).
    batch_size: rows per downstream scoring call.

  Raises:
    RunError: not a run folder; CheckpointError: no (intact) checkpoint or
    a damaged requested step; FileNotFoundError: the data is missing.
  """
  run_dir = Path(run_dir)
  config, saved = load_run_config(run_dir)
  ckpt_dir = run_dir / "checkpoints"
  if not ckpt_dir.is_dir():
    raise CheckpointError(f"{ckpt_dir} does not exist: the run kept no checkpoint (--keep-checkpoints 0 "
                          "deletes them at the end).")
  paths = locate_run_data(saved, data_root)
  t0 = time.time()
  trainer = Trainer(config, TrainData.from_located(paths), None, progress=False, tensorboard=False)
  checkpointer = Checkpointer(ckpt_dir, meta=trainer.checkpoint_meta(), keep=max(1, len(list(ckpt_dir.iterdir()))),
                              async_save=False, meta_defaults={"data_shards": 1})
  try:
    restored = trainer.restore(checkpointer, step)
    val = trainer.evaluate(max_batches=val_batches)
    downstream = {}
    if tasks:
      eval_dir = paths.eval_dir or locate.locate_eval_dir()
      res = evaluate_downstream(trainer.logits_fn(), paths.tokenizer(), tasks, limit=limit,
                                max_len=config.seq_len, batch_size=batch_size, eval_dir=eval_dir)
      downstream = {t: dataclasses.asdict(r) for t, r in res.items()}
  finally:
    trainer.close()
  out = {"run": str(run_dir), "arm": config.arm, "step": restored, "tokens": restored * config.tokens_per_step,
         "data": str(paths.root), "val": val, "downstream": downstream, "wall_s": time.time() - t0}
  path = run_dir / f"eval_step{restored}.json"
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
  tmp.replace(path)
  return out


def main(argv: list[str]) -> int:
  """``python -m tetrajet_jax.evaluation --run RESULTS/ARM [--step N] [--tasks ...] [--limit N] [--val-batches N]``."""
  p = argparse.ArgumentParser(prog="python -m tetrajet_jax.evaluation",
                              description="Evaluate a saved checkpoint of a training run.")
  p.add_argument("--run", type=Path, required=True, help="an arm's folder: RESULTS/ARM")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest intact one)")
  p.add_argument("--tasks", default="all", help=f"comma-separated from {list(TASKS)}, 'all' or 'none'")
  p.add_argument("--limit", type=int, default=None, help="questions per task (default: all)")
  p.add_argument("--val-batches", type=int, default=None, help="validation batches (default: the whole split)")
  p.add_argument("--data-root", default=None, help="the data's tokenized/<name> folder (default: the run's)")
  args = p.parse_args(argv)
  tasks = [] if args.tasks in ("none", "") else list(TASKS) if args.tasks == "all" else args.tasks.split(",")
  bad = [t for t in tasks if t not in TASKS]
  if bad:
    print(f"error: unknown task(s) {bad}; valid: {', '.join(TASKS)}, 'all' or 'none'.", file=sys.stderr)
    return 2
  try:
    out = evaluate_run(args.run, step=args.step, tasks=tasks, limit=args.limit, val_batches=args.val_batches,
                       data_root=args.data_root)
  except (RunError, CheckpointError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  val = out["val"]
  print(f"{out['arm']} step {out['step']} ({out['tokens']:,} tokens): val loss {val['loss']:.4f}, PPL "
        f"{val['ppl']:.3f}, bits/byte {val['bits_per_byte']:.4f} on {val['tokens']:,.0f} tokens")
  if out["downstream"]:
    print(format_results({t: TaskResult(**r) for t, r in out["downstream"].items()}))
  print(f"wrote {args.run / f'eval_step{out['step']}.json'} ({out['wall_s']:.0f} s)")
  return 0

