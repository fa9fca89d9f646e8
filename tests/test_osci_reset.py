"""OsciReset: toy oscillation suppression, a NumPy step-by-step reference
(bitwise), the schedule, exact landing on Q(w), filters, outlier rows, the
memory-lean variant, jit / donation / inject_hyperparams / MultiSteps, orbax
round trip, metrics, bad input."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from tests import numpy_reference as ref
from tetrajet_jax.linear import ChannelSplit
from tetrajet_jax.optim import (WINDOW_PHASES, NVFP4WeightQuantizer, OsciResetState, osci_reset, osci_reset_metrics,
                                window_phase_of)
from tetrajet_jax.optim import toy_oscillation as toy

F32 = np.float32


def ref_quantize(w, rows=None) -> np.ndarray:
  """Q(w) of an [in, out] kernel along axis 0, from the NumPy reference: (q * s_in) * s_out in float32.

  With `rows` (an OutControl layer's FP4 rows in gather order): the rows
  w[rows] quantized as one kernel in that order, put back; other rows 0.
  """
  w = np.asarray(w, F32)
  if rows is not None:
    out = np.zeros_like(w)
    out[np.asarray(rows)] = ref_quantize(w[np.asarray(rows)])
    return out
  n_in = w.shape[0]
  x = w.T
  pad = (-n_in) % 128
  x = np.pad(x, ((0, 0), (0, pad)))
  codes, s_in, s_out = ref.nvfp4_block(x)
  q = ref.decode_codes(codes).astype(F32)
  v = (q * np.repeat(s_in, 16, -1)).astype(F32) * np.repeat(np.repeat(s_out, 8, -1), 16, -1)
  return v.astype(F32)[:, :n_in].T


def ref_latent(w, rows=None) -> np.ndarray:
  """w r along axis 0 (the element rule: subnormals flushed, times the block's correctly rounded
  reciprocal); with `rows`, of the gathered rows in that order (other rows: w itself)."""
  w = np.asarray(w, F32)
  if rows is not None:
    out = w.copy()
    out[np.asarray(rows)] = ref_latent(w[np.asarray(rows)])
    return out
  x = np.pad(w.T, ((0, 0), (0, (-w.shape[0]) % 128)))
  _, s_in, s_out = ref.nvfp4_block(x)
  s = np.repeat((s_in * np.repeat(s_out, 8, -1)).astype(F32), 16, -1)
  return ref.scaled(x, s)[:, :w.shape[0]].T


# ---------------------------------------------------------------- toy problem

@pytest.fixture(scope="module")
def toy_runs():
  cfg = toy.ToyConfig(steps=260)
  dense = toy.make_problem(jax.random.key(1), cfg.shape, cfg.start_offset, 1.0)
  sparse = toy.make_problem(jax.random.key(2), cfg.shape, cfg.start_offset, 0.05)
  return cfg, {
      "dense/base": toy.run(dense, cfg, track_fraction=None),
      "dense/full": toy.run(dense, cfg, track_fraction=1.0),
      "sparse/base": toy.run(sparse, cfg, track_fraction=None),
      "sparse/lean": toy.run(sparse, cfg, track_fraction=0.1),
  }


@pytest.mark.parametrize("arm", ["dense/full", "sparse/lean"])
def test_toy_oscillation_suppressed(toy_runs, arm):
  cfg, runs = toy_runs
  base, osc = runs[arm.split("/")[0] + "/base"], runs[arm]
  after = slice(cfg.start_step + cfg.window, cfg.steps)
  before = slice(cfg.start_step - 25, cfg.start_step)
  # Without OsciReset the flipping goes on at the same rate.
  assert base.flips[after].mean() >= 0.9 * base.flips[before].mean() > 100
  # Same trajectory up to the first reset (the window only observes). Not bitwise: the two scans are
  # different XLA programs, and XLA may contract Adam's arithmetic differently in each.
  first_reset = cfg.start_step + cfg.window - 1
  np.testing.assert_allclose(osc.flips[:first_reset], base.flips[:first_reset], rtol=0.02, atol=3)
  np.testing.assert_allclose(osc.flips[:first_reset].sum(), base.flips[:first_reset].sum(), rtol=1e-3)
  assert osc.flips[after].sum() * 10 <= base.flips[after].sum()
  assert osc.loss[-1] <= base.loss[-1] * (1 + 1e-6)
  assert osc.loss[after].mean() <= base.loss[after].mean() * (1 + 1e-6)


def test_toy_lean_tracks_stated_fraction(toy_runs):
  _, runs = toy_runs
  st = runs["sparse/lean"].opt_state[1]
  idx = np.asarray(st.index["layer"]["kernel"])
  assert idx.shape == (math.ceil(0.1 * 256 * 128),)
  assert len(np.unique(idx)) == idx.size and idx.min() >= 0 and idx.max() < 256 * 128
  assert st.d_q["layer"]["kernel"].shape == idx.shape


# ------------------------------------------------- step-by-step NumPy reference

def _sign_descent(p, target, lr=F32(2e-4), rows=None):
  """An upstream 'optimizer' update that drives p across the threshold at `target` (bitwise reproducible)."""
  return (-lr * np.sign(ref_quantize(p, rows) - target)).astype(F32)


class RefOsci:
  """Spec 3 written directly: float32 sequential accumulation over the window's T updates, full
  tracking, outlier rows out, Q(w) of the FP4 rows gathered in their order (`fp4_rows`, None = all
  rows), the reset on the update after the window."""

  def __init__(self, shape, *, start, period, window, tau, fp4_rows=None):
    self.d_q = np.zeros(shape, F32)
    self.d_w = np.zeros(shape, F32)
    self.n = 0
    self.cfg = (start, period, window, tau)
    self.rows = fp4_rows
    self.active = np.ones(shape, bool)
    if fp4_rows is not None:
      self.active[:] = False
      self.active[np.asarray(fp4_rows)] = True

  def update(self, p, u):
    start, period, window, tau = self.cfg
    n, self.n = self.n, self.n + 1
    if n < start or (n - start) % period > window:
      return u, None
    if (n - start) % period == 0:
      self.d_q[:] = 0
      self.d_w[:] = 0
    w = (p + u).astype(F32)
    q_prev, q_new = ref_quantize(p, self.rows), ref_quantize(w, self.rows)
    if (n - start) % period < window:
      self.d_q += np.where(self.active, np.abs(q_new - q_prev), F32(0))
      self.d_w += np.where(self.active, np.abs(w - p), F32(0))
      return u, None
    with np.errstate(divide="ignore", invalid="ignore"):
      risk = np.where(self.d_w > 0, self.d_q / self.d_w, 0)
    reset = self.active & (risk >= tau)
    return np.where(reset, q_new - p, u).astype(F32), (reset, q_new)


@pytest.mark.parametrize("outlier_rows,permute", [((), False), ((0, 17, 200), False), ((0, 17, 200), True)])
def test_matches_numpy_reference_bitwise(rng, outlier_rows, permute):
  """OsciReset step by step against RefOsci; with outlier rows, Q(w) quantizes the FP4 rows gathered
  in the FP4 order (ascending, or a permutation passed as a ChannelSplit), whose blocks differ from
  the whole kernel's."""
  shape = (256, 32)
  rows = None
  if outlier_rows:
    rest = np.setdiff1d(np.arange(shape[0]), outlier_rows).astype(np.int32)
    rows = rng.permutation(rest).astype(np.int32) if permute else rest
  mid = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], F32)
  first_of_block = (np.arange(shape[0]) % 16 == 0)[:, None] & np.ones((1, shape[1]), bool)
  s = np.asarray(NVFP4WeightQuantizer().scale(jnp.asarray(np.where(first_of_block, F32(1), F32(0)))))[0, 0]
  # Anchors (value 1) open every 16-block of the quantized row order, so every block has scale s.
  anchor = np.zeros((shape[0], 1), bool)
  anchor[(np.arange(shape[0]) if rows is None else rows)[::16]] = True
  anchor = anchor & np.ones((1, shape[1]), bool)
  osc = rng.random(shape) < 0.3
  level = np.where(osc, mid[rng.integers(0, 7, shape)], 0.5 + 0.5 * rng.integers(0, 4, shape))
  target = np.where(anchor, F32(1), (np.where(rng.random(shape) < 0.5, -1, 1) * level * s).astype(F32))
  p = np.where(anchor, F32(1), target + (rng.uniform(-1, 1, shape) * 1e-3 * s).astype(F32)).astype(F32)
  target = np.where(anchor, ref_quantize(p, rows), target).astype(F32)

  kw = dict(start=4, period=7, window=3, tau=8.0)
  tx = osci_reset(start_step=4, period=7, window=3, threshold=8.0)
  params = {"blk": {"kernel": jnp.asarray(p)}, "norm": {"scale": jnp.ones((32,))}}
  state = tx.init(params)
  leaf = jnp.asarray(outlier_rows, jnp.int32)
  if permute:
    leaf = ChannelSplit(leaf, jnp.asarray(rows))
  outl = {"blk": {"kernel": leaf}, "norm": {"scale": None}}
  step = jax.jit(lambda u, s, p: tx.update(u, s, p, outlier_channels=outl))
  reference = RefOsci(shape, **kw, fp4_rows=rows)
  n_resets = 0
  for n in range(22):
    u = _sign_descent(p, target, rows=rows)
    u_norm = jnp.full((32,), 0.125, jnp.float32)
    out, state = step({"blk": {"kernel": jnp.asarray(u)}, "norm": {"scale": u_norm}}, state,
                      {"blk": {"kernel": jnp.asarray(p)}, "norm": {"scale": jnp.ones((32,))}})
    u_ref, reset_info = reference.update(p, u)
    got = np.asarray(out["blk"]["kernel"])
    np.testing.assert_array_equal(got.view(np.uint32), u_ref.view(np.uint32), err_msg=f"update {n}")
    np.testing.assert_array_equal(np.asarray(out["norm"]["scale"]), np.asarray(u_norm))  # filtered out
    if n < 4:
      chex.assert_trees_all_equal(state.d_q, jax.tree.map(jnp.zeros_like, state.d_q))
    in_window = n >= 4 and (n - 4) % 7 < 3
    if in_window:
      np.testing.assert_array_equal(np.asarray(state.d_q["blk"]["kernel"]), reference.d_q)
      np.testing.assert_array_equal(np.asarray(state.d_w["blk"]["kernel"]), reference.d_w)
    new_p = (p + got).astype(F32)
    if reset_info is not None:
      reset, q_new = reset_info
      n_resets += 1
      if n_resets == 1:  # every oscillating element outside outlier rows
        assert reset.sum() > 0.9 * (osc & ~anchor).sum() * (1 - len(outlier_rows) / 256)
      else:  # reset elements sit on a grid value now, far (in steps of 2e-4) from their threshold
        assert reset.sum() == 0
      # Reset elements land on Q(w) bitwise; the others got exactly the upstream update.
      np.testing.assert_array_equal(new_p[reset].view(np.uint32), q_new[reset].view(np.uint32))
      np.testing.assert_array_equal(got[~reset], u[~reset])
      assert not reset[list(outlier_rows)].any()
      assert int(state.num_reset["blk"]["kernel"]) == reset.sum()
      assert int(state.num_active["blk"]["kernel"]) == (256 - len(outlier_rows)) * 32
    p = new_p
  assert n_resets == 3  # windows of updates 4-6, 11-13, 18-20; resets at updates 7, 14, 21


