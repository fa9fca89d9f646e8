"""Rebuilds the bundle from parts made by ``python -m tetrajet_jax.data.pack``.

Usage::

    python -m tetrajet_jax.data.unpack --parts DIR [--dest .bundle] [--check-only] [--jobs N]

``--check-only`` verifies the parts present so far (a partial set is fine)
and lists the missing ones: exit 0 when the set is complete and valid, 1
otherwise. Without it every part must be present and valid; the rebuilt
files (tokenized arrays, tokenizer, eval requests, wheels) are verified
against their sha256 before anything is moved into ``--dest`` (default
``$TETRAJET_BUNDLE`` or ``<repo>/.bundle``, where `locate_data` looks first).
Exit 2 with a message naming the missing or bad parts otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tetrajet_jax.data import cache, parts
from tetrajet_jax.data.locate import default_bundle_dir


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m tetrajet_jax.data.unpack", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--parts", type=Path, required=True,
                 help="folder holding parts.json and the parts, directly or in subfolders (transfer-N)")
  p.add_argument("--dest", type=Path, default=None, help="bundle folder (default .bundle)")
  p.add_argument("--check-only", action="store_true")
  p.add_argument("--jobs", type=int, default=None)
  args = p.parse_args(argv)
  start = time.perf_counter()
  try:
    if args.check_only:
      status = parts.check_parts(args.parts)
      total = sum(len(v) for v in status.values())
      print(f"{len(status['ok'])} of {total} parts present and valid")
      for kind in ("missing", "bad"):
        if status[kind]:
          print(f"{kind}: {', '.join(status[kind])}")
      return 0 if len(status["ok"]) == total else 1
    dest = args.dest or default_bundle_dir()
    manifest = parts.unpack_parts(args.parts, dest, jobs=args.jobs)
  except parts.PartsError as e:
    print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
    return 2
  cache.write_json(dest / "manifest.json", manifest["bundle_manifest"])
  size = sum(f["bytes"] for f in manifest["files"].values())
  print(f"rebuilt {len(manifest['files'])} files, {size / 2**20:.1f} MiB, all sha256 verified, "
        f"into {dest} in {time.perf_counter() - start:.1f} s")
  for rel, entry in sorted(manifest["files"].items()):
    if rel.endswith(".npy"):
      print(f"  {rel} sha256 {entry['sha256']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
