"""Packs what a GPU run needs into one folder that can be carried offline.

Usage::

    python -m tetrajet_jax.data.bundle --out .bundle [--tokenizer bpe16384]
        [--cache DIR] [--no-wheels] [--eval-tasks hellaswag,...]

Layout of the bundle::

    manifest.json                 every file with its size and sha256
    tokenized/<tokenizer>/        train.npy, val.npy, tokenizer.json, manifest.json
    eval/<task>.jsonl.gz          compact downstream requests + manifest.json
    wheels/*.whl                  grain and the dependencies the GPU image lacks

On the GPU machine (no registry)::

    pip install --no-index --no-deps --target /tmp/site .bundle/wheels/*.whl
    PYTHONPATH=/tmp/site python ...   # or tetrajet_jax.data.ensure_bundle_wheels()

`tetrajet_jax.data.locate_data` prefers ``<repo>/.bundle`` when it exists.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

from tetrajet_jax.data import cache, eval_requests, fetch, tokenized

log = logging.getLogger(__name__)
MAX_BUNDLE_BYTES = 60 * 1024 * 1024

# The GPU image has jax, flax, optax, orbax-checkpoint (hence absl-py, etils,
# protobuf), chex, numpy, ml_dtypes, tokenizers and pyarrow. grain needs these
# on top, at the versions pyproject.toml installs here (grain is pinned there;
# the others are what that grain resolved to), so both machines run the same code.
GPU_WHEEL_PINS = {"grain": "0.2.18", "array_record": "0.8.6", "cloudpickle": "3.1.3", "portpicker": "1.6.0"}
GPU_MISSING_PACKAGES = tuple(GPU_WHEEL_PINS)
GPU_PLATFORM_ARGS = (
    "--python-version", "3.12", "--implementation", "cp",
    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
    "--platform", "manylinux2014_x86_64",
)


def gpu_wheel_pins() -> list[str]:
  """``name==version`` for each package the GPU machine lacks."""
  return [f"{name}=={version}" for name, version in GPU_WHEEL_PINS.items()]


def _copy(src: Path, dst: Path) -> None:
  dst.parent.mkdir(parents=True, exist_ok=True)
  if dst.is_file() and dst.stat().st_size == src.stat().st_size and (
      cache.sha256_file(dst) == cache.sha256_file(src)):
    return
  shutil.copyfile(src, dst)


def collect_files(
    *,
    tokenizers: tuple[str, ...] = ("bpe16384",),
    cache_dir: Path | None = None,
    eval_tasks: tuple[str, ...] = eval_requests.DEFAULT_TASKS,
    wheels: bool = True,
) -> tuple[dict[str, Path], dict[str, Any]]:
  """What a bundle holds: bundle-relative path -> source file, plus metadata.

  The eval ``manifest.json`` is written into the cache's ``eval/`` folder
  (as ``bundle-manifest.json``) so that every entry is a file on disk.

  Raises:
    FileNotFoundError: the tokenized data is not built (names the command).
    cache.CorruptCacheError: a cached array fails its checksum.
  """
  cache_dir = cache.resolve_cache_dir(cache_dir)
  files: dict[str, Path] = {}
  for name in tokenizers:
    src = cache_dir / "tokenized" / name
    manifest = cache.read_json(src / "manifest.json")
    if manifest is None:
      flag = "--tokenizer dolma2" if name == "dolma2" else f"--vocab-size {name.removeprefix('bpe')}"
      raise FileNotFoundError(f"{src} is not built; run `{cache.BUILD_COMMAND} {flag}` first.")
    for split in manifest["splits"]:
      tokenized.load_split(src, split, verify=True)
    for fname in ["manifest.json", "tokenizer.json", *(s["file"] for s in manifest["splits"].values())]:
      files[f"tokenized/{name}/{fname}"] = src / fname
  if eval_tasks:
    eval_manifest = {}
    for task in eval_tasks:
      entry = eval_requests.prepare_task(task, cache_dir=cache_dir)
      files[f"eval/{entry['file']}"] = cache_dir / "eval" / entry["file"]
      eval_manifest[task] = entry
    cache.write_json(cache_dir / "eval" / "bundle-manifest.json", eval_manifest)
    files["eval/manifest.json"] = cache_dir / "eval" / "bundle-manifest.json"
  if wheels:
    for pin in gpu_wheel_pins():
      whl = fetch.pypi_wheel(cache_dir / "packages", pin, platform_args=GPU_PLATFORM_ARGS,
                             sub="gpu-wheels")
      files[f"wheels/{whl.name}"] = whl
  meta = {"tokenizers": list(tokenizers), "eval_tasks": list(eval_tasks),
          "wheels": gpu_wheel_pins() if wheels else []}
  return files, meta


def bundle_manifest(files: dict[str, Path], meta: dict[str, Any]) -> dict[str, Any]:
  """The bundle's ``manifest.json``: every file's size and sha256, plus ``meta``."""
  entries = {rel: {"bytes": src.stat().st_size, "sha256": cache.sha256_file(src)}
             for rel, src in sorted(files.items())}
  return {"files": entries, "total_bytes": sum(e["bytes"] for e in entries.values()), **meta}


def pack_bundle(
    out: Path,
    *,
    tokenizers: tuple[str, ...] = ("bpe16384",),
    cache_dir: Path | None = None,
    eval_tasks: tuple[str, ...] = eval_requests.DEFAULT_TASKS,
    wheels: bool = True,
    max_bytes: int = MAX_BUNDLE_BYTES,
) -> dict[str, Any]:
  """Writes the bundle folder and returns its manifest.

  Raises:
    FileNotFoundError: the tokenized data is not built (names the command).
    cache.CorruptCacheError: a cached array fails its checksum.
    ValueError: the bundle would exceed ``max_bytes`` (use
      ``python -m tetrajet_jax.data.pack`` then), or ``out`` is a non-empty
      folder that is not a bundle (it is never wiped then).
  """
  out = Path(out)
  if out.is_dir() and any(out.iterdir()) and not (out / "manifest.json").is_file():
    raise ValueError(f"{out} is a non-empty folder without a bundle manifest; pick another --out.")
  files, meta = collect_files(tokenizers=tokenizers, cache_dir=cache_dir, eval_tasks=eval_tasks,
                              wheels=wheels)
  total = sum(src.stat().st_size for src in files.values())
  if total > max_bytes:
    raise ValueError(f"bundle is {total / 2**20:.1f} MiB > {max_bytes / 2**20:.0f} MiB; pack it into "
                     "parts with `python -m tetrajet_jax.data.pack --out DIR` instead, or pack fewer "
                     "tokenizers or eval tasks, or build a smaller corpus (--sources demo).")
  for sub in ("tokenized", "eval", "wheels"):
    shutil.rmtree(out / sub, ignore_errors=True)  # drop files of an older bundle
  for rel, src in files.items():
    _copy(src, out / rel)
  manifest = bundle_manifest(files, meta)
  cache.write_json(out / "manifest.json", manifest)
  return manifest


def verify_bundle(out: Path) -> None:
  """Checks every file of a bundle against its manifest.

  Raises:
    cache.CorruptCacheError: a file is missing or changed (names the command).
  """
  manifest = cache.read_json(Path(out) / "manifest.json")
  if manifest is None:
    raise cache.CorruptCacheError(f"{out}/manifest.json is missing; re-pack with "
                                  f"`python -m tetrajet_jax.data.bundle --out {out}`.")
  for rel, entry in manifest["files"].items():
    if not cache.file_matches(Path(out) / rel, entry["sha256"]):
      raise cache.CorruptCacheError(f"{out}/{rel} is missing or fails its checksum; re-pack with "
                                    f"`python -m tetrajet_jax.data.bundle --out {out}`.")


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m tetrajet_jax.data.bundle", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", type=Path, default=cache.REPO_ROOT / ".bundle")
  p.add_argument("--tokenizer", default="bpe16384", help="comma-separated tokenizer folders")
  p.add_argument("--cache", type=Path, default=None)
  p.add_argument("--eval-tasks", default=",".join(eval_requests.DEFAULT_TASKS),
                 help="comma-separated, or '' for none")
  p.add_argument("--no-wheels", action="store_true")
  args = p.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
  try:
    manifest = pack_bundle(
        args.out, tokenizers=tuple(t for t in args.tokenizer.split(",") if t),
        cache_dir=args.cache, eval_tasks=tuple(t for t in args.eval_tasks.split(",") if t),
        wheels=not args.no_wheels)
  except (ValueError, FileNotFoundError, fetch.FetchError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  groups: dict[str, int] = {}
  for rel, entry in manifest["files"].items():
    key = rel.split("/")[0] if "/" in rel else rel
    groups[key] = groups.get(key, 0) + entry["bytes"]
  for key, size in sorted(groups.items()):
    print(f"{key:<10} {size / 2**20:8.2f} MiB")
  print(f"{'total':<10} {manifest['total_bytes'] / 2**20:8.2f} MiB in {len(manifest['files'])} files "
        f"-> {args.out}")
  print(f"wheels: {', '.join(manifest['wheels'])}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