@pytest.mark.parametrize("track_fraction", [1.0, 0.25])
def test_same_shape_leaves_batched_match_each_alone(rng, track_fraction):
  """Tracked leaves of one shape (and FP4 row count) run as one vmapped group; every leaf must
  evolve bitwise as it does when it is the only tracked leaf: updates, sums, picks, counts."""
  shapes = {"a": (256, 32), "b": (256, 32), "c": (256, 32), "e": (256, 32), "d": (128, 48)}

  def split(outlier):  # two MXFP8 rows, the FP4 rows in a random gather order
    rest = np.setdiff1d(np.arange(256), outlier).astype(np.int32)
    return ChannelSplit(jnp.asarray(outlier, jnp.int32), jnp.asarray(rng.permutation(rest), jnp.int32))

  # a, b: one group with (different) row gathers; c, e: one group without; d: alone.
  outliers = {"a": split([3, 40]), "b": split([0, 255]), "c": None, "e": None, "d": None}
  params = {k: {"kernel": jnp.asarray(rng.standard_normal(s), jnp.float32)} for k, s in shapes.items()}
  targets = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in shapes.items()}
  lr = jnp.float32(1e-2)  # each element walks to its target, then hops across it every update

  def make(names):
    tx = osci_reset(start_step=2, period=5, window=2, track_fraction=track_fraction)
    outl = {k: {"kernel": outliers[k]} for k in names}
    return tx, jax.jit(lambda u, s, p: tx.update(u, s, p, outlier_channels=outl))

  names = list(shapes)
  tx_all, step_all = make(names)
  alone = {k: make([k]) for k in names}
  state_all = tx_all.init(params)
  states = {k: alone[k][0].init({k: params[k]}) for k in names}
  resets = 0
  for n in range(12):  # windows: updates 2-3 and 7-8; resets at updates 4 and 9
    u = {k: {"kernel": -lr * jnp.sign(params[k]["kernel"] - targets[k])} for k in names}
    out_all, state_all = step_all(u, state_all, params)
    for k in names:
      out_k, states[k] = alone[k][1]({k: u[k]}, states[k], {k: params[k]})
      chex.assert_trees_all_equal(out_all[k], out_k[k], custom_message=f"update {n}, leaf {k}")
      for field in ("d_q", "d_w", "index", "num_active", "num_risky", "num_risky_last", "num_reset"):
        got, want = getattr(state_all, field), getattr(states[k], field)
        if want:
          chex.assert_trees_all_equal(got[k], want[k], custom_message=f"update {n}, {field} of {k}")
      resets += int(states[k].num_reset[k]["kernel"])
    params = optax.apply_updates(params, out_all)
  assert resets > 0  # the comparison covered resets, not only pass-through updates


