"""Trainer: schedule rules, every arm learns, exact resume, NaN stop, checkpoint errors, bad input."""

from __future__ import annotations

import dataclasses
import math
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from tetrajet_jax.train import (ARMS, CheckpointError, NonFiniteLossError, Schedule, TrainConfig,
                                Trainer, default_lr_steps, parse_arms, read_jsonl, scaled_calibration,
                                scaled_osci_reset)
from tetrajet_jax.train.checkpointing import DamagedCheckpointWarning


# Tests that train an arm use one run (this config, plus logging fields such as checkpoint_every) where
# they can: Trainers of the same run share their compiled steps (`step.COMPILED`), and the module runs
# on one xdist worker (the Makefile's --dist loadfile). Calibration on steps 2-3 (so a checkpoint at 3
# is mid-window), OsciReset's first window on steps 3-4.
def _cfg(arm, **kw):
  base = dict(model="tiny", arm=arm, layers=1, batch_size=2, seq_len=64, total_steps=12, warmup_steps=2,
              peak_lr=3e-3, calib_start=2, calib_steps=2, osci_start=3, osci_period=4, osci_window=2)
  base.update(kw)
  return TrainConfig(**base)


def inject_nan(trainer: Trainer, leaf_path: tuple[str, ...] = ("final_norm", "weight")) -> None:
  """Poisons one parameter with NaN (for testing the non-finite stop)."""
  params = trainer.state["params"]
  node = params
  for k in leaf_path[:-1]:
    node = node[k]
  node[leaf_path[-1]] = jnp.full_like(node[leaf_path[-1]], jnp.nan)
  trainer.state = {**trainer.state, "params": params}


def test_schedule_closed_form():
  s = Schedule(total_steps=101, warmup_steps=10, peak_lr=1.0, final_ratio=0.1)
  assert float(s.lr(0)) == pytest.approx(0.1)
  assert float(s.lr(9)) == pytest.approx(1.0)
  assert float(s.lr(10)) == pytest.approx(1.0)
  assert float(s.lr(55)) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 45 / 90)))
  assert float(s.lr(100)) == pytest.approx(0.1)


def test_scaled_windows_reproduce_the_reference_placement():
  # 70M reference: 12,505 steps of 1024 x 4096 tokens; warmup 1e9 tokens, t_max 50e9 tokens;
  # OsciReset S = 8000, P = 200, T = 50; OutControl calibration on steps 501-550.
  warmup, t_max = default_lr_steps(12505)
  assert (warmup, t_max) == (238, 11921)  # 1e9 / 4194304 = 238.4, 50e9 / 4194304 = 11920.9
  s = Schedule(total_steps=12505, warmup_steps=warmup, t_max_steps=t_max, peak_lr=4e-4)
  w = scaled_osci_reset(s)
  assert (w.start_step, w.period, w.window) == (8000, 200, 50)
  assert 0.26 <= float(s.lr(w.start_step)) / 4e-4 <= 0.42
  c = scaled_calibration(s)
  assert (c.start, c.length) == (501, 50)
  # A shorter run moves only S, to the same point of its schedule.
  warmup, t_max = default_lr_steps(2500)
  short = scaled_osci_reset(Schedule(total_steps=2500, warmup_steps=warmup, t_max_steps=t_max, peak_lr=1.0))
  assert (short.period, short.window) == (200, 50)
  assert abs(short.start_step / 2500 - 8000 / 12505) < 2e-3


@pytest.mark.parametrize("arm", list(ARMS))
def test_train_step_lowers_the_loss_for_every_arm(arm, data):
  trainer = Trainer(_cfg(arm), data, progress=False)
  trainer.train()
  model = trainer.model()
  losses = [r["train/loss"] for r in trainer.history]
  assert losses[0] > 5.0  # ~log(256) at init
  assert np.mean(losses[-3:]) < losses[0] - 1.0, losses
  if ARMS[arm].outcontrol:  # calibrated on steps 2-3, then frozen channels
    from tetrajet_jax import nn as qnn
    tree = qnn.outlier_channels_tree(model)
    assert any(x is not None for x in __import__("jax").tree.leaves(tree, is_leaf=lambda x: x is None))
  if ARMS[arm].quantized:
    assert "osci/risk_frac" in trainer.history[-1]


