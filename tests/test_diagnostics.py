"""Oscillation diagnostics: latent values and edge distances against the NumPy
reference, histogram counts, change rates, oscillation fraction from a
trajectory against the OsciReset state."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from tests.test_osci_reset import ref_latent, ref_quantize
from tetrajet_jax.numerics import quantize_nvfp4, round_e2m1_nearest, unpack_e2m1
from tetrajet_jax.optim import (NVFP4WeightQuantizer, e2m1_edge_distance, latent_weight_histogram, osci_reset,
                                oscillation_fraction, weight_change_rates)
from tetrajet_jax.optim import toy_oscillation as toy

GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])


@pytest.mark.parametrize("shape", [(256, 64), (200, 48)])  # 200: padded along the quantized axis
def test_latent_matches_reference_and_reproduces_codes(rng, shape):
  w = (rng.standard_t(3, size=shape) * 0.02).astype(np.float32)
  v = np.asarray(jax.jit(NVFP4WeightQuantizer().latent)(w))
  np.testing.assert_array_equal(v, ref_latent(w))
  codes = unpack_e2m1(quantize_nvfp4(w, axis=0).codes)[:, :shape[0]].T  # canonical [out, Kp] -> [in, out]
  np.testing.assert_array_equal(np.asarray(round_e2m1_nearest(v)), np.asarray(codes))
  np.testing.assert_array_equal(np.asarray(NVFP4WeightQuantizer()(w)), ref_quantize(w))


def test_edge_distance_reference(rng):
  v = np.concatenate([rng.uniform(-7, 7, 20000), [0.25, -0.75, 1.25, 2.5, 3.5, 5.0, 0, 2, 6, -4]]).astype(np.float32)
  a = np.abs(v.astype(np.float64))
  mids = (GRID[:-1] + GRID[1:]) / 2
  gaps = GRID[1:] - GRID[:-1]
  interval = np.clip(np.searchsorted(GRID, a, side="right") - 1, 0, 6)
  expected = np.abs(a - mids[interval]) / gaps[interval]
  np.testing.assert_allclose(np.asarray(e2m1_edge_distance(v)), expected, rtol=0, atol=1e-6)
  assert float(e2m1_edge_distance(np.float32(5.0))) == 0.0 and float(e2m1_edge_distance(np.float32(3.0))) == 0.5


def test_histogram_counts_and_threshold_mass():
  prob = toy.make_problem(jax.random.key(3), (256, 128), 0.005, 1.0)
  edges, counts = latent_weight_histogram(prob.w0)
  v = ref_latent(np.asarray(prob.w0)).reshape(-1).astype(np.float64)
  np.testing.assert_array_equal(counts, np.histogram(v, edges)[0])
  assert counts.sum() == v.size
  # Every non-anchor element sits within 0.005 gap (< half a bin) of a threshold: all mass in threshold bins, anchors at 6.
  centres = (edges[:-1] + edges[1:]) / 2
  thresholds = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
  at_threshold = np.isin(np.round(np.abs(centres), 6), thresholds)
  assert counts[at_threshold].sum() == int(np.asarray(prob.mask).sum())
  tree_edges, tree_counts = latent_weight_histogram({"a": {"kernel": prob.w0}, "b": {"kernel": prob.w0},
                                                     "embed": {"embedding": prob.w0}})
  np.testing.assert_array_equal(tree_counts, 2 * counts)


def test_weight_change_rates_reference(rng):
  w0 = (rng.normal(size=(128, 32)) * 0.05).astype(np.float32)
  w1 = (w0 + rng.normal(size=w0.shape) * 1e-3).astype(np.float32)
  r = weight_change_rates(w0, w1)
  dq = ref_quantize(w1).astype(np.float64) - ref_quantize(w0)
  np.testing.assert_allclose(r["rate/dw"], np.abs(w1.astype(np.float64) - w0).mean(), rtol=1e-12)
  np.testing.assert_allclose(r["rate/dq"], np.abs(dq).mean(), rtol=1e-12)
  assert r["rate/flip_frac"] == np.count_nonzero(dq) / dq.size > 0
  big = np.zeros((256, 32), np.float32)
  tr = weight_change_rates({"x": {"kernel": w0}, "y": {"kernel": big}}, {"x": {"kernel": w1}, "y": {"kernel": big}})
  assert tr["rate/dw/x/kernel"] == r["rate/dw"] and tr["rate/dw/y/kernel"] == 0.0
  np.testing.assert_allclose(tr["rate/dw"], r["rate/dw"] * w0.size / (w0.size + big.size), rtol=1e-12)


def test_oscillation_fraction_trajectory_matches_state():
  prob = toy.make_problem(jax.random.key(4), (256, 128), 0.02, 0.2)
  tx = optax.chain(optax.adam(1e-4), osci_reset(start_step=30, period=40, window=10, threshold=8.0))
  params = {"l": {"kernel": prob.w0}}
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    g = jax.grad(lambda p: toy.toy_loss(p["l"]["kernel"], prob))(params)
    u, state = tx.update(g, state, params)
    return optax.apply_updates(params, u), state

  trajectory = []
  for n in range(41):
    if n == 30:
      trajectory.append(params)
    params, state = step(params, state)
    if 30 <= n < 40:  # the window's snapshots w_30 .. w_40 (updates 30-39; the reset, update 40, lands in w_41)
      trajectory.append(params)
  from_state = oscillation_fraction(state)
  from_traj = oscillation_fraction(trajectory, threshold=8.0)
  assert from_state["osci/risk_frac"] > 0.1
  # The state's sums cover the same ten updates as the trajectory.
  np.testing.assert_allclose(from_traj["osci/risk_frac/l/kernel"], from_state["osci/risk_frac/l/kernel"], atol=0.01)
  with pytest.raises(ValueError, match="threshold"):
    oscillation_fraction(state, threshold=4.0)
