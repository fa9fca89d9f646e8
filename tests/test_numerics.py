"""Numerics core against the independent NumPy/ml_dtypes reference.

Bitwise where the math is exact: E2M1 codes and E4M3 inner scales and FP32
outer scales of every quantizer; statistical where the claim is (stochastic
rounding). Every check runs eagerly and under jax.jit (where XLA could elide a
narrow cast round trip).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tetrajet_jax as tj
from tetrajet_jax import numerics as nm
from tests import numpy_reference as ref

MODES = ["eager", "jit"]


def run(fn, mode, *args, **kwargs):
  if mode == "jit":
    return jax.jit(lambda *a: fn(*a, **kwargs))(*args)
  return fn(*args, **kwargs)


def codes_of(t):
  return np.asarray(ref.unpack(np.asarray(t.codes)))


# ---------------------------------------------------------------- element / scale formats

@pytest.mark.parametrize("mode", MODES)
def test_round_to_e4m3_matches_ml_dtypes(rng, mode):
  mags = np.exp2(rng.uniform(-14, 10, 20000)).astype(np.float32)
  x = mags * rng.choice([-1, 1], mags.shape)
  # Exact ties between E4M3 neighbours, tiny/huge values, the saturation edge.
  e4 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
  e4 = np.sort(e4[np.isfinite(e4)])
  mids = ((e4[1:].astype(np.float64) + e4[:-1]) / 2).astype(np.float32)
  extra = np.array([0, -0.0, 2**-10, 2**-9, 3 * 2**-11, 447, 448, 460, 463.99, 464, 470, 1e6, np.inf, -np.inf],
                   np.float32)
  x = np.concatenate([x, e4, mids, -mids, extra]).astype(np.float32)
  got = np.asarray(run(nm.round_to_e4m3, mode, jnp.asarray(x)))
  np.testing.assert_array_equal(got, ref.e4m3(x))
  assert np.isnan(np.asarray(nm.round_to_e4m3(jnp.float32(np.nan))))


@pytest.mark.parametrize("mode", MODES)
def test_div_rn_is_the_ieee_quotient(rng, mode):
  """div_rn must equal IEEE division bit for bit (XLA's GPU division is not)."""
  n = 100000
  x = (rng.standard_normal(n) * np.exp2(rng.uniform(-60, 60, n))).astype(np.float32)
  y = (rng.standard_normal(n) * np.exp2(rng.uniform(-60, 60, n))).astype(np.float32)
  # Exact quotients, a / a, the GPU counterexample 4.6875 / 0.9375, a subnormal
  # dividend (div_rn flushes subnormal operands to zero on every backend).
  a = (rng.uniform(1, 2, 1000) * np.exp2(rng.integers(-20, 20, 1000))).astype(np.float32)
  x = np.concatenate([x, a, np.float32(4.6875) * np.ones(4, np.float32), [0.0, -0.0, 1e-40]]).astype(np.float32)
  y = np.concatenate([y, a, np.float32(0.9375) * np.ones(4, np.float32), [3.0, 7.0, 448.0]]).astype(np.float32)
  got = np.asarray(run(nm.div_rn, mode, jnp.asarray(x), jnp.asarray(y)))
  with np.errstate(over="ignore", under="ignore"):
    want = x / y
  normal = np.abs(want) >= np.finfo(np.float32).tiny
  np.testing.assert_array_equal(got[normal | (want == 0)], want[normal | (want == 0)])
  assert np.all(got[~normal & (want != 0)] == 0), "quotients below the normal range flush to zero"


@pytest.mark.parametrize("ulps", [-3, -2, -1, 1, 2, 3])
def test_div_rn_corrects_any_nearby_estimate(rng, ulps):
  """The rounding is decided by exact integer arithmetic: an estimate a few
  ulps off (GPU div.full, x * (1/c), Mosaic's division) still gives the IEEE
  quotient. Ties included: a * b / b and small-integer ratios."""
  n = 50000
  x = (rng.standard_normal(n) * np.exp2(rng.uniform(-60, 60, n))).astype(np.float32)
  y = (rng.standard_normal(n) * np.exp2(rng.uniform(-60, 60, n))).astype(np.float32)
  a = rng.integers(1, 2**12, 5000).astype(np.float32)
  b = rng.integers(1, 2**12, 5000).astype(np.float32)
  x = np.concatenate([x, a * b, a, 3 * a]).astype(np.float32)
  y = np.concatenate([y, b, 2 * a, 2 * a]).astype(np.float32)  # exact, halves, 1.5 (ties)
  with np.errstate(over="ignore", under="ignore"):
    want = x / y
  want = np.where(np.abs(want) < np.finfo(np.float32).tiny, np.float32(0), want).astype(np.float32)
  est = want.copy()
  for _ in range(abs(ulps)):
    est = np.nextafter(est, np.float32(np.inf) if ulps > 0 else np.float32(-np.inf)).astype(np.float32)
  got = np.asarray(jax.jit(nm.scales.div_rn_from_estimate)(x, y, est))
  np.testing.assert_array_equal(np.abs(got), np.abs(want))


def test_div_rn_special_operands():
  sp = np.array([0.0, -0.0, 1e-40, np.inf, -np.inf, np.nan, 1.0, -3e38], np.float32)
  x, y = (a.ravel() for a in np.meshgrid(sp, sp))
  flush = lambda v: np.where(np.abs(v) < np.finfo(np.float32).tiny, np.float32(0) * v, v)
  with np.errstate(all="ignore"):
    want = flush((flush(x) / flush(y)).astype(np.float32))
  got = np.asarray(jax.jit(nm.div_rn)(x, y))
  np.testing.assert_array_equal(got, want)  # NaN positions equal too
  np.testing.assert_array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)]))


