"""LR schedule in the paper's shape (warmup, cosine to the 0.1x floor at t_max, flat to the end), its
defaults, OsciReset placement (reference T and P, scaled S, refusal of runs too short for 3 resets),
and weight decay on norm weights."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tetrajet_jax.train import (OsciResetScheduleError, Schedule, TrainConfig, TrainData, Trainer,
                                default_lr_steps, scaled_osci_reset)
from tetrajet_jax.train.schedule import osci_resets_in_run


def test_cosine_reaches_the_floor_at_t_max_then_stays_flat():
  s = Schedule(total_steps=200, warmup_steps=10, t_max_steps=150, peak_lr=2.0, final_ratio=0.1)
  assert float(s.lr(0)) == pytest.approx(0.2)
  assert float(s.lr(9)) == pytest.approx(2.0)
  assert float(s.lr(80)) == pytest.approx(0.2 + 1.8 * 0.5 * (1 + math.cos(math.pi * 70 / 140)))
  assert float(s.lr(149)) > 0.2
  floor = np.asarray(jax.vmap(s.lr)(jnp.arange(150, 200)))
  np.testing.assert_allclose(floor, 0.2, rtol=1e-6)  # the last 25% sits at 0.1x peak
  assert s.decay_progress(150) == s.decay_progress(199) == 1.0


def test_default_schedule_has_the_paper_ratios():
  warmup, t_max = default_lr_steps(12505)  # 70M: warmup 1e9 tokens, t_max 50e9 of 52.45e9 tokens
  assert (warmup, t_max) == (238, 11921)
  warmup, t_max = default_lr_steps(2000)
  assert (warmup, t_max) == (38, 1907)  # 2% of t_max; t_max 95.3% of the run
  assert default_lr_steps(2000, 5, 1000) == (5, 1000)  # explicit values pass through
  cfg = TrainConfig(model="tiny", arm="bf16", batch_size=1, seq_len=64, total_steps=2000)
  assert (cfg.warmup_steps, cfg.t_max_steps) == (38, 1907)
  assert cfg.schedule.t_max == 1907
  with pytest.raises(ValueError, match="t_max_steps=5 must be after warmup_steps=10"):
    Schedule(total_steps=100, warmup_steps=10, t_max_steps=5, peak_lr=1.0)


def _schedule(total: int) -> Schedule:
  warmup, t_max = default_lr_steps(total)
  return Schedule(total_steps=total, warmup_steps=warmup, t_max_steps=t_max, peak_lr=1.0)


def test_too_short_for_three_resets_is_refused_with_the_minimum_length():
  with pytest.raises(OsciResetScheduleError) as info:
    scaled_osci_reset(_schedule(1000))
  msg = str(info.value)
  assert "a run of 1000 steps has room for 2 reset(s)" in msg
  assert "window T=50, period P=200" in msg
  assert "--osci-window / --osci-period" in msg
  need = int(re.search(r"Train for at least (\d+) steps", msg).group(1))
  # S at 64% of the run, then T + 2P + 1 = 451 more updates: about 451 / 0.36 steps.
  assert 1200 <= need <= 1300
  # The named minimum is exact: `need` steps fit 3 resets at the scaled start, one fewer does not.
  ok = scaled_osci_reset(_schedule(need))
  assert (ok.period, ok.window) == (200, 50)
  assert osci_resets_in_run(need, ok.start_step, 200, 50) == 3
  with pytest.raises(OsciResetScheduleError, match="room for 2 reset"):
    scaled_osci_reset(_schedule(need - 1))
  # Explicit window or period: the user's choice, accepted.
  w = scaled_osci_reset(_schedule(1000), period=40, window=10)
  assert (w.period, w.window) == (40, 10)
  # The trainer's config refuses the same way for an OsciReset arm, not for a measure-only one.
  with pytest.raises(OsciResetScheduleError, match=f"Train for at least {need} steps"):
    TrainConfig(model="tiny", arm="tetrajet_v2_oscireset", batch_size=2, seq_len=64, total_steps=1000)
  TrainConfig(model="tiny", arm="tetrajet_v2_oscireset", batch_size=2, seq_len=64, total_steps=1000, osci_period=100)
  TrainConfig(model="tiny", arm="tetrajet_v2", batch_size=2, seq_len=64, total_steps=1000)


def test_reset_is_the_update_after_each_window():
  assert osci_resets_in_run(8051, 8000, 200, 50) == 1  # reset on update 8050, the last of the run
  assert osci_resets_in_run(8050, 8000, 200, 50) == 0


def test_weight_decay_on_matrices_and_norm_weights_not_embeddings():
  rng = np.random.default_rng(0)
  data = TrainData(train_tokens=rng.integers(2, 256, 4000).astype(np.uint16),
                   val_tokens=rng.integers(2, 256, 400).astype(np.uint16), vocab_size=256)
  cfg = TrainConfig(model="tiny", arm="bf16", layers=1, batch_size=2, seq_len=64, total_steps=10, warmup_steps=0,
                    peak_lr=0.5, weight_decay=0.1)
  trainer = Trainer(cfg, data, progress=False)
  params = jax.tree.map(lambda p: jnp.full_like(p, 2.0), trainer.state["params"])
  tx = trainer.tx
  updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
  flat = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(u)
          for path, u in jax.tree_util.tree_flatten_with_path(updates)[0]}
  norms = [k for k in flat if "norm" in k]
  assert norms and all(flat[k].ndim == 1 for k in norms)
  for name, u in flat.items():
    decayed = not any("embed" in part for part in name.split("/"))
    want = -0.5 * 0.1 * 2.0 if decayed else 0.0  # zero gradient: the update is -lr * wd * w
    np.testing.assert_allclose(u, want, rtol=1e-6, err_msg=name)
  assert any("embed" in k for k in flat) and any("lm_head" in k for k in flat)
