"""Tokenizes the corpus into one EOS-joined token stream per split.

``tokenized/<tokenizer>/{train,val}.npy`` hold ``[EOS, doc, EOS, doc, ...]``
as uint16 (vocabulary <= 65536) or uint32. The EOS in front makes every
document token a prediction target, so the split's byte count is exactly the
bytes the validation loss is measured on (bits per byte stays exact).
Documents are ordered by a seeded shuffle across sources so that packed
sequences that straddle a boundary mix sources, independently of the order
of files on disk.

Train documents appear ``weight`` times (the mixture table's per-source
weight; see `mixture`). Besides ``val.npy``, each source group has its own
validation stream ``val_<group>.npy`` (same layout, that group's held-out
documents), listed in the manifest as split ``val_<group>`` and in
``val_groups``; per-group sums add up to the whole validation set.

``manifest.json`` records the corpus checksum and tokenizer checksum it was
built from and each array's checksum; `load_split` verifies them.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import numpy as np

from tetrajet_jax.data import cache, corpus, mixture
from tetrajet_jax.data.tokenizer import Tokenizer

log = logging.getLogger(__name__)
_ENCODE_CHUNK = 512  # documents per encode_batch call: bounds peak memory


def copies(weight: float, source: str, doc_id: str, seed: int) -> int:
  """How often a train document appears: ``floor(weight)`` plus one more for
  a hash-chosen ``weight - floor(weight)`` share of the documents."""
  whole = int(weight)
  frac = weight - whole
  return whole + (1 if frac > 0 and corpus.split_key(seed + 2, source, doc_id) < frac else 0)


def _encode_split(
    tok: Tokenizer, docs: list[tuple[str, str, str]], seed: int
) -> tuple[np.ndarray, dict[str, dict[str, int]]]:
  """EOS-joined tokens of ``docs`` in a seeded shuffle, and per-source counts
  (``docs``/``bytes``/``tokens`` count each occurrence)."""
  order = list(range(len(docs)))
  random.Random(seed).shuffle(order)
  pieces = [np.array([tok.eos_id], tok.dtype)]
  per_source: dict[str, dict[str, int]] = {}
  for start in range(0, len(order), _ENCODE_CHUNK):
    chunk = [docs[i] for i in order[start : start + _ENCODE_CHUNK]]
    for (source, _, text), ids in zip(chunk, tok.encode_batch([t for _, _, t in chunk])):
      pieces.append(np.asarray(ids + [tok.eos_id], tok.dtype))
      stats = per_source.setdefault(source, {"docs": 0, "bytes": 0, "tokens": 0})
      stats["docs"] += 1
      stats["bytes"] += len(text.encode("utf-8"))
      stats["tokens"] += len(ids)
  return np.concatenate(pieces), per_source


def _split_docs(corpus_dir: Path, corpus_manifest: dict[str, Any], seed: int
                ) -> dict[str, list[tuple[str, str, str]]]:
  """Documents of each stream: ``train`` (weighted), ``val`` and ``val_<group>``."""
  streams: dict[str, list[tuple[str, str, str]]] = {"train": [], "val": []}
  for source, doc_id, text in corpus.iter_documents(corpus_dir, corpus_manifest, "train"):
    weight = corpus_manifest["sources"][source].get("weight", mixture.entry(source).weight)
    streams["train"].extend([(source, doc_id, text)] * copies(weight, source, doc_id, seed))
  for source, doc_id, text in corpus.iter_documents(corpus_dir, corpus_manifest, "val"):
    group = corpus_manifest["sources"][source].get("group", mixture.entry(source).group)
    streams["val"].append((source, doc_id, text))
    streams.setdefault(f"val_{group}", []).append((source, doc_id, text))
  return streams


def tokenize_corpus(
    tok: Tokenizer,
    out_dir: Path,
    *,
    corpus_dir: Path,
    corpus_manifest: dict[str, Any],
    seed: int = 0,
) -> dict[str, Any]:
  """Writes ``train.npy``/``val.npy`` and ``manifest.json`` into ``out_dir``.

  Skipped (the existing manifest is returned) when the corpus, the tokenizer
  and both arrays still match their recorded checksums.

  Raises:
    ValueError: a split has no documents.
  """
  out_dir = Path(out_dir)
  tok_sha = cache.sha256_bytes(tok.hf.to_str().encode())
  inputs = {"corpus": corpus_manifest["sha256"], "tokenizer": tok_sha, "seed": seed, "format": 2}
  old = cache.read_json(out_dir / "manifest.json")
  if old and old.get("inputs") == inputs and all(
      cache.file_matches(out_dir / s["file"], s["sha256"]) for s in old["splits"].values()):
    log.info("tokenized: %s up to date", out_dir)
    return old
  out_dir.mkdir(parents=True, exist_ok=True)
  splits = {}
  for split, docs in _split_docs(corpus_dir, corpus_manifest, seed).items():
    if not docs:
      raise ValueError(f"the {split} split is empty; build a corpus with more documents "
                       "(raise --max-docs-per-source or add sources).")
    tokens, per_source = _encode_split(tok, docs, seed)
    path = out_dir / f"{split}.npy"
    np.save(path, tokens)
    splits[split] = {
        "file": path.name, "sha256": cache.sha256_file(path), "dtype": str(tokens.dtype),
        "tokens": int(tokens.size), "docs": len(docs),
        "bytes": sum(s["bytes"] for s in per_source.values()), "sources": per_source,
    }
    log.info("tokenized: %s %d docs -> %d tokens", split, len(docs), tokens.size)
  manifest = {
      "inputs": inputs, "tokenizer": tok.name, "vocab_size": tok.vocab_size,
      "eos_id": tok.eos_id, "pad_id": tok.pad_id, "splits": splits,
      "val_groups": {s.removeprefix("val_"): s for s in splits if s.startswith("val_")},
  }
  cache.write_json(out_dir / "manifest.json", manifest)
  return manifest


def load_split(
    data_dir: str | Path, split: str, *, verify: bool = True, mmap: bool = True
) -> np.ndarray:
  """The token stream of one split (memory-mapped by default).

  Args:
    data_dir: a ``tokenized/<tokenizer>`` folder (in the cache or the bundle).
    split: ``"train"`` or ``"val"``.
    verify: check the file's sha256 against the manifest first.
    mmap: memory-map instead of reading into RAM.

  Raises:
    cache.CorruptCacheError: missing manifest/array or checksum mismatch.
  """
  data_dir = Path(data_dir)
  manifest = cache.read_json(data_dir / "manifest.json")
  fix = f"rebuild it with `{cache.BUILD_COMMAND}` (and re-pack the bundle if you use one)"
  if manifest is None or split not in manifest.get("splits", {}):
    raise cache.CorruptCacheError(f"{data_dir}/manifest.json is missing or has no "
                                  f"{split!r} split; {fix}.")
  entry = manifest["splits"][split]
  path = data_dir / entry["file"]
  if not path.is_file() or (verify and cache.sha256_file(path) != entry["sha256"]):
    raise cache.CorruptCacheError(f"{path} is missing or fails its checksum; {fix}.")
  return np.load(path, mmap_mode="r" if mmap else None)
