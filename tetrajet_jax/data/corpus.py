"""Builds the document corpus: sources -> cleaned documents -> train/val split.

Output, per source, ``corpus/<source>.jsonl`` with one ``{"id", "split",
"text"}`` object per line, and ``corpus/manifest.json`` with each source's
fingerprint (its inputs), checksum (its output) and counts. A source whose
fingerprint and checksum match is not rebuilt; a source that fails (registry
unreachable, format changed) is skipped with a warning and reported.

The split is held out by document: a document is in validation when a hash of
``(seed, source, doc_id)`` falls below ``val_fraction``. The assignment of a
document never depends on which other documents exist, so capping a source
(``max_docs_per_source``) keeps the documents it keeps in the same split.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tetrajet_jax.data import cache, dedup, mixture
from tetrajet_jax.data import sources as sources_lib

log = logging.getLogger(__name__)
SPLITS = ("train", "val")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CorpusConfig:
  """What to build.

  Attributes:
    sources: source names, keys of `sources.SOURCES` (or of ``extra_sources``
      passed to `build_corpus`).
    cache_dir: cache root (``corpus/`` and ``packages/`` live under it).
    max_docs_per_source: keep only the first N documents (sorted by id) of
      each source; ``None`` keeps all. For quick tests.
    val_fraction: expected fraction of documents held out for validation.
    seed: seed of the split hash.
  """

  sources: tuple[str, ...] = sources_lib.DEFAULT_SOURCES
  cache_dir: Path = dataclasses.field(default_factory=cache.default_cache_dir)
  max_docs_per_source: int | None = None
  val_fraction: float = 0.02
  seed: int = 0

  def __post_init__(self):
    if not self.sources:
      raise ValueError("CorpusConfig.sources is empty: name at least one source, "
                       f"e.g. one of {list(sources_lib.SOURCES)}.")
    if not 0.0 < self.val_fraction < 1.0:
      raise ValueError(f"val_fraction={self.val_fraction} must be in (0, 1), e.g. 0.02.")
    if self.max_docs_per_source is not None and self.max_docs_per_source < 2:
      raise ValueError(f"max_docs_per_source={self.max_docs_per_source} must be >= 2 "
                       "(one train and one validation document) or None.")
    object.__setattr__(self, "cache_dir", Path(self.cache_dir))

  @property
  def corpus_dir(self) -> Path:
    return self.cache_dir / "corpus"

  @property
  def packages_dir(self) -> Path:
    return self.cache_dir / "packages"


def split_key(seed: int, source: str, doc_id: str) -> float:
  digest = hashlib.sha256(f"{seed}\x00{source}\x00{doc_id}".encode()).digest()
  return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_splits(
    source: str, doc_ids: list[str], *, val_fraction: float, seed: int
) -> list[str]:
  """The split of each document.

  Any source with two or more documents gets at least one in each split (the
  lowest-hash document is moved to validation, the highest to train), so a
  capped source still contributes to both.
  """
  keys = [split_key(seed, source, d) for d in doc_ids]
  splits = ["val" if k < val_fraction else "train" for k in keys]
  if len(doc_ids) >= 2:
    if "val" not in splits:
      splits[min(range(len(keys)), key=keys.__getitem__)] = "val"
    if "train" not in splits:
      splits[max(range(len(keys)), key=keys.__getitem__)] = "train"
  return splits


def _source_fingerprint(config: CorpusConfig, source: sources_lib.Source) -> str:
  return cache.fingerprint({
      "source": source.name, "version": source.version,
      "max_docs": config.max_docs_per_source, "cap_bytes": mixture.entry(source.name).cap_bytes,
      "val_fraction": config.val_fraction, "seed": config.seed, "format": 2,
  })


def select_documents(
    name: str, docs: list[tuple[str, str]], *, cap_bytes: int | None, seed: int
) -> tuple[list[tuple[str, str]], dict[str, int]]:
  """Drops exact and near duplicates and applies the byte cap.

  Documents are visited in a seeded hash order of their ids (so a cap keeps a
  spread sample whose membership does not depend on file order); the first
  of each duplicate group in that order is kept; visiting stops once the
  kept bytes reach ``cap_bytes``.

  Returns:
    The kept documents sorted by id, and counts ``{"dropped_exact",
    "dropped_near", "dropped_cap", "loaded_docs", "loaded_bytes"}``.
  """
  order = sorted(range(len(docs)), key=lambda i: split_key(seed + 1, name, docs[i][0]))
  dd = dedup.Deduplicator(seed=seed)
  kept, total = [], 0
  stats = {"dropped_exact": 0, "dropped_near": 0, "dropped_cap": 0, "loaded_docs": len(docs),
           "loaded_bytes": sum(len(t.encode("utf-8")) for _, t in docs)}
  for rank, i in enumerate(order):
    if cap_bytes is not None and total >= cap_bytes:
      stats["dropped_cap"] = len(order) - rank
      break
    verdict = dd.check(docs[i][1])
    if verdict is not None:
      stats[f"dropped_{verdict}"] += 1
      continue
    kept.append(docs[i])
    total += len(docs[i][1].encode("utf-8"))
  return sorted(kept), stats


def _build_source(config: CorpusConfig, source: sources_lib.Source) -> dict[str, Any]:
  docs = source.load(config.packages_dir)
  ids = [d for d, _ in docs]
  if ids != sorted(ids) or len(set(ids)) != len(ids):
    raise ValueError(f"source {source.name}: document ids must be unique and sorted")
  docs = [(d, t) for d, t in docs if t]
  if config.max_docs_per_source is not None:
    docs = docs[: config.max_docs_per_source]
  if not docs:
    raise ValueError(f"source {source.name} produced no documents")
  row = mixture.entry(source.name)
  docs, selection = select_documents(source.name, docs, cap_bytes=row.cap_bytes, seed=config.seed)
  splits = assign_splits(source.name, [d for d, _ in docs],
                         val_fraction=config.val_fraction, seed=config.seed)
  path = config.corpus_dir / f"{source.name}.jsonl"
  tmp = path.with_suffix(".jsonl.tmp")
  counts = {f"{s}_{k}": 0 for s in SPLITS for k in ("docs", "bytes")}
  with open(tmp, "w", encoding="utf-8") as f:
    for (doc_id, text), split in zip(docs, splits):
      f.write(json.dumps({"id": doc_id, "split": split, "text": text}, ensure_ascii=False))
      f.write("\n")
      counts[f"{split}_docs"] += 1
      counts[f"{split}_bytes"] += len(text.encode("utf-8"))
  os.replace(tmp, path)
  return {
      "file": path.name, "sha256": cache.sha256_file(path),
      "fingerprint": _source_fingerprint(config, source),
      "version": source.version, "description": source.description,
      "group": row.group, "weight": row.weight, "cap_bytes": row.cap_bytes, "licence": row.licence,
      "docs": len(docs), "bytes": counts["train_bytes"] + counts["val_bytes"], **counts, **selection,
  }


def build_corpus(
    config: CorpusConfig,
    *,
    extra_sources: Mapping[str, sources_lib.Source] | None = None,
) -> dict[str, Any]:
  """Builds (or reuses) every requested source and writes the manifest.

  Args:
    config: what to build and where.
    extra_sources: additional sources by name (tests inject synthetic ones
      here so they go through the same path as the registry sources).

  Returns:
    The corpus manifest: ``{"sources": {name: entry}, "failed": {name: why},
    "config": ..., "sha256": <hash over the used sources' checksums>}``.

  Raises:
    ValueError: an unknown source name, or every source failed.
  """
  registry = {**sources_lib.SOURCES, **(extra_sources or {})}
  unknown = [s for s in config.sources if s not in registry]
  if unknown:
    raise ValueError(f"unknown corpus source(s) {unknown}; valid: {sorted(registry)}")
  config.corpus_dir.mkdir(parents=True, exist_ok=True)
  manifest_path = config.corpus_dir / "manifest.json"
  old = (cache.read_json(manifest_path) or {}).get("sources", {})
  used, failed = {}, {}
  for name in sorted(config.sources):
    source = registry[name]
    prev = old.get(name)
    if (prev and prev.get("fingerprint") == _source_fingerprint(config, source)
        and cache.file_matches(config.corpus_dir / prev["file"], prev["sha256"])):
      log.info("corpus: %s up to date (%d docs)", name, prev["docs"])
      used[name] = prev
      continue
    try:
      log.info("corpus: building %s", name)
      start = time.perf_counter()
      used[name] = _build_source(config, source)
      used[name]["build_seconds"] = round(time.perf_counter() - start, 1)
      log.info("corpus: %s: %d docs, %d bytes (%d loaded, %d exact + %d near dups, %d over cap) "
               "in %.1f s", name, used[name]["docs"], used[name]["bytes"], used[name]["loaded_docs"],
               used[name]["dropped_exact"], used[name]["dropped_near"], used[name]["dropped_cap"],
               used[name]["build_seconds"])
      # Record progress now, so an interrupted build resumes after this source.
      cache.write_json(manifest_path, {"sources": {**old, **used}, "failed": {}, "partial": True})
    except Exception as e:  # pylint: disable=broad-except  (skip, do not crash)
      log.warning("corpus: skipping source %r: %s: %s", name, type(e).__name__, e)
      failed[name] = f"{type(e).__name__}: {e}"
  if not used:
    raise ValueError(f"no corpus source could be built ({failed}); check registry "
                     f"access and re-run `{cache.BUILD_COMMAND}`.")
  manifest = {
      "config": {"sources": sorted(config.sources), "max_docs_per_source":
                 config.max_docs_per_source, "val_fraction": config.val_fraction,
                 "seed": config.seed},
      "sources": used,
      "failed": failed,
      "sha256": cache.fingerprint({n: e["sha256"] for n, e in sorted(used.items())}),
  }
  cache.write_json(manifest_path, manifest)
  return manifest


def iter_documents(
    corpus_dir: Path, manifest: dict[str, Any], split: str, *, verify: bool = True
) -> Iterator[tuple[str, str, str]]:
  """Yields ``(source, doc_id, text)`` of one split, sources in sorted order.

  Raises:
    cache.CorruptCacheError: a source file is missing or fails its checksum.
  """
  if split not in SPLITS:
    raise ValueError(f"split={split!r}; valid: {SPLITS}")
  for name, entry in sorted(manifest["sources"].items()):
    path = Path(corpus_dir) / entry["file"]
    if verify and not cache.file_matches(path, entry["sha256"]):
      raise cache.CorruptCacheError(
          f"{path} is missing or fails its checksum; rebuild it with "
          f"`{cache.BUILD_COMMAND} --cache {Path(corpus_dir).parent}`.")
    with open(path, encoding="utf-8") as f:
      for line in f:
        doc = json.loads(line)
        if doc["split"] == split:
          yield name, doc["id"], doc["text"]