def test_exact_landing_adversarial(rng):
  """Reset elements land on q bitwise even when q - p is inexact in float32."""
  from tetrajet_jax.optim.osci_reset import _exact_step
  p = (rng.normal(size=200000) * 10.0 ** rng.uniform(-6, 2, 200000)).astype(F32)
  q = (p * rng.uniform(0.3, 3.0, p.shape) * np.where(rng.random(p.shape) < 0.1, -1, 1)).astype(F32)
  d, ok = jax.jit(_exact_step)(jnp.asarray(p), jnp.asarray(q))
  d, ok = np.asarray(d), np.asarray(ok)
  np.testing.assert_array_equal(((p + d).astype(F32) == q)[ok], True)
  # Sterbenz range: always reachable.
  sterbenz = (q / 2 <= p) & (p <= 2 * q) | (q / 2 >= p) & (p >= 2 * q)
  assert ok[sterbenz].all()
  assert ok.mean() > 0.9


# ------------------------------------------------- schedule, filters, lean

def _toy_params(key, shape=(256, 128)):
  prob = toy.make_problem(key, shape, 0.002, 0.3)
  return prob, {"blocks": {"0": {"mlp": {"kernel": prob.w0}, "norm": {"scale": jnp.ones((shape[1],))}}},
                "embed": {"embedding": jnp.ones((64, 16))}, "lm_head": {"kernel": jnp.ones((16, 64))}}


