"""Damaged orbax checkpoints are detected by their checksums and skipped.

Real checkpoints written by `Checkpointer` (orbax + grain iterator), then
damaged on disk the ways a crash or a bad disk damages them: flipped bytes
of the same size, a truncated array file, an emptied manifest.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tetrajet_jax.train.checkpointing import (CHECKSUMS_FILE, CheckpointError, Checkpointer,
                                              DamagedCheckpointWarning, verify_checksums)


def _state(step: int):
  return {"w": jnp.arange(4096, dtype=jnp.float32) * (step + 1), "key": jax.random.key(step),
          "step": jnp.asarray(step, jnp.int32)}


@pytest.fixture
def run_dir(tmp_path) -> Path:
  ckpt = Checkpointer(tmp_path, meta={"run": "a"}, keep=3, async_save=True)
  for step in (1, 2, 3):
    ckpt.save(step, _state(step), None)
  ckpt.close()
  return tmp_path


def _restore(directory: Path, step=None):
  ckpt = Checkpointer(directory, meta={"run": "a"}, keep=3)
  try:
    return ckpt.restore(_state(0), None, step)
  finally:
    ckpt.close()


def _largest_file(step_dir: Path, part: str = "state") -> Path:
  files = [f for f in (step_dir / part).rglob("*") if f.is_file()]
  return max(files, key=lambda f: f.stat().st_size)


def _flip_bytes(f: Path) -> None:
  data = bytearray(f.read_bytes())
  mid = len(data) // 2
  data[mid:mid + 8] = bytes(b ^ 0xFF for b in data[mid:mid + 8])
  f.write_bytes(bytes(data))


def _truncate(f: Path) -> None:
  f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _empty_manifest(step_dir: Path) -> None:
  manifests = [f for f in step_dir.rglob("*") if f.is_file() and "manifest" in f.name]
  assert manifests, "orbax wrote no manifest file to damage"
  for f in manifests:
    f.write_bytes(b"")


def test_every_finished_step_has_checksums_and_restores_bitwise(run_dir):
  for step in (1, 2, 3):
    assert (run_dir / str(step) / CHECKSUMS_FILE).is_file()
    assert verify_checksums(run_dir / str(step)) == []
  step, state = _restore(run_dir)
  assert step == 3
  np.testing.assert_array_equal(np.asarray(state["w"]), np.asarray(_state(3)["w"]))
  np.testing.assert_array_equal(jax.random.key_data(state["key"]), jax.random.key_data(_state(3)["key"]))


@pytest.mark.parametrize("damage", ["flipped_bytes", "truncated", "empty_manifest"])
def test_damaged_latest_falls_back_to_the_newest_intact_one(run_dir, damage):
  latest = run_dir / "3"
  if damage == "flipped_bytes":
    f = _largest_file(latest)
    size = f.stat().st_size
    _flip_bytes(f)
    assert f.stat().st_size == size  # same size: only the contents tell
  elif damage == "truncated":
    _truncate(_largest_file(latest))
  else:
    _empty_manifest(latest)
  assert verify_checksums(latest)  # the damage is found before any array is read
  with pytest.warns(DamagedCheckpointWarning, match=r"checkpoint .*/3 is damaged"):
    step, state = _restore(run_dir)
  assert step == 2
  np.testing.assert_array_equal(np.asarray(state["w"]), np.asarray(_state(2)["w"]))


def test_an_explicitly_requested_damaged_step_is_an_error(run_dir):
  _flip_bytes(_largest_file(run_dir / "2"))
  with pytest.raises(CheckpointError, match=r"checkpoint .*/2 is damaged: .*contents changed"):
    _restore(run_dir, step=2)


def test_no_intact_checkpoint_is_an_error_not_a_fresh_start(run_dir):
  for step in (1, 2, 3):
    _truncate(_largest_file(run_dir / str(step)))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DamagedCheckpointWarning)
    with pytest.raises(CheckpointError, match=r"no intact checkpoint in .*\n  checkpoint .*/3 is damaged"):
      _restore(run_dir)


def test_a_checkpoint_without_checksums_that_orbax_cannot_read_is_skipped(run_dir):
  latest = run_dir / "3"
  (latest / CHECKSUMS_FILE).unlink()  # e.g. cut off between orbax's commit and the digests
  _empty_manifest(latest)
  assert verify_checksums(latest) == []
  with pytest.warns(DamagedCheckpointWarning, match="cannot restore|cannot read"):
    step, _ = _restore(run_dir)
  assert step == 2


def test_another_runs_checkpoint_is_refused_not_skipped(run_dir):
  ckpt = Checkpointer(run_dir, meta={"run": "b"}, keep=3)
  with pytest.raises(CheckpointError, match=r"different run:\n  run: checkpoint has 'a', this run has 'b'"):
    ckpt.restore(_state(0), None)
  ckpt.close()