def test_resume_continues_exactly(tmp_path, data):
  cfg = _cfg("tetrajet_v2_full", checkpoint_every=3)  # resumes mid-calibration and mid-window
  full = Trainer(cfg, data, tmp_path / "full", progress=False)
  full.train()
  full.close()
  part = Trainer(cfg, data, tmp_path / "part", progress=False)
  r = part.train(num_steps=4)  # checkpoint at 3; the run then "dies" at step 4
  assert r.status == "paused" and part.checkpointer.latest_step() == 4
  part.close()
  shutil.rmtree(tmp_path / "part" / "checkpoints" / "4")  # lose the newest checkpoint too
  resumed = Trainer(cfg, data, tmp_path / "part", resume=True, progress=False)
  assert resumed.step == 3
  resumed.train()
  resumed.close()
  a = [r for r in read_jsonl(tmp_path / "full" / "metrics.jsonl") if "train/loss" in r]
  b = [r for r in read_jsonl(tmp_path / "part" / "metrics.jsonl") if "train/loss" in r]
  assert [r["step"] for r in b] == list(range(12))
  for ra, rb in zip(a, b):  # CPU: bitwise equal metrics, OsciReset/OutControl included
    for k in ra:
      if k.startswith(("train/", "osci/")):
        assert ra[k] == rb[k] or (math.isnan(ra[k]) and math.isnan(rb[k])), (ra["step"], k)


def test_nan_stops_cleanly_and_keeps_the_last_good_checkpoint(tmp_path, data):
  cfg = _cfg("bf16", checkpoint_every=2, total_steps=8)
  t = Trainer(cfg, data, tmp_path, progress=False)
  t.train(num_steps=4)
  good = {k: np.asarray(v) for k, v in t.state["params"]["final_norm"].items()}
  inject_nan(t)
  with pytest.raises(NonFiniteLossError, match=r"step 4: non-finite train/loss=nan.*last good checkpoint is step 4"):
    t.train()
  assert t.checkpointer.all_steps()[-1] == 4
  t.close()
  again = Trainer(cfg, data, tmp_path, resume=True, progress=False)
  assert again.step == 4
  np.testing.assert_array_equal(np.asarray(again.state["params"]["final_norm"]["weight"]), good["weight"])
  again.close()


def test_corrupt_and_incompatible_checkpoints_raise(tmp_path, data):
  cfg = _cfg("bf16", checkpoint_every=2, total_steps=8)
  t = Trainer(cfg, data, tmp_path, progress=False)
  t.train(num_steps=2)
  t.close()
  with pytest.raises(CheckpointError, match="already holds checkpoint step 2"):
    Trainer(cfg, data, tmp_path, progress=False)
  with pytest.raises(CheckpointError, match=r"different run:\n  train.peak_lr: checkpoint has 0.003"):
    Trainer(_cfg("bf16", checkpoint_every=2, total_steps=8, peak_lr=1e-3), data, tmp_path, resume=True,
            progress=False)
  for f in (tmp_path / "checkpoints" / "2" / "state").rglob("*"):
    if f.is_file() and f.stat().st_size > 0 and "manifest" in f.name:
      f.write_bytes(b"garbage")
  # The only checkpoint is damaged: no fresh start over it, and the damage is named.
  with pytest.warns(DamagedCheckpointWarning), pytest.raises(
      CheckpointError, match=r"no intact checkpoint in .*\n  checkpoint .*/2 is damaged: state/.*manifest"):
    Trainer(cfg, data, tmp_path, resume=True, progress=False)


def test_bad_input_is_rejected_before_compute():
  with pytest.raises(ValueError, match="not a multiple of 128"):
    TrainConfig(model="tiny", arm="tetrajet_v2", batch_size=3, seq_len=100, total_steps=10)
  TrainConfig(model="tiny", arm="bf16", batch_size=3, seq_len=100, total_steps=10)  # bf16 has no blocks
  with pytest.raises(ValueError, match="valid arms: bf16, nvidia_nvfp4"):
    parse_arms("bf16,fp4_magic")
  with pytest.raises(ValueError, match="valid models: tiny, 20m, 70m"):
    TrainConfig(model="7b", arm="bf16", batch_size=1, seq_len=128, total_steps=10)
  with pytest.raises(ValueError, match="warmup_steps=10 must be in"):
    TrainConfig(model="tiny", arm="bf16", batch_size=1, seq_len=128, total_steps=10, warmup_steps=10)


