"""A bundle split into checksummed, compressed parts that travel separately.

The GPU machine receives files in transfers of limited size, so the bundle
(`bundle.collect_files`: tokenized arrays, tokenizer, eval requests, wheels)
is cut into parts of at most ``max_part_bytes`` compressed bytes. Each part
is one byte range of one bundle file, compressed on its own with xz (lzma,
in the standard library); 2-byte token arrays are byte-shuffled first (low
bytes, then high bytes), which xz compresses better. ``parts.json`` lists
every part (file, offset, length, sha256 of the raw range and of the part
file) and every rebuilt file's size and sha256.

Parts can arrive over several transfers, into one folder or into its
subfolders: `group_for_transfers` sorts them into ``transfer-N`` subfolders of
at most a given size (``parts.json`` in the first), one per transfer.
`check_parts` reports which are present and valid, and `unpack_parts` refuses
to write anything final until every part is present and every checksum matches.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import lzma
import multiprocessing
import os
import shutil
from pathlib import Path
from typing import Any

from tetrajet_jax.data import cache

PARTS_MANIFEST = "parts.json"
MAX_PART_BYTES = 48 * 2**20
_FORMAT = 1
_XZ_PRESET = 6
UNPACK_COMMAND = "python -m tetrajet_jax.data.unpack --parts DIR"
PACK_COMMAND = "python -m tetrajet_jax.data.pack --out DIR"


class PartsError(ValueError):
  """A part set cannot be unpacked: a part is missing, changed or corrupt."""


class MissingPartsError(PartsError):
  """Some parts (or the parts manifest) have not arrived yet."""


class CorruptPartError(PartsError):
  """A part or a rebuilt file fails its checksum."""


def shuffle2(data: bytes) -> bytes:
  """Byte planes of 2-byte items: all low bytes, then all high bytes."""
  return data[0::2] + data[1::2]


def unshuffle2(data: bytes) -> bytes:
  half = len(data) // 2
  out = bytearray(len(data))
  out[0::2], out[1::2] = data[:half], data[half:]
  return bytes(out)


def _map(fn, *iterables, jobs: int | None) -> list[Any]:
  """``list(map(fn, ...))``, in ``jobs`` spawned processes when more than one."""
  jobs = jobs or os.cpu_count() or 1
  if jobs == 1:
    return list(map(fn, *iterables))
  ctx = multiprocessing.get_context("spawn")  # no fork of a threaded (JAX) parent
  with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
    return list(pool.map(fn, *iterables))


def _sha(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _compress(raw: bytes, transform: str) -> bytes:
  return lzma.compress(shuffle2(raw) if transform == "shuffle2" else raw, preset=_XZ_PRESET)


def _decompress(blob: bytes, transform: str) -> bytes:
  raw = lzma.decompress(blob)
  return unshuffle2(raw) if transform == "shuffle2" else raw


def _transform_for(rel: str, size: int) -> str:
  # .npy of uint16 tokens: the 128-byte header keeps even alignment.
  return "shuffle2" if rel.endswith(".npy") and size % 2 == 0 else "none"


def _plan(rel: str, src: Path, max_part_bytes: int) -> list[dict[str, Any]]:
  """Byte ranges of one file whose parts should fit ``max_part_bytes``.

  The raw range length comes from the compression ratio of a sample (with
  a margin); `_make_part` splits a range that still compresses too large.
  """
  size = src.stat().st_size
  transform = _transform_for(rel, size)
  with open(src, "rb") as f:
    sample = f.read(min(size, 4 * 2**20) & ~1)
  ratio = len(_compress(sample, transform)) / max(len(sample), 1) if sample else 1.0
  step = max(int(max_part_bytes * 0.9 / max(ratio, 1e-3)) & ~1, 2)
  return [{"file": rel, "offset": off, "length": min(step, size - off), "transform": transform}
          for off in range(0, max(size, 1), step)]


def _make_part(src: Path, out_dir: Path, name: str, rng: dict[str, Any], max_part_bytes: int
               ) -> list[tuple[str, dict[str, Any]]]:
  with open(src, "rb") as f:
    f.seek(rng["offset"])
    raw = f.read(rng["length"])
  blob = _compress(raw, rng["transform"])
  if len(blob) > max_part_bytes:
    if rng["length"] < 4096:
      raise PartsError(f"{rng['file']}: {rng['length']} bytes compress to {len(blob)} > "
                       f"{max_part_bytes}; raise --part-mib.")
    half = (rng["length"] // 2) & ~1
    a = {**rng, "length": half}
    b = {**rng, "offset": rng["offset"] + half, "length": rng["length"] - half}
    return (_make_part(src, out_dir, f"{name}a", a, max_part_bytes)
            + _make_part(src, out_dir, f"{name}b", b, max_part_bytes))
  path = out_dir / f"{name}.xz"
  tmp = path.with_suffix(".xz.tmp")
  tmp.write_bytes(blob)
  os.replace(tmp, path)
  return [(path.name, {**rng, "raw_sha256": _sha(raw), "sha256": _sha(blob), "bytes": len(blob)})]


def pack_files(files: dict[str, Path], out_dir: Path, *, max_part_bytes: int = MAX_PART_BYTES,
               jobs: int | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """Compresses ``files`` (bundle-relative path -> source file) into parts.

  Args:
    files: what to pack.
    out_dir: the parts folder (created; stale ``part-*`` files are removed).
    max_part_bytes: largest compressed part.
    jobs: compression processes (default: the CPU count).
    extra: more fields for ``parts.json`` (e.g. the bundle manifest).

  Returns:
    The parts manifest, also written to ``out_dir/parts.json``.
  """
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  for stale in [*out_dir.glob("part-*"), out_dir / PARTS_MANIFEST]:
    stale.unlink(missing_ok=True)
  ranges = [r for rel, src in sorted(files.items()) for r in _plan(rel, src, max_part_bytes)]
  names = [f"part-{i:04d}" for i in range(len(ranges))]
  made = _map(_make_part, [files[r["file"]] for r in ranges], [out_dir] * len(ranges), names,
              ranges, [max_part_bytes] * len(ranges), jobs=jobs)
  parts = dict(p for group in made for p in group)
  file_entries = {rel: {"bytes": src.stat().st_size, "sha256": cache.sha256_file(src),
                        "parts": [n for n, p in parts.items() if p["file"] == rel]}
                  for rel, src in sorted(files.items())}
  manifest = {"format": _FORMAT, "codec": "xz", "max_part_bytes": max_part_bytes,
              "files": file_entries, "parts": parts, **(extra or {})}
  cache.write_json(out_dir / PARTS_MANIFEST, manifest)
  return manifest


def group_for_transfers(parts_dir: Path, max_bytes: int) -> list[Path]:
  """Moves the parts of ``parts_dir`` into subfolders ``transfer-1``, ``transfer-2``, ... of at
  most ``max_bytes`` each (largest parts first, each into the first folder with room), with
  ``parts.json`` in the first: one folder per transfer of that size. Returns the folders.

  Raises:
    ValueError: a part alone is larger than ``max_bytes``.
  """
  parts_dir = Path(parts_dir)
  manifest = read_parts_manifest(parts_dir)
  sizes = {name: part["bytes"] for name, part in manifest["parts"].items()}
  first = (parts_dir / PARTS_MANIFEST).stat().st_size
  if max(sizes.values(), default=0) + first > max_bytes:
    raise ValueError(f"a part of {max(sizes.values()) / 2**20:.1f} MiB does not fit a transfer of "
                     f"{max_bytes / 2**20:.1f} MiB; pack with a smaller --part-mib.")
  groups: list[list[str]] = []
  loads: list[int] = []
  for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
    i = next((i for i, load in enumerate(loads) if load + sizes[name] <= max_bytes), len(loads))
    if i == len(loads):
      groups.append([])
      loads.append(first if len(groups) == 1 else 0)  # parts.json travels with the first
    groups[i].append(name)
    loads[i] += sizes[name]
  folders = []
  for i, names in enumerate(groups, 1):
    folder = parts_dir / f"transfer-{i}"
    folder.mkdir(exist_ok=True)
    for name in names:
      os.replace(parts_dir / name, folder / name)
    folders.append(folder)
  os.replace(parts_dir / PARTS_MANIFEST, folders[0] / PARTS_MANIFEST)
  return folders


def _located(parts_dir: Path, name: str) -> Path:
  """Where a part or the manifest sits: ``parts_dir`` itself, else one of its subfolders
  (transfers copied side by side); the top-level path when it is nowhere."""
  parts_dir = Path(parts_dir)
  if (parts_dir / name).is_file() or not parts_dir.is_dir():
    return parts_dir / name
  found = [sub / name for sub in sorted(parts_dir.iterdir()) if (sub / name).is_file()]
  return found[0] if found else parts_dir / name


def read_parts_manifest(parts_dir: Path) -> dict[str, Any]:
  """The parts manifest (in ``parts_dir`` or one of its subfolders).

  Raises:
    MissingPartsError: ``parts.json`` has not arrived (or is unreadable).
  """
  manifest = cache.read_json(_located(parts_dir, PARTS_MANIFEST))
  if manifest is None or manifest.get("format") != _FORMAT:
    raise MissingPartsError(f"{parts_dir}/{PARTS_MANIFEST} is missing or unreadable; copy it from "
                            f"the packed folder (written by `{PACK_COMMAND}`).")
  return manifest


def check_parts(parts_dir: Path) -> dict[str, list[str]]:
  """Which parts are present and valid; works on a partial set.

  Returns:
    ``{"ok": [...], "missing": [...], "bad": [...]}`` (part file names).

  Raises:
    MissingPartsError: no ``parts.json``.
  """
  manifest = read_parts_manifest(parts_dir)
  status: dict[str, list[str]] = {"ok": [], "missing": [], "bad": []}
  for name, part in sorted(manifest["parts"].items()):
    path = _located(parts_dir, name)
    if not path.is_file():
      status["missing"].append(name)
    elif path.stat().st_size != part["bytes"] or cache.sha256_file(path) != part["sha256"]:
      status["bad"].append(name)
    else:
      status["ok"].append(name)
  return status


def _unpack_part(parts_dir: Path, name: str, part: dict[str, Any], target: Path) -> None:
  raw = _decompress(_located(parts_dir, name).read_bytes(), part["transform"])
  if len(raw) != part["length"] or _sha(raw) != part["raw_sha256"]:
    raise CorruptPartError(f"{parts_dir}/{name} decompresses to data that fails its checksum; "
                           f"copy that part again (or re-run `{PACK_COMMAND}`).")
  with open(target, "r+b") as f:
    f.seek(part["offset"])
    f.write(raw)


def unpack_parts(parts_dir: Path, dest: Path, *, jobs: int | None = None) -> dict[str, Any]:
  """Rebuilds every packed file under ``dest``, all checksums verified first.

  Files are rebuilt in ``dest/.unpack-tmp`` and moved into place only when
  every part and every rebuilt file matches its sha256, so a failed unpack
  leaves ``dest`` as it was.

  Raises:
    MissingPartsError: some parts are absent (all are named).
    CorruptPartError: some parts or rebuilt files fail their checksums.
  """
  parts_dir, dest = Path(parts_dir), Path(dest)
  manifest = read_parts_manifest(parts_dir)
  status = check_parts(parts_dir)
  if status["missing"]:
    raise MissingPartsError(f"{len(status['missing'])} of {len(manifest['parts'])} parts are missing "
                            f"from {parts_dir}: {', '.join(status['missing'])}; copy them and re-run "
                            f"`{UNPACK_COMMAND}`.")
  if status["bad"]:
    raise CorruptPartError(f"parts failing their checksums in {parts_dir}: {', '.join(status['bad'])}; "
                           f"copy them again and re-run `{UNPACK_COMMAND}`.")
  tmp = dest / ".unpack-tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  for rel, entry in manifest["files"].items():
    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
    with open(tmp / rel, "wb") as f:
      f.truncate(entry["bytes"])
  try:
    items = sorted(manifest["parts"].items())
    _map(_unpack_part, [parts_dir] * len(items), [n for n, _ in items], [p for _, p in items],
         [tmp / p["file"] for _, p in items], jobs=jobs)
    for rel, entry in manifest["files"].items():
      if cache.sha256_file(tmp / rel) != entry["sha256"]:
        raise CorruptPartError(f"rebuilt {rel} fails its checksum; re-run `{PACK_COMMAND}` and copy "
                               "every part again.")
  except PartsError:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  for rel in manifest["files"]:
    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp / rel, dest / rel)
  shutil.rmtree(tmp, ignore_errors=True)
  return manifest