def _grads(prob, params):
  g = jax.grad(lambda w: toy.toy_loss(w, prob))(params["blocks"]["0"]["mlp"]["kernel"])
  other = jax.tree.map(lambda x: jnp.full_like(x, 0.5), params)
  other["blocks"]["0"]["mlp"]["kernel"] = g
  return other


def _train(tx, prob, params, steps, *, donate=False, **extra):
  state = tx.init(params)

  def step(params, state):
    updates, state = tx.update(_grads(prob, params), state, params, **extra)
    return optax.apply_updates(params, updates), state, updates

  step = jax.jit(step, donate_argnums=(0, 1) if donate else ())
  history = []
  for _ in range(steps):
    params, state, updates = step(params, state)
    history.append(jax.tree.map(np.asarray, updates))
  return params, state, history


def test_default_filter_and_untouched_leaves(key):
  prob, params = _toy_params(key)
  adam, osc = optax.adam(1e-4), osci_reset(start_step=6, period=10, window=4)
  st = osc.init(params)
  assert jax.tree.structure(st.d_q) == jax.tree.structure({"blocks": {"0": {"mlp": {"kernel": 0}}}})
  # Upstream and OsciReset in separate programs, so the upstream update is one fixed array.
  upstream, osc_update = jax.jit(adam.update), jax.jit(osc.update)
  adam_state = adam.init(params)
  for n in range(21):
    a_up, adam_state = upstream(_grads(prob, params), adam_state, params)
    a_up = jax.tree.map(np.asarray, a_up)
    out, st = osc_update(a_up, st, params)
    a, b = jax.tree.map(np.asarray, out), a_up
    params = optax.apply_updates(params, out)
    for path in (("embed", "embedding"), ("lm_head", "kernel")):
      np.testing.assert_array_equal(a[path[0]][path[1]], b[path[0]][path[1]])
    np.testing.assert_array_equal(a["blocks"]["0"]["norm"]["scale"], b["blocks"]["0"]["norm"]["scale"])
    same = np.array_equal(a["blocks"]["0"]["mlp"]["kernel"], b["blocks"]["0"]["mlp"]["kernel"])
    assert same == (n not in (10, 20)), n  # resets: the update after each window (6 + 4, 16 + 4)


