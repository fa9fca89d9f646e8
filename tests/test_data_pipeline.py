"""grain pipeline: shapes, exact coverage per epoch, sharding, checkpointing."""

from __future__ import annotations

import chex
import grain
import numpy as np
import pytest

from tetrajet_jax.data import pipeline

SEQ, BATCH = 16, 4


def _stream(n: int = 16 * 40 + 1) -> np.ndarray:
  return np.arange(n, dtype=np.uint32)  # every token distinct: coverage is checkable


def _take(it, n):
  return [next(it) for _ in range(n)]


def test_fixed_shapes_and_shifted_targets():
  it = iter(pipeline.make_train_dataset(_stream(), seq_len=SEQ, batch_size=BATCH, seed=0,
                                        shard_index=0, shard_count=1))
  for batch in _take(it, 12):
    chex.assert_shape([batch["inputs"], batch["targets"]], (BATCH, SEQ))
    chex.assert_type([batch["inputs"], batch["targets"]], np.int32)
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])


@pytest.mark.parametrize("shard_count", [1, 2, 3])
def test_each_epoch_covers_every_token_once(shard_count):
  tokens = _stream()
  windows = (tokens.size - 1) // SEQ  # 40
  per_shard = windows // shard_count
  seen = []
  for shard in range(shard_count):
    ds = pipeline.make_train_dataset(tokens, seq_len=SEQ, batch_size=BATCH, seed=3,
                                     shard_index=shard, shard_count=shard_count, num_epochs=1)
    seen += [b["targets"] for b in ds]
  targets = np.concatenate(seen).ravel()
  # Within an epoch no target is duplicated; all kept windows are covered
  # (only the per-shard remainder of < batch_size windows is dropped).
  assert np.unique(targets).size == targets.size
  expected_batches = (per_shard // BATCH) * shard_count
  assert targets.size == expected_batches * BATCH * SEQ
  if shard_count == 1:
    np.testing.assert_array_equal(np.sort(targets), tokens[1:])


def test_epochs_are_shuffled_differently_and_seed_matters():
  tokens = _stream()
  steps = (tokens.size - 1) // SEQ // BATCH  # batches per epoch
  it = iter(pipeline.make_train_dataset(tokens, seq_len=SEQ, batch_size=BATCH, seed=0,
                                        shard_index=0, shard_count=1, num_epochs=2))
  e1 = np.concatenate([b["inputs"][:, 0] for b in _take(it, steps)])
  e2 = np.concatenate([b["inputs"][:, 0] for b in _take(it, steps)])
  np.testing.assert_array_equal(np.sort(e1), np.sort(e2))
  assert not np.array_equal(e1, e2)
  other = iter(pipeline.make_train_dataset(tokens, seq_len=SEQ, batch_size=BATCH, seed=1,
                                           shard_index=0, shard_count=1))
  assert not np.array_equal(e1, np.concatenate([b["inputs"][:, 0] for b in _take(other, steps)]))


def test_iterator_state_restores_the_same_next_batches():
  ds = pipeline.make_train_dataset(_stream(), seq_len=SEQ, batch_size=BATCH, seed=7,
                                   shard_index=0, shard_count=1)
  it = iter(ds)
  _take(it, 13)  # crosses an epoch boundary (10 batches per epoch)
  state = it.get_state()
  expected = _take(it, 5)
  fresh = iter(ds)
  fresh.set_state(state)
  for a, b in zip(expected, _take(fresh, 5)):
    chex.assert_trees_all_equal(a, b)


def test_orbax_checkpoint_round_trip(tmp_path):
  ocp = pytest.importorskip("orbax.checkpoint")
  ds = pipeline.make_train_dataset(_stream(), seq_len=SEQ, batch_size=BATCH, seed=5,
                                   shard_index=0, shard_count=1)
  it = iter(ds)
  _take(it, 3)
  with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
    mngr.save(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    mngr.wait_until_finished()
  expected = _take(it, 4)
  restored = iter(ds)
  with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
    mngr.restore(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(restored)))
  for a, b in zip(expected, _take(restored, 4)):
    chex.assert_trees_all_equal(a, b)


def test_path_source_matches_array_source(tmp_path):
  tokens = _stream().astype(np.uint16)
  np.save(tmp_path / "t.npy", tokens)
  a = _take(iter(pipeline.make_train_dataset(tokens, seq_len=SEQ, batch_size=BATCH, seed=0,
                                             shard_index=0, shard_count=1)), 3)
  b = _take(iter(pipeline.make_train_dataset(tmp_path / "t.npy", seq_len=SEQ, batch_size=BATCH,
                                             seed=0, shard_index=0, shard_count=1)), 3)
  chex.assert_trees_all_equal(a, b)
  assert pipeline.epoch_batches(tmp_path / "t.npy", seq_len=SEQ, batch_size=BATCH) == 10


@pytest.mark.parametrize("shard_count", [1, 2])
def test_validation_pass_scores_every_token_once(shard_count):
  tokens = _stream(16 * 9 + 6)  # partial last window
  batches = []
  for shard in range(shard_count):
    shard_batches = list(pipeline.make_val_dataset(tokens, seq_len=SEQ, batch_size=BATCH,
                                                   shard_index=shard, shard_count=shard_count))
    batches.append(shard_batches)
  assert len({len(b) for b in batches}) == 1  # equal batch counts on every shard
  flat = [b for shard in batches for b in shard]
  for b in flat:
    chex.assert_shape([b["inputs"], b["targets"], b["weights"]], (BATCH, SEQ))
  targets = np.concatenate([b["targets"][b["weights"] > 0] for b in flat])
  np.testing.assert_array_equal(np.sort(targets), tokens[1:])
  again = list(pipeline.make_val_dataset(tokens, seq_len=SEQ, batch_size=BATCH,
                                         shard_index=0, shard_count=shard_count))
  chex.assert_trees_all_equal(again, batches[0])


def test_bad_inputs_raise_clear_errors():
  with pytest.raises(ValueError, match="longer than the corpus"):
    pipeline.make_train_dataset(_stream(10), seq_len=64, batch_size=1, seed=0,
                                shard_index=0, shard_count=1)
  with pytest.raises(ValueError, match="batch_size"):
    pipeline.make_train_dataset(_stream(), seq_len=SEQ, batch_size=100, seed=0,
                                shard_index=0, shard_count=1)
  with pytest.raises(ValueError, match="empty"):
    pipeline.make_val_dataset(np.zeros(1, np.uint16), seq_len=SEQ, batch_size=2,
                              shard_index=0, shard_count=1)
  with pytest.raises(ValueError, match="shard_index"):
    pipeline.make_train_dataset(_stream(), seq_len=SEQ, batch_size=2, seed=0,
                                shard_index=2, shard_count=2)
  with pytest.raises(FileNotFoundError, match="data.build"):
    pipeline.make_train_dataset("/nonexistent/train.npy", seq_len=SEQ, batch_size=2, seed=0)