def test_fp4_and_calibrate_updates_share_one_compiled_step(data):
  """A run's fp4 updates execute the calibrating graph (one compiled step for
  both phases); the statistics they gather are zeroed when the window opens."""
  from tetrajet_jax import nn as qnn

  def stats(trainer):
    return [np.asarray(layer.oc_stats[...]) for _, layer in qnn.iter_quant_linears(trainer.model())
            if layer.has_outcontrol]

  trainer = Trainer(_cfg("tetrajet_v2_outcontrol"), data, progress=False, tensorboard=False)
  trainer.train(2)  # updates 0-1: phase fp4
  step_fn = trainer._step_fn()  # pylint: disable=protected-access
  assert stats(trainer) and all(s.sum() > 0 for s in stats(trainer))
  trainer._ensure_phase(2)  # pylint: disable=protected-access  (update 2 opens the window)
  assert all(not s.any() for s in stats(trainer))
  assert trainer._step_fn() is step_fn  # pylint: disable=protected-access
  trainer.train(2)  # updates 2-3: calibrate; then frozen from the accumulated window
  assert all(s.sum() > 0 for s in stats(trainer))


@pytest.mark.parametrize("arm", ["tetrajet_v2", "tetrajet_v2_full"])
def test_split_update_is_the_whole_chain_bitwise(arm, data):
  """The Trainer runs an update with an OsciReset member (the monitor, or OsciReset itself) as two
  compiled functions; over six updates (calibration, a window, its reset) the state is bit for bit
  that of the whole chain in one function, OsciReset fed the layers' outlier channels. The reference
  applies the updates in a function of their own: fused into AdamW's loop, XLA rounds the sum
  differently for a few elements (seen on the CPU: 3 of 32768 of the embedding's)."""
  import jax
  import optax
  from flax import nnx

  from tetrajet_jax import nn as qnn
  from tetrajet_jax.model.olmo2 import lm_loss

  def whole_update(state, batch, graphdef, tx, z_loss):
    params = state["params"]

    def loss_of(p):
      model = nnx.merge(graphdef, p, state["model"])
      loss, _ = lm_loss(model(batch["inputs"]), batch["targets"], z_loss=z_loss)
      return loss, nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.Param)))

    (_, new_vars), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
    channels = qnn.outlier_channels_tree(nnx.merge(graphdef, params, new_vars), params)
    updates, opt = tx.update(grads, state["opt"], params, outlier_channels=channels)
    return {"params": params, "model": new_vars, "opt": opt, "step": state["step"] + 1}, updates

  split = Trainer(_cfg(arm), data, progress=False, tensorboard=False)
  split.train(6)
  ref = Trainer(_cfg(arm), data, progress=False, tensorboard=False)
  step, apply = jax.jit(whole_update, static_argnums=(2, 3, 4)), jax.jit(optax.apply_updates)
  for s in range(6):
    ref._ensure_phase(s)  # pylint: disable=protected-access
    state, updates = step(ref.state, ref._next_batch(), ref._graphdef, ref.tx,  # pylint: disable=protected-access
                          ref.model_config.z_loss)
    ref.state = {**state, "params": apply(state["params"], updates)}
  if arm == "tetrajet_v2_full":  # the reset happened, so the comparison covers it
    assert float(split.history[-1]["osci/reset_frac"]) > 0
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, split.state),
               jax.tree.map(np.asarray, ref.state))


