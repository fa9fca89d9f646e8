"""Exact and near-duplicate document removal (hash + MinHash/LSH on word shingles).

A `Deduplicator` sees documents one at a time and answers whether each one
duplicates a document it has already kept:

* exact: same sha256 of the text with whitespace runs collapsed;
* near: MinHash signatures of the document's word 5-shingles agree on at
  least ``threshold`` of ``num_perm`` slots (an estimate of the shingle sets'
  Jaccard similarity), found through LSH bands so the check is not
  quadratic.

Everything is seeded and integer arithmetic, so the kept set is the same on
every machine. The first of a group of duplicates (in the order documents
are offered) is kept.
"""

from __future__ import annotations

import hashlib
import re
import zlib

import numpy as np

SHINGLE = 5
_WORD = re.compile(r"\w+")
_SPACE = re.compile(r"\s+")
_MIX = np.uint64(0x9E3779B97F4A7C15)


def shingle_hashes(text: str, k: int = SHINGLE) -> np.ndarray:
  """Distinct uint64 hashes of the text's lower-cased word k-shingles.

  A text with fewer than ``k`` words is one shingle of all its words.
  """
  words = _WORD.findall(text.lower())
  if not words:
    return np.zeros(0, np.uint64)
  wh = np.fromiter((zlib.crc32(w.encode("utf-8")) for w in words), np.uint64, len(words))
  n = max(len(words) - k + 1, 1)
  h = np.zeros(n, np.uint64)
  for j in range(min(k, len(words))):
    h = (h * np.uint64(1_000_003)) ^ wh[j: j + n]
  return np.unique(h)


class Deduplicator:
  """Keeps the first of each group of exact or near-duplicate documents.

  Args:
    num_perm: MinHash signature length.
    bands: LSH bands (``num_perm`` must divide evenly); with 16 bands of 4
      rows, pairs of Jaccard 0.8 collide in some band with probability
      > 0.999 and pairs of 0.3 in about 12%.
    threshold: fraction of equal signature slots that counts as a duplicate.
    seed: seeds the hash permutations.
  """

  def __init__(self, *, num_perm: int = 64, bands: int = 16, threshold: float = 0.8, seed: int = 0):
    if num_perm % bands:
      raise ValueError(f"num_perm={num_perm} must be a multiple of bands={bands}.")
    rng = np.random.default_rng(seed)
    self._a = rng.integers(1, 2**63, size=num_perm, dtype=np.uint64) | np.uint64(1)
    self._b = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64)
    self._bands, self._rows, self._threshold = bands, num_perm // bands, threshold
    self._exact: set[bytes] = set()
    self._buckets: list[dict[bytes, int]] = [{} for _ in range(bands)]
    self._signatures: list[np.ndarray] = []

  def signature(self, text: str) -> np.ndarray:
    """uint64[num_perm] MinHash of the text's shingles (all ones when it has none)."""
    h = shingle_hashes(text)
    if h.size == 0:
      return np.full(self._a.shape, np.iinfo(np.uint64).max, np.uint64)
    v = h[None, :] * self._a[:, None] + self._b[:, None]
    v ^= v >> np.uint64(29)
    v *= _MIX
    return v.min(axis=1)

  def check(self, text: str) -> str | None:
    """Offers one document.

    Returns:
      ``None`` when the document is new (it is kept and later documents are
      compared with it), else ``"exact"`` or ``"near"``.
    """
    key = hashlib.sha256(_SPACE.sub(" ", text).strip().encode("utf-8")).digest()
    if key in self._exact:
      return "exact"
    sig = self.signature(text)
    band_keys = [sig[i * self._rows: (i + 1) * self._rows].tobytes() for i in range(self._bands)]
    seen: set[int] = set()
    for bucket, bkey in zip(self._buckets, band_keys):
      other = bucket.get(bkey)
      if other is not None and other not in seen:
        seen.add(other)
        if np.mean(self._signatures[other] == sig) >= self._threshold:
          return "near"
    self._exact.add(key)
    index = len(self._signatures)
    self._signatures.append(sig)
    for bucket, bkey in zip(self._buckets, band_keys):
      bucket.setdefault(bkey, index)
    return None