@pytest.mark.parametrize("mode", MODES)
def test_e2m1_nearest_matches_ml_dtypes(rng, mode):
  grid = ref.E2M1_VALUES.astype(np.float32)
  mids = (grid[1:] + grid[:-1]) / 2
  v = np.concatenate([rng.uniform(-8, 8, 20000), grid, -grid, mids, -mids, np.nextafter(mids, 0),
                      np.nextafter(mids, 10), [6.5, -7, 1e9]]).astype(np.float32)
  got = np.asarray(run(nm.round_e2m1_nearest, mode, jnp.asarray(v)))
  np.testing.assert_array_equal(got, ref.e2m1_codes(v))
  np.testing.assert_array_equal(np.asarray(nm.decode_e2m1(jnp.asarray(got))), ref.decode_codes(got))


def _quotient_cases(rng, n, points, far_fraction=0.2):
  """|x|, s with x / s at and a few ulps around `points` (scaled), over the
  normal exponent range; a `far_fraction` of the quotients uniform in [0, 9)."""
  s = (rng.uniform(1, 2, n) * np.exp2(rng.integers(-125, 120, n))).astype(np.float32)
  s[: n // 4] = np.exp2(rng.integers(-125, 120, n // 4))  # quotients exactly on the points
  s[n // 4: n // 2] = rng.integers(1, 8, n // 4) * np.exp2(rng.integers(-120, 110, n // 4))
  x = (points[rng.integers(0, len(points), n)] * s.astype(np.float64)).astype(np.float32)
  x = (x.view(np.int32) + rng.integers(-3, 4, n).astype(np.int32)).view(np.float32)
  far = rng.random(n) < far_fraction
  x[far] = (s[far] * rng.uniform(0, 9, far.sum())).astype(np.float32)
  return x, s


@pytest.mark.parametrize("mode", MODES)
def test_nearest_index_of_quotient_is_rne_of_the_ieee_quotient(rng, mode):
  """The division-free rounding decision (exact compares against the scaled
  midpoints) equals RNE of numpy's IEEE float32 quotient, at every midpoint
  +- a few ulps, at exact grid quotients (power-of-two and short scales), over
  the whole normal exponent range, and for zero/subnormal/inf/NaN operands."""
  n = 200000
  t = np.concatenate([ref.E2M1_VALUES[1:], (ref.E2M1_VALUES[1:] + ref.E2M1_VALUES[:-1]) / 2])
  x, s = _quotient_cases(rng, n, t, far_fraction=0.1)  # midpoints and grid values
  x[:100], x[100:200], x[200:300], x[300:400] = 0.0, 1e-40, np.inf, np.nan  # 1e-40: flushed like div_rn
  s[400:500] = np.nan
  x = np.where(rng.random(n) < 0.5, -x, x).astype(np.float32)
  with np.errstate(all="ignore"):
    want = np.where(np.abs(x) < np.finfo(np.float32).tiny, np.float32(0), np.abs(x)) / s
  want_idx = ref.e2m1_codes(np.nan_to_num(want.astype(np.float32), nan=0.0)) & 7
  fn = lambda x, s: nm.e2m1.nearest_index_of_quotient(jnp.abs(x), nm.e2m1.quotient_thresholds(s))
  got = np.asarray(run(fn, mode, jnp.asarray(x), jnp.asarray(s)))
  np.testing.assert_array_equal(got, want_idx)
  assert len(np.unique(want_idx)) == 8


@pytest.mark.parametrize("mode", MODES)
def test_stochastic_index_of_quotient(rng, mode):
  """Division-free SR: the lower neighbour is that of numpy's IEEE float32
  quotient; the step up happens iff u < p = (y - lo) / gap of the float64
  quotient y, wherever u is not within 2^-21 of p; a quotient exactly on the
  grid stays; results are always lo or the next grid value, saturating at 6."""
  n = 200000
  x, s = _quotient_cases(rng, n, ref.E2M1_VALUES[1:])
  u = (rng.integers(0, 2**23, n) * 2.0**-23).astype(np.float32)
  u[:1000] = 0.0
  xf = np.where(x < np.finfo(np.float32).tiny, np.float32(0), x)  # subnormal operands flush, as div_rn
  y = xf.astype(np.float64) / s
  lo_i = np.searchsorted(ref.E2M1_VALUES, np.minimum(xf / s, 6.0), side="right") - 1  # numpy f32 quotient
  gap = np.diff(ref.E2M1_VALUES, append=np.inf)[lo_i]
  p = (y - ref.E2M1_VALUES[lo_i]) / gap
  fn = lambda x, s, u: nm.e2m1.stochastic_index_of_quotient(x, u, nm.e2m1.quotient_thresholds(s, "grid"))
  got = np.asarray(run(fn, mode, jnp.asarray(x), jnp.asarray(s), jnp.asarray(u)))
  want = np.minimum(lo_i + (u < p), 7)
  clear = np.abs(u - p) > 2.0**-21
  assert clear.mean() > 0.99
  np.testing.assert_array_equal(got[clear], want[clear])
  assert np.all((got == lo_i) | (got == np.minimum(lo_i + 1, 7)))
  on_grid = y == ref.E2M1_VALUES[lo_i]
  assert on_grid.sum() > 1000 and np.all(got[on_grid] == lo_i[on_grid])
  assert len(np.unique(got)) == 8


def test_pack_unpack_roundtrip(rng):
  codes = rng.integers(0, 16, (3, 64)).astype(np.uint8)
  packed = nm.pack_e2m1(jnp.asarray(codes))
  chex.assert_shape(packed, (3, 32))
  np.testing.assert_array_equal(np.asarray(packed), (codes[:, 0::2] | (codes[:, 1::2] << 4)))
  np.testing.assert_array_equal(np.asarray(nm.unpack_e2m1(packed)), codes)


@pytest.mark.parametrize("mode", MODES)
def test_e8m0_exponent_exact(rng, mode):
  amax = np.concatenate([np.exp2(rng.uniform(-100, 100, 5000)), 448.0 * np.exp2(np.arange(-20, 20)),
                         np.nextafter(448.0 * np.exp2(np.arange(-20, 20)), np.inf), [0.0]]).astype(np.float32)
  got = np.asarray(run(nm.e8m0_exponent, mode, jnp.asarray(amax), elem_max=448.0))
  _, want = ref.mxfp8(np.repeat(amax[:, None], 32, 1))
  np.testing.assert_array_equal(got, want[:, 0])


# ---------------------------------------------------------------- NVFP4 quantizers

def _data(kind: str, rng, shape) -> np.ndarray:
  if kind == "normal":
    return rng.standard_normal(shape).astype(np.float32)
  if kind == "student_t":
    return rng.standard_t(2.0, shape).astype(np.float32)
  if kind == "tiny":
    return (rng.standard_normal(shape) * 1e-30).astype(np.float32)
  if kind == "huge":
    return (rng.standard_normal(shape) * 1e30).astype(np.float32)
  if kind == "zero_blocks":
    x = rng.standard_normal(shape).astype(np.float32)
    x[..., :128] = 0  # a whole outer block
    x[..., 144:160] = 0  # one inner sub-block
    return x
  if kind == "underflow_subblock":
    # A sub-block so small next to its block's max that its E4M3 scale rounds to 0.
    x = rng.standard_normal(shape).astype(np.float32)
    x[..., 0] = 1e4
    x[..., 16:32] *= 1e-9
    return x
  if kind == "wide_range":
    return (rng.standard_normal(shape) * np.exp2(rng.uniform(-30, 30, shape))).astype(np.float32)
  raise ValueError(kind)


KINDS = ["normal", "student_t", "tiny", "huge", "zero_blocks", "underflow_subblock", "wide_range"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_nvfp4_block_bitwise(rng, kind, mode):
  x = _data(kind, rng, (6, 512))
  t = run(tj.quantize_nvfp4, mode, jnp.asarray(x))
  codes, s_in, s_out = ref.nvfp4_block(x)
  np.testing.assert_array_equal(codes_of(t), codes)
  np.testing.assert_array_equal(np.asarray(t.scale_inner).astype(np.float32), s_in)
  np.testing.assert_array_equal(np.asarray(t.scale_outer), s_out)
  chex.assert_type([t.codes, t.scale_inner, t.scale_outer], [jnp.uint8, jnp.float8_e4m3fn, jnp.float32])
  # The sub-block holding each 128-block's max gets scale 448 exactly (nonzero blocks).
  sb = np.asarray(t.scale_inner).astype(np.float32).reshape(6, 4, 8).max(-1)
  nonzero = np.abs(x).reshape(6, 4, 128).max(-1) > 0
  np.testing.assert_array_equal(sb[nonzero], 448.0)
  # Dequantized values: q * s_in * s_out, in float64 (exact for these few bits).
  want = ref.decode_codes(codes) * np.repeat(s_in.astype(np.float64), 16, -1) * np.repeat(s_out, 128, -1)
  np.testing.assert_allclose(np.asarray(tj.dequantize(t)), want.astype(np.float32), rtol=2**-23, atol=0)


def test_nvfp4_saturates_at_six():
  # Rounding s_in down can push |x/s| past 6: it must saturate, not overflow.
  x = np.zeros((1, 128), np.float32)
  x[0, :16] = np.linspace(0.1, 1.0, 16)
  x[0, 16] = 1.0 * 0.9375 * 0.999  # next sub-block, amax just under a scale rounding edge
  x[0, 16:32] = np.linspace(0.5, 0.9366, 16)
  t = tj.quantize_nvfp4(jnp.asarray(x))
  codes, _, _ = ref.nvfp4_block(x)
  np.testing.assert_array_equal(codes_of(t), codes)
  v = x[0, 16:32] / (np.asarray(t.scale_inner).astype(np.float32)[0, 1] * float(t.scale_outer[0, 0]))
  assert v.max() > 6.0, "test data must push |x/s| past 6"
  assert (ref.decode_codes(codes_of(t))[0, 16:32] == 6.0).sum() >= 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_nvfp4_axis_and_padding(rng, axis, mode):
  x = rng.standard_normal((200, 3, 72)).astype(np.float32)  # no axis is a multiple of 128
  t = run(tj.quantize_nvfp4, mode, jnp.asarray(x), axis=axis)
  xc = np.moveaxis(x, axis, -1)
  k = xc.shape[-1]
  padded = np.pad(xc, [(0, 0)] * (xc.ndim - 1) + [(0, (-k) % 128)])
  codes, s_in, s_out = ref.nvfp4_block(padded)
  np.testing.assert_array_equal(codes_of(t), codes)
  np.testing.assert_array_equal(np.asarray(t.scale_inner).astype(np.float32), s_in)
  y = np.asarray(tj.dequantize(t))
  assert y.shape == x.shape
  want = ref.decode_codes(codes) * np.repeat(s_in.astype(np.float64), 16, -1) * np.repeat(s_out, 128, -1)
  np.testing.assert_allclose(y, np.moveaxis(want[..., :k], -1, axis).astype(np.float32), rtol=2**-23)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["normal", "student_t", "zero_blocks"])
def test_nvfp4_tensor_scaling_bitwise(rng, kind, mode):
  x = _data(kind, rng, (4, 256))
  t = run(tj.quantize_nvfp4, mode, jnp.asarray(x), scaling="tensor")
  codes, s_in, s_out = ref.nvfp4_tensor(x)
  np.testing.assert_array_equal(codes_of(t), codes)
  np.testing.assert_array_equal(np.asarray(t.scale_inner).astype(np.float32), s_in)
  np.testing.assert_array_equal(np.asarray(t.scale_outer), s_out)


@pytest.mark.parametrize("mode", MODES)
def test_nvfp4_2d_blocks_bitwise_and_transpose_invariant(rng, mode):
  w = rng.standard_t(3.0, (64, 96)).astype(np.float32)
  t = run(tj.quantize_nvfp4, mode, jnp.asarray(w), scaling="tensor", block_2d=True)
  codes, s_in, _ = ref.nvfp4_tensor_2d(w)
  np.testing.assert_array_equal(codes_of(t), codes)
  np.testing.assert_array_equal(np.asarray(t.scale_inner).astype(np.float32), s_in)
  # W and W^T quantize to the same values (the point of 2-D blocks).
  tt = run(tj.quantize_nvfp4, mode, jnp.asarray(w.T), scaling="tensor", block_2d=True)
  np.testing.assert_array_equal(np.asarray(tj.dequantize(t)).T, np.asarray(tj.dequantize(tt)))
  # Block-scaled 2-D (128x128 outer tiles) keeps the symmetry too.
  w2 = rng.standard_normal((256, 384)).astype(np.float32)
  a = tj.dequantize(tj.quantize_nvfp4(jnp.asarray(w2), block_2d=True))
  b = tj.dequantize(tj.quantize_nvfp4(jnp.asarray(w2.T), block_2d=True))
  np.testing.assert_array_equal(np.asarray(a).T, np.asarray(b))


@pytest.mark.parametrize("scaling", ["block", "tensor"])
def test_nvfp4_roundtrip_idempotent(rng, scaling):
  x = rng.standard_t(3.0, (8, 384)).astype(np.float32)
  t = tj.quantize_nvfp4(jnp.asarray(x), scaling=scaling)
  t2 = jax.jit(lambda y: tj.quantize_nvfp4(y, scaling=scaling))(tj.dequantize(t))
  np.testing.assert_array_equal(np.asarray(t2.codes), np.asarray(t.codes))
  np.testing.assert_array_equal(np.asarray(t2.scale_inner).astype(np.float32),
                                np.asarray(t.scale_inner).astype(np.float32))
  # The outer scale is recomputed from amax = 6*448*s_out: equal up to FP32 rounding.
  np.testing.assert_allclose(np.asarray(tj.dequantize(t2)), np.asarray(tj.dequantize(t)), rtol=2**-21)


def test_quantization_really_happens_under_jit(rng):
  """The XLA trap: jit(dequantize o quantize) must give on-grid values.

  Runs on whatever backend is default, so on the H200 it checks the GPU
  compiler does not elide the rounding.
  """
  x = rng.standard_normal((64, 1024)).astype(np.float32)
  fq = jax.jit(lambda v: tj.dequantize(tj.quantize_nvfp4(v)))
  y = np.asarray(fq(jnp.asarray(x)))
  codes, s_in, s_out = ref.nvfp4_block(x)
  want = ref.decode_codes(codes) * np.repeat(s_in.astype(np.float64), 16, -1) * np.repeat(s_out, 128, -1)
  np.testing.assert_allclose(y, want.astype(np.float32), rtol=2**-23, atol=0)
  # At most 15 distinct |value / scale| levels per 16-block: a real FP4 grid.
  s = np.repeat(s_in * np.repeat(s_out, 8, -1), 16, -1)
  levels = np.abs(y / s)
  assert np.all(np.isin(np.round(levels, 5), ref.E2M1_VALUES)), "values left the E2M1 grid under jit"
  assert not np.allclose(y, x, rtol=1e-3), "jitted fake quantization returned its input unchanged"
  # And the MXFP8 path.
  m = np.asarray(jax.jit(lambda v: tj.dequantize(tj.quantize_mxfp8(v)))(jnp.asarray(x)))
  data, e = ref.mxfp8(x)
  np.testing.assert_array_equal(m, (data * np.repeat(np.exp2(e), 32, -1)).astype(np.float32))


# ---------------------------------------------------------------- stochastic rounding

def test_sr_neighbours_and_not_degenerate(rng, key):
  x = rng.standard_normal((16, 512)).astype(np.float32)
  rtn = tj.quantize_nvfp4(jnp.asarray(x))
  k1, k2 = jax.random.split(key)
  sr1 = jax.jit(lambda v, k: tj.quantize_nvfp4(v, rounding="stochastic", key=k))(jnp.asarray(x), k1)
  sr2 = tj.quantize_nvfp4(jnp.asarray(x), rounding="stochastic", key=k2)
  # Same scales as RTN (SR changes only the element rounding).
  np.testing.assert_array_equal(np.asarray(sr1.scale_inner).astype(np.float32),
                                np.asarray(rtn.scale_inner).astype(np.float32))
  s = np.repeat(np.asarray(rtn.scale_inner).astype(np.float64), 16, -1) * np.repeat(
      np.asarray(rtn.scale_outer), 128, -1)
  v = x / s.astype(np.float32)
  grid = ref.E2M1_VALUES
  lo = grid[np.searchsorted(grid, np.abs(v), side="right") - 1]
  hi = grid[np.minimum(np.searchsorted(grid, np.abs(v), side="right"), 7)]
  q1 = np.abs(ref.decode_codes(codes_of(sr1)))
  assert np.all((q1 == lo) | (q1 == hi)), "SR must pick one of the two neighbouring grid values"
  # Never more than one grid step from RTN.
  idx = lambda q: np.searchsorted(grid, np.abs(q))
  assert np.abs(idx(q1) - idx(ref.decode_codes(codes_of(rtn)))).max() <= 1
  assert (codes_of(sr1) != codes_of(sr2)).mean() > 0.05, "SR does not vary with the key"
  assert (codes_of(sr1) != 0).mean() > 0.5


def test_sr_unbiased(key):
  """E[SR(v)] = v, by a z-test on every grid interval.

  For each tested value v, n draws of Bernoulli(p) give mean error with std
  gap*sqrt(p(1-p)/n). We test 64 values at |z| < 4.5: the family-wise false-
  alarm rate is below 64 * 6.8e-6 = 4.4e-4.
  """
  n = 20000
  v = np.linspace(-5.99, 5.99, 64).astype(np.float32)
  keys = jax.random.split(key, n)
  draws = jax.jit(jax.vmap(lambda k: nm.decode_e2m1(nm.round_e2m1_stochastic(jnp.asarray(v), k))))(keys)
  draws = np.asarray(draws, np.float64)
  mean = draws.mean(0)
  grid = ref.E2M1_VALUES
  a = np.abs(v.astype(np.float64))
  i = np.searchsorted(grid, a, side="right") - 1
  gap = grid[np.minimum(i + 1, 7)] - grid[i]
  p = (a - grid[i]) / np.where(gap > 0, gap, 1)
  std = gap * np.sqrt(np.maximum(p * (1 - p), 1e-12) / n)
  z = (mean - v) / np.maximum(std, 1e-12)
  assert np.all(np.abs(z) < 4.5), f"SR biased: max |z| = {np.abs(z).max():.2f}"


# ---------------------------------------------------------------- RHT

def test_rht_matches_sylvester_and_is_orthogonal(key):
  eye = jnp.eye(16, dtype=jnp.float32)
  m = np.asarray(tj.random_hadamard_16(eye, key, axis=0))  # columns = transform of basis vectors
  d = np.asarray(nm.hadamard_signs(key))
  np.testing.assert_allclose(m, 0.25 * ref.sylvester_hadamard(16) @ np.diag(d), atol=1e-7)
  np.testing.assert_allclose(m.T @ m, np.eye(16), atol=1e-6)
  assert set(np.unique(d)) <= {-1.0, 1.0}


@pytest.mark.parametrize("mode", MODES)
def test_rht_preserves_dot_products_and_inverts(rng, key, mode):
  a = rng.standard_normal((32, 256)).astype(np.float32)
  b = rng.standard_normal((48, 256)).astype(np.float32)
  ra = run(tj.random_hadamard_16, mode, jnp.asarray(a), key)
  rb = run(tj.random_hadamard_16, mode, jnp.asarray(b), key)
  np.testing.assert_allclose(np.asarray(ra, np.float64) @ np.asarray(rb, np.float64).T,
                             a.astype(np.float64) @ b.T.astype(np.float64), rtol=1e-5, atol=1e-4)
  back = run(tj.inverse_random_hadamard_16, mode, ra, key)
  np.testing.assert_allclose(np.asarray(back), a, atol=1e-5)
  # Along axis 0 as well.
  r0 = tj.random_hadamard_16(jnp.asarray(a.T), key, axis=0)
  np.testing.assert_allclose(np.asarray(r0).T, np.asarray(ra), atol=1e-6)


def test_rht_keys():
  k1, k2 = jax.random.key(1), jax.random.key(2)
  np.testing.assert_array_equal(np.asarray(nm.hadamard_signs(k1)), np.asarray(nm.hadamard_signs(k1)))
  assert np.any(np.asarray(nm.hadamard_signs(k1)) != np.asarray(nm.hadamard_signs(k2)))
  with pytest.raises(ValueError, match="multiple of 16"):
    tj.random_hadamard_16(jnp.ones((4, 20)), k1)


# ---------------------------------------------------------------- MXFP8

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["normal", "student_t", "tiny", "huge", "zero_blocks", "wide_range"])
def test_mxfp8_bitwise(rng, kind, mode):
  x = _data(kind, rng, (4, 256))
  t = run(tj.quantize_mxfp8, mode, jnp.asarray(x))
  data, e = ref.mxfp8(x)
  np.testing.assert_array_equal(np.asarray(t.data).astype(np.float32), data)
  np.testing.assert_array_equal(np.asarray(t.scale_e8m0).astype(np.int64) - 127, e)
  np.testing.assert_array_equal(np.asarray(tj.dequantize(t)), (data * np.repeat(np.exp2(e), 32, -1)).astype(np.float32))


def test_mxfp8_axis_padding(rng):
  x = rng.standard_normal((50, 7)).astype(np.float32)
  t = tj.quantize_mxfp8(jnp.asarray(x), axis=0)
  chex.assert_shape(t.data, (7, 64))
  data, e = ref.mxfp8(np.pad(x.T, [(0, 0), (0, 14)]))
  np.testing.assert_array_equal(np.asarray(tj.dequantize(t)), (data * np.repeat(np.exp2(e), 32, -1))[:, :50].T)


# ---------------------------------------------------------------- bad input, NaN/Inf

def test_bad_inputs():
  with pytest.raises(TypeError, match="floating-point"):
    tj.quantize_nvfp4(jnp.ones((4, 128), jnp.int32))
  with pytest.raises(TypeError, match="floating-point"):
    tj.quantize_mxfp8(np.ones((4, 128), np.int8))
  with pytest.raises(ValueError, match="PRNG key"):
    tj.quantize_nvfp4(jnp.ones((4, 128)), rounding="stochastic")
  with pytest.raises(ValueError, match="unknown rounding"):
    tj.quantize_nvfp4(jnp.ones((4, 128)), rounding="up")
  with pytest.raises(ValueError, match="unknown scaling"):
    tj.quantize_nvfp4(jnp.ones((4, 128)), scaling="row")
  with pytest.raises(ValueError, match="2-D"):
    tj.quantize_nvfp4(jnp.ones((2, 4, 128)), block_2d=True)
  with pytest.raises(ValueError, match="out of range"):
    tj.quantize_nvfp4(jnp.ones((4, 128)), axis=2)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_propagates_to_its_block_only(rng, bad):
  x = rng.standard_normal((2, 384)).astype(np.float32)
  x[1, 130] = bad
  y = np.asarray(jax.jit(lambda v: tj.dequantize(tj.quantize_nvfp4(v)))(jnp.asarray(x)))
  assert np.all(np.isnan(y[1, 128:256])), "the block holding NaN/Inf must dequantize to NaN"
  assert np.all(np.isfinite(y[0])) and np.all(np.isfinite(y[1, :128])) and np.all(np.isfinite(y[1, 256:]))
  m = np.asarray(tj.dequantize(tj.quantize_mxfp8(jnp.asarray(x))))
  assert np.all(np.isnan(m[1, 128:160])) and np.all(np.isfinite(m[1, 160:]))
  ts = np.asarray(tj.dequantize(tj.quantize_nvfp4(jnp.asarray(x), scaling="tensor")))
  assert np.all(np.isnan(ts)), "tensor scaling: one scale, the whole tensor is NaN"


def test_check_numerics_raises_under_jit():
  x = jnp.ones((2, 128)).at[0, 3].set(jnp.nan)
  with tj.check_numerics():
    f = jax.jit(lambda v: tj.quantize_nvfp4(v).codes)
    with pytest.raises(Exception, match="NaN or Inf"):
      jax.block_until_ready(f(x))
    np.asarray(jax.jit(lambda v: tj.quantize_nvfp4(v).codes)(jnp.ones((2, 128))))  # finite: fine


# ---------------------------------------------------------------- property-based fuzzing

_jit_quantize = jax.jit(tj.quantize_nvfp4, static_argnames=("axis",))


@settings(max_examples=20, deadline=None)
@given(
    lead=st.integers(1, 5),
    k=st.integers(1, 300),
    axis=st.sampled_from([0, 1]),
    scale_exp=st.integers(-40, 40),
    seed=st.integers(0, 2**31 - 1),
)
def test_fuzz_nvfp4_vs_reference(lead, k, axis, scale_exp, seed):
  r = np.random.default_rng(seed)
  x = (r.standard_t(2.5, (lead, k)) * np.float32(2.0**scale_exp)).astype(np.float32)
  t = _jit_quantize(jnp.asarray(x), axis=axis)
  xc = np.moveaxis(x, axis, -1)
  n = xc.shape[-1]
  codes, s_in, _ = ref.nvfp4_block(np.pad(xc, [(0, 0), (0, (-n) % 128)]))
  np.testing.assert_array_equal(codes_of(t), codes)
  np.testing.assert_array_equal(np.asarray(t.scale_inner).astype(np.float32), s_in)
  assert tj.dequantize(t).shape == x.shape


def test_vmap(rng):
  x = rng.standard_normal((3, 5, 256)).astype(np.float32)
  t = jax.vmap(lambda v: tj.quantize_nvfp4(v))(jnp.asarray(x))
  for i in range(3):
    codes, s_in, _ = ref.nvfp4_block(x[i])
    np.testing.assert_array_equal(codes_of(t)[i], codes)
    np.testing.assert_array_equal(np.asarray(t.scale_inner[i]).astype(np.float32), s_in)
  y = jax.vmap(lambda v: tj.dequantize(tj.quantize_nvfp4(v)))(jnp.asarray(x))
  want = np.stack([np.asarray(tj.dequantize(tj.quantize_nvfp4(jnp.asarray(x[i])))) for i in range(3)])
  np.testing.assert_allclose(np.asarray(y), want, rtol=2**-22)