def test_lean_selects_closest_to_edge_and_skips_outliers(key):
  prob, params = _toy_params(key)
  rows = jnp.asarray([3, 64, 65, 255], jnp.int32)
  tx = osci_reset(start_step=0, period=5, window=2, track_fraction=0.05)
  state = tx.init(params)
  w = params["blocks"]["0"]["mlp"]["kernel"]
  _, state = jax.jit(lambda u, s, p: tx.update(u, s, p, outlier_channels={"blocks": {"0": {"mlp": {"kernel": rows}}}}))(
      jax.tree.map(jnp.zeros_like, params), state, params)
  idx = np.asarray(state.index["blocks"]["0"]["mlp"]["kernel"])
  assert idx.size == math.ceil(0.05 * w.size)
  v = ref_latent(w, np.setdiff1d(np.arange(256), np.asarray(rows))).astype(np.float64)  # the FP4 rows' blocks
  a = np.abs(v)
  grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
  lo_i = np.clip(np.searchsorted(grid, a, side="right") - 1, 0, 6)
  dist = np.abs(a - (grid[lo_i] + grid[lo_i + 1]) / 2) / (grid[lo_i + 1] - grid[lo_i])
  dist[np.asarray(rows)] = np.inf
  flat = dist.reshape(-1)
  chosen = np.zeros(flat.shape, bool)
  chosen[idx] = True
  assert np.isfinite(flat[chosen]).all()  # no outlier row tracked
  assert flat[chosen].max() <= flat[~chosen].min() + 1e-6
  assert int(state.num_active["blocks"]["0"]["mlp"]["kernel"]) == (256 - 4) * 128


# ------------------------------------------- jit, inject_hyperparams, MultiSteps, orbax

def _chain(lr_inject: bool, track_fraction=1.0, upstream="adamw"):
  if upstream == "adamw":
    opt = (optax.inject_hyperparams(optax.adamw)(learning_rate=1e-4, weight_decay=0.0) if lr_inject
           else optax.adamw(1e-4, weight_decay=0.0))
  else:  # a power-of-two step: -lr * g is exact, so the update is the same bits in any XLA program
    opt = optax.inject_hyperparams(optax.sgd)(learning_rate=1.0) if lr_inject else optax.sgd(1.0)
  return optax.chain(opt, osci_reset(start_step=3, period=8, window=3, track_fraction=track_fraction))


@pytest.mark.parametrize("upstream, track_fraction", [("sgd", 1.0), ("adamw", 0.1)])
def test_multisteps_inject_donation_match_plain(key, track_fraction, upstream):
  prob, params = _toy_params(key)
  grads = jax.jit(lambda p: _grads(prob, p))  # one program for both arms: identical gradient bits

  def plain_run(params):
    tx = _chain(False, track_fraction, upstream)
    state = tx.init(params)
    step = jax.jit(lambda p, s, g: (lambda u_s: (optax.apply_updates(p, u_s[0]), u_s[1]))(tx.update(g, s, p)))
    for _ in range(8):  # the first window's reset (update 5) is the last one
      params, state = step(params, state, grads(params))
    return params, state

  p_plain, s_plain = plain_run(params)
  multi = optax.MultiSteps(_chain(True, track_fraction, upstream), every_k_schedule=2)
  state = multi.init(params)

  def mini(params, state, g):
    updates, state = multi.update(g, state, params)
    return optax.apply_updates(params, updates), state

  mini = jax.jit(mini, donate_argnums=(0, 1))
  p = jax.tree.map(jnp.copy, params)
  for _ in range(8):  # each gradient twice: the accumulated mean is that gradient exactly
    g = grads(p)
    p, state = mini(p, state, g)
    p, state = mini(p, state, g)
  inner = state.inner_opt_state[1]
  assert int(s_plain[1].num_reset["blocks"]["0"]["mlp"]["kernel"]) > 0
  assert int(inner.count) == 8
  if upstream == "sgd":
    chex.assert_trees_all_equal(p, p_plain)
    chex.assert_trees_all_equal(inner, s_plain[1])
  else:  # Adam's arithmetic is contracted into FMAs differently per XLA program: equal up to an ulp
    chex.assert_trees_all_close(p, p_plain, rtol=1e-6, atol=1e-8)
    chex.assert_trees_all_equal(inner.num_reset, s_plain[1].num_reset)


