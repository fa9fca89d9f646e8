"""Finds the training data: the carried GPU bundle first, then the cache.

The GPU machine reaches no registry, so a run there reads the folder packed
by `tetrajet_jax.data.bundle` (default ``<repo>/.bundle``, or
``$TETRAJET_BUNDLE``); everywhere else the build cache is used.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tetrajet_jax.data import cache, tokenized
from tetrajet_jax.data.tokenizer import Tokenizer

DEFAULT_TOKENIZER = "bpe16384"


def default_bundle_dir() -> Path:
  env = os.environ.get("TETRAJET_BUNDLE")
  return Path(env) if env else cache.REPO_ROOT / ".bundle"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataPaths:
  """Where one tokenizer's data lives.

  Attributes:
    origin: ``"bundle"`` or ``"cache"``.
    root: the ``tokenized/<tokenizer>`` folder.
    eval_dir: folder of compact downstream request files, if present.
    manifest: the tokenized manifest (vocab size, EOS id, split sizes).
  """

  origin: Literal["bundle", "cache"]
  root: Path
  eval_dir: Path | None
  manifest: dict[str, Any]

  @property
  def tokenizer_json(self) -> Path:
    return self.root / "tokenizer.json"

  @property
  def eos_id(self) -> int:
    return int(self.manifest["eos_id"])

  @property
  def vocab_size(self) -> int:
    return int(self.manifest["vocab_size"])

  def split_path(self, split: str) -> Path:
    return self.root / self.manifest["splits"][split]["file"]

  def tokens(self, split: str, *, verify: bool = False) -> np.ndarray:
    """Memory-mapped token stream of ``"train"`` or ``"val"``."""
    return tokenized.load_split(self.root, split, verify=verify)

  def val_group_paths(self) -> dict[str, Path]:
    """``{group: val_<group>.npy}`` (``prose``, ``code``): the held-out
    documents of each source group; empty for data built before groups."""
    return {g: self.split_path(split) for g, split in sorted(self.manifest.get("val_groups", {}).items())}

  def tokenizer(self) -> Tokenizer:
    return Tokenizer.from_file(self.tokenizer_json, name=self.root.name)


def locate_data(
    tokenizer: str = DEFAULT_TOKENIZER,
    *,
    bundle_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    verify: bool = True,
) -> DataPaths:
  """The data of ``tokenizer`` (``"bpe16384"``, ``"dolma2"``, ...).

  Prefers ``bundle_dir/tokenized/<tokenizer>`` when it exists, else the cache.

  Args:
    tokenizer: tokenizer folder name.
    bundle_dir: bundle folder; default ``$TETRAJET_BUNDLE`` or ``<repo>/.bundle``.
    cache_dir: cache root; default ``$TETRAJET_CACHE`` or ``<repo>/cache``.
    verify: check both arrays' sha256 against the manifest (~0.1 s per 30 MB).

  Raises:
    FileNotFoundError: neither location has the data (names the build command).
    cache.CorruptCacheError: the data exists but fails its checksums.
  """
  candidates = [("bundle", Path(bundle_dir) if bundle_dir else default_bundle_dir()),
                ("cache", cache.resolve_cache_dir(cache_dir))]
  for origin, base in candidates:
    root = base / "tokenized" / tokenizer
    manifest = cache.read_json(root / "manifest.json")
    if manifest is None:
      continue
    if verify:
      for split in manifest["splits"]:
        tokenized.load_split(root, split, verify=True)
    if not (root / "tokenizer.json").is_file():
      raise cache.CorruptCacheError(f"{root}/tokenizer.json is missing; rebuild with "
                                    f"`{cache.BUILD_COMMAND}`.")
    eval_dir = base / "eval"
    return DataPaths(origin=origin, root=root, manifest=manifest,
                     eval_dir=eval_dir if eval_dir.is_dir() else None)
  tried = ", ".join(str(b / "tokenized" / tokenizer) for _, b in candidates)
  flag = "--tokenizer dolma2" if tokenizer == "dolma2" else (
      f"--vocab-size {tokenizer[3:]}" if tokenizer.startswith("bpe") else "")
  raise FileNotFoundError(f"no tokenized data for {tokenizer!r} (looked in {tried}); build it with "
                          f"`{cache.BUILD_COMMAND} {flag}`.".replace(" `.", "`."))


def locate_eval_dir(*, bundle_dir: str | os.PathLike[str] | None = None,
                    cache_dir: str | os.PathLike[str] | None = None) -> Path:
  """The bundle's ``eval/`` if present, else the cache's (may not exist yet)."""
  bundle_eval = (Path(bundle_dir) if bundle_dir else default_bundle_dir()) / "eval"
  return bundle_eval if bundle_eval.is_dir() else cache.resolve_cache_dir(cache_dir) / "eval"


def ensure_bundle_wheels(
    bundle_dir: str | os.PathLike[str] | None = None, target: str | os.PathLike[str] = "/tmp/tetrajet-site",
) -> bool:
  """Makes ``import grain`` work on a machine without it, from the bundle.

  Installs the bundle's wheels with ``pip install --no-index --no-deps
  --target`` (no network) and puts the target on ``sys.path``.

  Returns:
    True when grain imports afterwards.
  """
  try:
    import grain  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    return True
  except ImportError:
    pass
  wheels = sorted(((Path(bundle_dir) if bundle_dir else default_bundle_dir()) / "wheels").glob("*.whl"))
  if not wheels:
    return False
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                  "--target", str(target), *map(str, wheels)], check=True)
  if str(target) not in sys.path:
    sys.path.insert(0, str(target))
  sys.path_importer_cache.pop(str(target), None)  # a finder cached before the install would miss grain
  import grain  # noqa: F401,F811  pylint: disable=import-outside-toplevel,unused-import,reimported
  return True
