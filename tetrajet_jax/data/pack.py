"""Packs the built data into checksummed parts for the GPU machine.

Usage::

    python -m tetrajet_jax.data.pack --out DIR [--tokenizer bpe16384] [--cache DIR]
        [--eval-tasks hellaswag,...] [--no-wheels] [--part-mib 48] [--transfer-mib M] [--jobs N]

Writes ``DIR/part-NNNN.xz`` (each at most ``--part-mib`` MiB) and
``DIR/parts.json`` (every part's and every rebuilt file's sha256); with
``--transfer-mib``, sorted into ``DIR/transfer-1``, ``transfer-2``, ... of at
most that size each, one per transfer. Copy them over, into one folder or its
subfolders, then run ``python -m tetrajet_jax.data.unpack --parts DIR`` there
(see `parts`).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from tetrajet_jax.data import bundle, eval_requests, fetch, parts


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m tetrajet_jax.data.pack", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", type=Path, required=True, help="folder for the parts")
  p.add_argument("--tokenizer", default="bpe16384", help="comma-separated tokenizer folders")
  p.add_argument("--cache", type=Path, default=None)
  p.add_argument("--eval-tasks", default=",".join(eval_requests.DEFAULT_TASKS),
                 help="comma-separated, or '' for none")
  p.add_argument("--no-wheels", action="store_true")
  p.add_argument("--part-mib", type=float, default=parts.MAX_PART_BYTES / 2**20)
  p.add_argument("--transfer-mib", type=float, default=None,
                 help="sort the parts into transfer-N subfolders of at most this size")
  p.add_argument("--jobs", type=int, default=None, help="compression processes (default: all CPUs)")
  args = p.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
  start = time.perf_counter()
  try:
    files, meta = bundle.collect_files(
        tokenizers=tuple(t for t in args.tokenizer.split(",") if t), cache_dir=args.cache,
        eval_tasks=tuple(t for t in args.eval_tasks.split(",") if t), wheels=not args.no_wheels)
    manifest = parts.pack_files(
        files, args.out, max_part_bytes=int(args.part_mib * 2**20), jobs=args.jobs,
        extra={"bundle_manifest": bundle.bundle_manifest(files, meta)})
    transfers = ([] if args.transfer_mib is None
                 else parts.group_for_transfers(args.out, int(args.transfer_mib * 2**20)))
  except (ValueError, FileNotFoundError, fetch.FetchError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  raw = sum(f["bytes"] for f in manifest["files"].values())
  packed = sum(q["bytes"] for q in manifest["parts"].values())
  biggest = max(q["bytes"] for q in manifest["parts"].values())
  print(f"{len(manifest['files'])} files, {raw / 2**20:.1f} MiB -> {len(manifest['parts'])} parts, "
        f"{packed / 2**20:.1f} MiB (largest {biggest / 2**20:.1f} MiB) in {args.out} "
        f"({time.perf_counter() - start:.0f} s)")
  for folder in transfers:
    size = sum(f.stat().st_size for f in folder.iterdir())
    print(f"  {folder.name}: {len(list(folder.iterdir()))} files, {size / 2**20:.1f} MiB")
  print(f"on the GPU machine: copy {args.out}/parts.json and the parts (or the transfer folders) into one "
        f"folder, then `python -m tetrajet_jax.data.unpack --parts <folder>`")
  return 0


if __name__ == "__main__":
  sys.exit(main())