@pytest.mark.parametrize("track_fraction", [1.0, 0.1])
def test_orbax_round_trip_continues_identically(key, tmp_path, track_fraction):
  prob, params = _toy_params(key)
  tx = _chain(True, track_fraction)
  p, s, _ = _train(tx, prob, params, 5)
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(tmp_path / "ckpt", {"params": p, "opt": s})
  ckpt.wait_until_finished()
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, {"params": p, "opt": s})
  restored = ckpt.restore(tmp_path / "ckpt", abstract)
  assert isinstance(restored["opt"][1], OsciResetState)
  chex.assert_trees_all_equal(restored["opt"], s)

  step = jax.jit(lambda params, state: (lambda u_s: (optax.apply_updates(params, u_s[0]), u_s[1]))(
      tx.update(_grads(prob, params), state, params)))

  def cont(params, state):
    for _ in range(10):
      params, state = step(params, state)
    return params, state

  chex.assert_trees_all_equal(cont(p, s), cont(restored["params"], restored["opt"]))


# ------------------------------------------------- metrics and bad input

def test_metrics_weighted_aggregate():
  def st(reset, risky, active):
    tree = lambda v: {"a": {"kernel": jnp.int32(v[0])}, "b": {"kernel": jnp.int32(v[1])}}
    return OsciResetState(count=jnp.int32(0), d_q={}, d_w={}, index={}, num_active=tree(active),
                          num_risky=tree((0, 0)), num_risky_last=tree(risky), num_reset=tree(reset))
  m = osci_reset_metrics((optax.EmptyState(), st((10, 0), (12, 3), (100, 300))))
  np.testing.assert_allclose(float(m["osci/reset_frac/a/kernel"]), 0.1)
  np.testing.assert_allclose(float(m["osci/reset_frac/b/kernel"]), 0.0)
  np.testing.assert_allclose(float(m["osci/reset_frac"]), 10 / 400)
  np.testing.assert_allclose(float(m["osci/risk_frac"]), 15 / 400)
  assert float(m["osci/window_risk_frac"]) == 0.0


@pytest.mark.parametrize("kwargs, match", [
    (dict(start_step=0, period=100, threshold=0.0), "threshold"),
    (dict(start_step=0, period=100, threshold=-1.0), "threshold"),
    (dict(start_step=0, period=10, window=10), "shorter than period"),
    (dict(start_step=0, period=10, window=20), "shorter than period"),
    (dict(start_step=-1, period=10, window=5), "start_step"),
    (dict(start_step=0, period=10, window=0), "window"),
    (dict(start_step=0, period=10, window=5, track_fraction=0.0), "track_fraction"),
    (dict(start_step=0, period=10, window=5, track_fraction=1.5), "track_fraction"),
    (dict(start_step=0, period=10, window=5, track_fraction=0.1, quantizer=lambda w: w), "edge_distance"),
])
def test_bad_config_raises(kwargs, match):
  with pytest.raises(ValueError, match=match):
    osci_reset(**kwargs)


def test_bad_params_raise():
  params = {"embed": {"embedding": jnp.ones((8, 4))}, "norm": {"scale": jnp.ones((4,))}}
  with pytest.raises(ValueError, match="matches no parameter"):
    osci_reset(start_step=0, period=4, window=2).init(params)
  tx = osci_reset(start_step=0, period=4, window=2, param_filter=lambda path, w: path[0] == "embed")
  state = tx.init(params)
  with pytest.raises(ValueError, match="needs params"):
    tx.update(params, state)
  with pytest.raises(ValueError, match="not parameters"):
    tx.update(params, state, params, outlier_channels={"nope": jnp.zeros((1,), jnp.int32)})
  with pytest.raises(ValueError, match="float32"):
    tx.init({"embed": {"embedding": jnp.ones((8, 4), jnp.bfloat16)}})


