"""grain input pipelines over a packed token stream.

Training: the EOS-joined stream of the train split is cut into consecutive,
non-overlapping windows of ``seq_len + 1`` tokens (``inputs = w[:-1]``,
``targets = w[1:]``; neighbouring windows share one token so every token is a
target exactly once per epoch). Windows are sharded by process, shuffled
with a seed (a new permutation each epoch), repeated and batched with
``drop_remainder=True``::

    MapDataset.source(windows)[shard_index::shard_count]
        .shuffle(seed).repeat(num_epochs).batch(batch_size, drop_remainder=True)
        .to_iter_dataset()

The iterator is a `grain.DatasetIterator`: ``get_state()``/``set_state()``
return/accept a small dict, and orbax saves it next to the model with
``grain.checkpoint.CheckpointSave(iterator)`` /
``grain.checkpoint.CheckpointRestore(iterator)`` inside
``ocp.args.Composite`` (grain 0.2.18 registers its ``CheckpointHandler`` for
these arguments when orbax is importable).

Validation: the val stream in order, one pass, every token scored once; the
last window is padded and ``weights`` (float32[seq_len], 1 = real target)
marks what counts, and the batch count is padded up so shapes never change.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import grain
import jax
import numpy as np

TokensLike = np.ndarray | str | os.PathLike[str]


def _open_tokens(tokens: TokensLike) -> np.ndarray:
  if isinstance(tokens, np.ndarray):
    return tokens
  path = Path(tokens)
  if not path.is_file():
    raise FileNotFoundError(f"{path} does not exist; build the data with "
                            "`python -m tetrajet_jax.data.build`.")
  return np.load(path, mmap_mode="r")


class PackedWindows:
  """Random-access source: window ``i`` of a token stream (grain source).

  Holds the file path rather than the mapped array when built from a path,
  so pickling it into grain worker processes does not copy the tokens.
  """

  def __init__(self, tokens: TokensLike, *, seq_len: int, pad_to: int = 0, pad_id: int = 0,
               with_weights: bool = False):
    self._path = None if isinstance(tokens, np.ndarray) else os.fspath(tokens)
    self._tokens = _open_tokens(tokens)
    if self._tokens.ndim != 1:
      raise ValueError(f"tokens must be 1-D, got shape {self._tokens.shape}")
    self.seq_len = seq_len
    self.num_tokens = int(self._tokens.shape[0])
    self._with_weights = with_weights
    self._pad_id = pad_id
    # Training keeps only full windows; evaluation keeps the partial tail too.
    targets = self.num_tokens - 1
    full = targets // seq_len
    self.num_windows = -(-targets // seq_len) if with_weights else full
    self._len = max(self.num_windows, pad_to)

  def __getstate__(self) -> dict[str, Any]:
    state = dict(self.__dict__)
    if self._path is not None:
      state["_tokens"] = None
    return state

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__dict__.update(state)
    if self._tokens is None:
      self._tokens = _open_tokens(self._path)

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    L = self.seq_len
    start = int(index) * L
    window = np.asarray(self._tokens[start : start + L + 1], np.int32)  # int32[<= L+1]
    n = max(window.shape[0] - 1, 0)  # real targets in this window
    if n < L:
      window = np.concatenate([window, np.full(L + 1 - window.shape[0], self._pad_id, np.int32)])
    out = {"inputs": window[:-1], "targets": window[1:]}
    if self._with_weights:
      weights = np.zeros(L, np.float32)
      weights[:n] = 1.0
      out["weights"] = weights
    return out


def _shard_defaults(shard_index: int | None, shard_count: int | None) -> tuple[int, int]:
  shard_index = jax.process_index() if shard_index is None else shard_index
  shard_count = jax.process_count() if shard_count is None else shard_count
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index={shard_index} must be in [0, shard_count={shard_count}).")
  return shard_index, shard_count


def make_train_dataset(
    tokens: TokensLike,
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
    shard_index: int | None = None,
    shard_count: int | None = None,
    num_epochs: int | None = None,
    read_options: grain.ReadOptions | None = None,
) -> grain.IterDataset:
  """The training batches: ``{"inputs", "targets"}``, each int32[batch_size, seq_len].

  Args:
    tokens: the train token stream (array or ``.npy`` path, e.g.
      ``locate_data().split_path("train")``).
    seq_len: tokens per example.
    batch_size: examples per batch on this process (the per-host batch).
    seed: shuffle seed; epoch ``e`` uses a permutation seeded from ``seed + e``.
    shard_index: this process's shard; default ``jax.process_index()``.
    shard_count: number of shards; default ``jax.process_count()``.
    num_epochs: ``None`` repeats forever.
    read_options: grain thread/prefetch options.

  Returns:
    An IterDataset; ``iter(ds)`` is a checkpointable `grain.DatasetIterator`.

  Example:
    >>> ds = make_train_dataset(locate_data().split_path("train"), seq_len=1024,
    ...                         batch_size=32, seed=0)
    >>> it = iter(ds); batch = next(it); state = it.get_state()
  """
  if seq_len < 1 or batch_size < 1:
    raise ValueError(f"seq_len={seq_len} and batch_size={batch_size} must be >= 1.")
  shard_index, shard_count = _shard_defaults(shard_index, shard_count)
  source = PackedWindows(tokens, seq_len=seq_len)
  if source.num_windows < 1:
    raise ValueError(f"seq_len={seq_len} is longer than the corpus ({source.num_tokens} tokens); "
                     "use a shorter seq_len or build a larger corpus.")
  per_shard = source.num_windows // shard_count
  if per_shard < batch_size:
    raise ValueError(
        f"only {per_shard} windows of {seq_len} tokens per shard ({source.num_windows} in all, "
        f"{shard_count} shards) but batch_size={batch_size}; lower batch_size or seq_len.")
  ds = grain.MapDataset.source(source)
  # Equal shard sizes keep every host stepping in lockstep.
  ds = ds[: per_shard * shard_count][shard_index::shard_count]
  ds = ds.shuffle(seed=seed).repeat(num_epochs)
  ds = ds.batch(batch_size, drop_remainder=True)
  return ds.to_iter_dataset(read_options or grain.ReadOptions(num_threads=2, prefetch_buffer_size=4))


def make_val_dataset(
    tokens: TokensLike,
    *,
    seq_len: int,
    batch_size: int,
    shard_index: int | None = None,
    shard_count: int | None = None,
    pad_id: int = 0,
) -> grain.IterDataset:
  """One deterministic pass over the validation stream, fixed shapes.

  Every token after the first is a target exactly once across all shards;
  padded positions (the stream's tail and the filler batches) have weight 0.

  Returns:
    IterDataset of ``{"inputs", "targets"}`` int32[batch_size, seq_len] and
    ``"weights"`` float32[batch_size, seq_len]. Each shard yields the same
    number of batches.

  Raises:
    ValueError: the split has fewer than two tokens.
  """
  shard_index, shard_count = _shard_defaults(shard_index, shard_count)
  arr = _open_tokens(tokens)
  if arr.shape[0] < 2:
    raise ValueError(f"the validation split has {arr.shape[0]} tokens; it is empty. Rebuild with "
                     "`python -m tetrajet_jax.data.build` and more documents.")
  windows = -(-(arr.shape[0] - 1) // seq_len)
  per_round = batch_size * shard_count
  padded = -(-windows // per_round) * per_round
  source = PackedWindows(tokens, seq_len=seq_len, pad_to=padded, pad_id=pad_id, with_weights=True)
  ds = grain.MapDataset.source(source)[shard_index::shard_count]
  ds = ds.batch(batch_size, drop_remainder=True)
  return ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))


def epoch_batches(tokens: TokensLike, *, seq_len: int, batch_size: int, shard_count: int = 1) -> int:
  """Batches per epoch per shard (steps in one pass over the train split)."""
  source = PackedWindows(tokens, seq_len=seq_len)
  return (source.num_windows // shard_count) // batch_size
