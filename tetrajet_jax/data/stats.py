"""The build's raw statistics file and the tables rendered from it.

`collect_stats` turns a build result into a JSON-serialisable dict (per
source: group, licence, weight, cap, documents, bytes, tokens, duplicates
dropped; per group and overall; splits; stage wall times; cache disk use).
The build writes it to ``<cache>/stats.json`` (and ``--stats-out``); the
documentation tables are rendered from that file, never typed::

    python -m tetrajet_jax.data.stats --stats docs/data/corpus_stats.json --update docs/DATA.md

replaces the text between ``<!-- corpus-stats:start -->`` and
``<!-- corpus-stats:end -->`` in the given Markdown file.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from tetrajet_jax.data import cache, corpus, mixture

START, END = "<!-- corpus-stats:start -->", "<!-- corpus-stats:end -->"


def disk_bytes(folder: Path) -> int:
  """Bytes of all regular files under ``folder`` (links not followed)."""
  total = 0
  for root, _, files in os.walk(folder):
    for name in files:
      path = Path(root) / name
      if not path.is_symlink():
        total += path.stat().st_size
  return total


def collect_stats(result: dict[str, Any], *, wall_seconds: dict[str, float], cache_dir: Path
                  ) -> dict[str, Any]:
  """The raw statistics of one build (see the module docstring)."""
  cm, tm = result["corpus"], result["tokenized"]
  sources = {}
  for name, e in sorted(cm["sources"].items()):
    tokens = {s: tm["splits"][s]["sources"].get(name, {}).get("tokens", 0) for s in corpus.SPLITS}
    unique_train = tokens["train"] if e.get("weight", 1.0) == 1.0 else None
    sources[name] = {
        "group": e.get("group", mixture.entry(name).group), "licence": e.get("licence", ""),
        "weight": e.get("weight", 1.0), "cap_bytes": e.get("cap_bytes"),
        "description": e["description"], "version": e["version"],
        "docs": e["docs"], "bytes": e["bytes"], "val_docs": e["val_docs"],
        "train_bytes": e["train_bytes"], "val_bytes": e["val_bytes"],
        "loaded_docs": e.get("loaded_docs"), "loaded_bytes": e.get("loaded_bytes"),
        "dropped_exact": e.get("dropped_exact"), "dropped_near": e.get("dropped_near"),
        "dropped_cap": e.get("dropped_cap"), "build_seconds": e.get("build_seconds"),
        "train_tokens_in_stream": tokens["train"], "val_tokens": tokens["val"],
        "unique_train_tokens": unique_train,
    }
  groups: dict[str, dict[str, int]] = {}
  for s in sources.values():
    g = groups.setdefault(s["group"], {"docs": 0, "bytes": 0, "train_tokens": 0, "val_tokens": 0})
    g["docs"] += s["docs"]
    g["bytes"] += s["bytes"]
    g["train_tokens"] += s["train_tokens_in_stream"]
    g["val_tokens"] += s["val_tokens"]
  splits = {k: {f: v[f] for f in ("docs", "bytes", "tokens", "dtype", "sha256", "file")}
            for k, v in tm["splits"].items()}
  return {"tokenizer": tm["tokenizer"], "vocab_size": tm["vocab_size"], "sources": sources,
          "groups": groups, "splits": splits, "failed": cm["failed"],
          "wall_seconds": wall_seconds, "cache_disk_bytes": disk_bytes(cache_dir)}


def _row(cells: list[str]) -> str:
  return "| " + " | ".join(cells) + " |"


def render_markdown(stats: dict[str, Any]) -> str:
  """The per-source table, group totals and split table in Markdown."""
  lines = [_row(["source", "group", "docs", "bytes", "tokens", "bytes/token", "val docs",
                 "dups dropped (exact+near)", "cap (MB)", "weight", "licence"]),
           _row(["---"] * 2 + ["---:"] * 8 + ["---"])]
  for name, s in stats["sources"].items():
    tokens = s["train_tokens_in_stream"] / max(s["weight"], 1e-9) + s["val_tokens"]
    cap = "" if s["cap_bytes"] is None else f"{s['cap_bytes'] / 1e6:.0f}"
    dups = f"{s['dropped_exact'] or 0}+{s['dropped_near'] or 0}"
    lines.append(_row([name, s["group"], f"{s['docs']:,}", f"{s['bytes']:,}", f"{tokens:,.0f}",
                       f"{s['bytes'] / max(tokens, 1):.2f}", f"{s['val_docs']:,}", dups, cap,
                       f"{s['weight']:g}", s["licence"]]))
  total_tokens = sum(g["train_tokens"] + g["val_tokens"] for g in stats["groups"].values())
  lines += ["", _row(["group", "docs", "bytes", "train tokens", "val tokens", "share of tokens"]),
            _row(["---"] + ["---:"] * 5)]
  for g, v in sorted(stats["groups"].items()):
    share = (v["train_tokens"] + v["val_tokens"]) / max(total_tokens, 1)
    lines.append(_row([g, f"{v['docs']:,}", f"{v['bytes']:,}", f"{v['train_tokens']:,}",
                       f"{v['val_tokens']:,}", f"{100 * share:.1f}%"]))
  lines += ["", _row(["stream", "file", "docs", "bytes", "tokens", "bytes/token"]),
            _row(["---", "---"] + ["---:"] * 4)]
  for k, v in stats["splits"].items():
    lines.append(_row([k, v["file"], f"{v['docs']:,}", f"{v['bytes']:,}", f"{v['tokens']:,}",
                       f"{v['bytes'] / max(v['tokens'], 1):.3f}"]))
  wall = ", ".join(f"{k} {v:.0f} s" for k, v in stats["wall_seconds"].items())
  per_source = sum(s["build_seconds"] or 0 for s in stats["sources"].values())
  lines += ["", f"Tokenizer {stats['tokenizer']} (vocabulary {stats['vocab_size']:,}). "
            f"Wall time of the run that wrote this file: {wall}; the sources' own build times "
            f"(download, parse, dedup; recorded when each was built) add up to {per_source:.0f} s. "
            f"Cache disk use: {stats['cache_disk_bytes'] / 2**30:.2f} GiB."]
  for name, why in sorted(stats["failed"].items()):
    lines.append(f"Skipped source {name}: {why}")
  return "\n".join(lines)


def update_markdown(doc: Path, stats: dict[str, Any]) -> None:
  """Replaces the block between the markers in ``doc`` with the rendered tables.

  Raises:
    ValueError: the markers are missing.
  """
  text = doc.read_text(encoding="utf-8")
  if START not in text or END not in text:
    raise ValueError(f"{doc} has no {START} ... {END} block; add the two markers where the "
                     "tables go.")
  head, rest = text.split(START, 1)
  _, tail = rest.split(END, 1)
  doc.write_text(f"{head}{START}\n{render_markdown(stats)}\n{END}{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m tetrajet_jax.data.stats", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--stats", type=Path, required=True, help="a stats.json written by the build")
  p.add_argument("--update", type=Path, default=None, help="Markdown file to update in place")
  args = p.parse_args(argv)
  stats = cache.read_json(args.stats)
  if stats is None:
    print(f"error: {args.stats} is missing; run `{cache.BUILD_COMMAND} --stats-out {args.stats}`.",
          file=sys.stderr)
    return 2
  if args.update is None:
    print(render_markdown(stats))
    return 0
  try:
    update_markdown(args.update, stats)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