def test_window_phase_of_follows_the_schedule():
  """S = 4, P = 7, T = 3: windows on updates 4-6 and 11-13, their resets on updates 7 and 14."""
  expected = "oooo" "fii" "i" "ooo" "fii" "i" "ooo" "fii"
  names = {"o": "outside", "f": "first", "i": "inside"}
  got = [window_phase_of(n, start_step=4, period=7, window=3) for n in range(len(expected))]
  assert got == [names[c] for c in expected]


@pytest.mark.parametrize("track_fraction", [1.0, 0.25])
def test_host_window_phase_runs_the_device_branch_bitwise(key, track_fraction):
  """window_phase from the host (`window_phase_of` of the update count) runs what the device's own
  conditional picks: over two periods with their resets, every update and the final state are bit
  for bit those of window_phase=None, and the compiled programs hold no conditional."""
  prob, params = _toy_params(key)
  windows = dict(start_step=3, period=7, window=3)
  tx = optax.chain(optax.sgd(2e-3), osci_reset(**windows, threshold=2.0, track_fraction=track_fraction))

  def update(p, s, window_phase):
    updates, s = tx.update(_grads(prob, p), s, p, window_phase=window_phase)
    return optax.apply_updates(p, updates), s, updates

  step = jax.jit(update, static_argnums=2)
  # Conditionals left in the compiled program (the platform-dependent ones of the scale arithmetic
  # have a constant index and are folded away).
  conditionals = lambda phase: step.lower(params, tx.init(params), phase).compile().as_text().count(" conditional(")
  assert [conditionals(phase) for phase in WINDOW_PHASES] == [0, 0, 0]
  assert conditionals(None) > 0  # the device decides
  runs = {}
  for host in (False, True):
    p, state, history = params, tx.init(params), []
    for n in range(16):  # windows on updates 3-5 and 10-12, resets on 6 and 13
      p, state, updates = step(p, state, window_phase_of(n, **windows) if host else None)
      history.append(jax.tree.map(np.asarray, updates))
    runs[host] = (p, state, history)
  assert int(runs[True][1][1].num_reset["blocks"]["0"]["mlp"]["kernel"]) > 0  # the resets are covered
  for a, b in zip(runs[False][2], runs[True][2]):
    chex.assert_trees_all_equal(a, b)
  chex.assert_trees_all_equal(runs[False][:2], runs[True][:2])


def test_bad_window_phase_raises(key):
  _, params = _toy_params(key)
  tx = osci_reset(start_step=0, period=4, window=2)
  with pytest.raises(ValueError, match="window_phase_of"):
    tx.update(params, tx.init(params), params, window_phase="middle")


def test_monitor_mode_measures_and_never_resets(key):
  """apply=False: the updates are the upstream optimizer's, bitwise, and the
  window statistics equal OsciReset's own up to its first reset (the same
  windows and the same D_Q / D_W sums; after a reset the trajectories part)."""
  prob, params = _toy_params(key)
  windows = dict(start_step=3, period=12, window=5, threshold=2.0)
  plain = _train(optax.chain(optax.sgd(2e-3)), prob, params, 9)
  monitor = _train(optax.chain(optax.sgd(2e-3), osci_reset(**windows, apply=False)), prob, params, 9)
  reset = _train(optax.chain(optax.sgd(2e-3), osci_reset(**windows)), prob, params, 9)
  for a, b in zip(plain[2], monitor[2]):
    chex.assert_trees_all_equal(a, b)
  chex.assert_trees_all_equal(plain[0], monitor[0])
  m_state, r_state = monitor[1][1], reset[1][1]
  # The first window is updates 3-7 and its reset update 8: both saw the same trajectory until then.
  assert int(m_state.num_risky_last["blocks"]["0"]["mlp"]["kernel"]) > 0
  chex.assert_trees_all_equal(m_state.num_risky_last, r_state.num_risky_last)
  assert int(m_state.num_reset["blocks"]["0"]["mlp"]["kernel"]) == 0
  assert int(r_state.num_reset["blocks"]["0"]["mlp"]["kernel"]) > 0
  assert float(osci_reset_metrics(monitor[1])["osci/risk_frac"]) > 0