def test_precompile_fills_the_persistent_cache_for_every_phase(tmp_path, data):
  """--precompile's contract: each OutControl phase's step is compiled into the
  on-disk cache, the state is left alone, and training then loads, not compiles."""
  import jax
  from jax._src import compilation_cache, monitoring

  # Phases: fp4 (steps 0-1), calibrate (2-3), frozen (4-5); validation after steps 2 and 5. 6 steps: a run
  # of its own, whose functions no other test compiled in this process.
  cfg = _cfg("tetrajet_v2_outcontrol", total_steps=6, eval_every=3)
  saved = {k: getattr(jax.config, k) for k in ("jax_compilation_cache_dir",
                                               "jax_persistent_cache_min_compile_time_secs",
                                               "jax_persistent_cache_min_entry_size_bytes")}
  hits = []
  listener = lambda event, **kw: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
  try:
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()
    trainer = Trainer(cfg, data, progress=False, tensorboard=False)
    before = jax.tree.map(np.asarray, trainer.state)
    assert trainer.precompile(logits_shapes=[(2, 32)]) == ["fp4", "calibrate", "frozen"]
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, trainer.state), before)
    assert trainer.step == 0
    # 2 graphs (fp4 and calibrate run one), each with its train step and the oscillation monitor's
    # step per window phase its updates meet (updates 0-2 outside, 3 a window's first, 4-5 inside:
    # 3 + 2 programs), + validation in 2 phases + the final forward
    # (counted by name: run alone, the process also caches the eager ops of the model's init)
    run_functions = ("jit_update_step-", "jit_train_step-", "jit_oscillation_step-", "jit_eval_stats-", "jit_logits-")
    assert len([f for f in (tmp_path / "cache").iterdir() if f.name.startswith(run_functions)]) == 8
    # A fresh trainer of the same run (as in another process) finds all of them on disk.
    from tetrajet_jax.train import step as step_lib
    step_lib.COMPILED.clear()
    monitoring.register_event_listener(listener)
    fresh = Trainer(cfg, data, progress=False, tensorboard=False)
    fresh.train()
    fresh.logits_fn()(np.zeros((2, 32), np.int32))
    assert len(hits) >= 8, hits
  finally:
    if listener in monitoring.get_event_listeners():
      monitoring.unregister_event_listener(listener)
    for k, v in saved.items():
      jax.config.update(k, v)
    compilation_cache.reset_cache()


def test_lower_run_lowers_every_phases_train_step_first(data):
  """precompile starts each function's XLA compile as soon as it is lowered, so the train steps (the
  longest compiles) come first, then the oscillation steps, validation and the forward."""
  cfg = _cfg("tetrajet_v2_outcontrol", total_steps=6, eval_every=3)
  trainer = Trainer(cfg, data, progress=False, tensorboard=False)
  phases, lowered = trainer.lower_run(logits_shapes=[(2, 32)])
  assert phases == ["fp4", "calibrate", "frozen"]
  kinds = [key[0] for key in lowered]
  assert kinds[:2] == ["train", "train"] and "train" not in kinds[2:]  # two graphs: fp4 and calibrate share one
  assert sorted(kinds[2:]) == sorted(["oscillation/outside", "oscillation/first", "oscillation/inside", "eval",
                                      "eval", "logits"]), kinds


def test_validation_reports_each_source_group_and_their_sum(data):
  """Per-group validation (prose, code): each group's numbers are those of scoring that stream
  alone, and the overall ones add the groups' sums (token-weighted loss)."""
  rng = np.random.default_rng(1)
  groups = {"code": np.tile(rng.integers(2, 256, size=89), 4).astype(np.uint16),
            "prose": np.tile(rng.integers(2, 256, size=97), 5).astype(np.uint16)}
  token_bytes = rng.integers(1, 5, size=256).astype(np.int32)
  cfg = _cfg("tetrajet_v2")
  grouped = Trainer(cfg, dataclasses.replace(data, val_groups=groups, token_bytes=token_bytes), progress=False)
  got = grouped.evaluate()
  assert {"code/loss", "code/bits_per_byte", "prose/loss", "prose/bits_per_byte", "loss"} <= set(got)
  for name, tokens in groups.items():
    alone = Trainer(cfg, dataclasses.replace(data, val_tokens=tokens, token_bytes=token_bytes),
                    progress=False).evaluate()
    assert got[f"{name}/loss"] == alone["loss"] and got[f"{name}/bits_per_byte"] == alone["bits_per_byte"]
    assert got[f"{name}/tokens"] == alone["tokens"]
  n = {g: got[f"{g}/tokens"] for g in groups}
  want = sum(got[f"{g}/loss"] * n[g] for g in groups) / sum(n.values())
  assert got["loss"] == pytest.approx(want, rel=1e-12)
  assert len(got["batch_losses"]) == len(got["batch_tokens"]) and sum(got["batch_tokens"]) == sum(n.values())
