"""Numerics core against the independent NumPy/ml_dtypes reference.

Bitwise where the math is exact: E2M1 codes and E4M3 inner scales and FP32
outer scales of every quantizer; statistical where the claim is (stochastic
rounding). Every check runs eagerly and under jax.jit (where XLA could elide a
narrow cast round trip).
"""

from __future__ import annotations

import functools

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


# integer=True is the integer-decided quotient that every platform but the CPU
# runs; integer=False on a CPU is its hardware division.
@pytest.mark.parametrize("integer", [False, True], ids=["platform", "integer"])
@pytest.mark.parametrize("mode", MODES)
def test_div_rn_is_the_ieee_quotient(rng, mode, integer):
  """div_rn must equal IEEE division bit for bit (XLA's GPU division is not)."""
  n = 100000
  x = (rng.standard_normal(n) * np.exp2(rng.uniform(-60, 60, n))).astype(np.float32)
  y = (rng.standard_normal(n) * np.exp2(rng.uniform(-60, 60, n))).astype(np.float32)
  # Exact quotients, a / a, the GPU counterexample 4.6875 / 0.9375, a subnormal
  # dividend (div_rn flushes subnormal operands to zero on every backend).
  a = (rng.uniform(1, 2, 1000) * np.exp2(rng.integers(-20, 20, 1000))).astype(np.float32)
  x = np.concatenate([x, a, np.float32(4.6875) * np.ones(4, np.float32), [0.0, -0.0, 1e-40]]).astype(np.float32)
  y = np.concatenate([y, a, np.float32(0.9375) * np.ones(4, np.float32), [3.0, 7.0, 448.0]]).astype(np.float32)
  got = np.asarray(run(functools.partial(nm.div_rn, integer=integer), mode, jnp.asarray(x), jnp.asarray(y)))
  with np.errstate(over="ignore", under="ignore"):
    want = x / y
  normal = np.abs(want) >= np.finfo(np.float32).tiny
  np.testing.assert_array_equal(got[normal | (want == 0)], want[normal | (want == 0)])
  assert np.all(got[~normal & (want != 0)] == 0), "quotients below the normal range flush to zero"


@pytest.mark.parametrize("mode", MODES)
def test_div_rn_by_a_scalar_divisor_is_the_ieee_quotient(rng, mode):
  """A 0-d divisor (NVIDIA's per-tensor scale) broadcast against the dividend:
  still the IEEE quotient, not x * (1 / y), which XLA's simplifier substitutes
  for a division by a broadcast scalar when it can see one."""
  x = (rng.uniform(1, 2, 20000) * np.exp2(rng.integers(-30, 30, 20000))).astype(np.float32)
  for y in (rng.uniform(1, 2, 8) * np.exp2(rng.integers(-30, 30, 8))).astype(np.float32):
    got = np.asarray(run(nm.div_rn, mode, jnp.asarray(x), jnp.asarray(y)))
    np.testing.assert_array_equal(got, x / y)


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


@pytest.mark.parametrize("integer", [False, True], ids=["platform", "integer"])
def test_div_rn_special_operands(integer):
  sp = np.array([0.0, -0.0, 1e-40, np.inf, -np.inf, np.nan, 1.0, -3e38], np.float32)
  x, y = (a.ravel() for a in np.meshgrid(sp, sp))
  flush = lambda v: np.where(np.abs(v) < np.finfo(np.float32).tiny, np.float32(0) * v, v)
  with np.errstate(all="ignore"):
    want = flush((flush(x) / flush(y)).astype(np.float32))
  got = np.asarray(jax.jit(functools.partial(nm.div_rn, integer=integer))(x, y))
  np.testing.assert_array_equal(got, want)  # NaN positions equal too
  np.testing.assert_array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)]))


@pytest.mark.parametrize("mode", MODES)
def test_e2m1_nearest_matches_ml_dtypes(rng, mode):
  grid = ref.E2M1_VALUES.astype(np.float32)
  mids = (grid[1:] + grid[:-1]) / 2
  # The index is rounded from the float's bits: every float32 within 512 ulps of each grid value,
  # midpoint and binade edge, and random bit patterns over the whole finite range.
  edges = np.concatenate([grid, mids, [8.0, 2.0**-126]]).astype(np.float32)
  near = (edges.view(np.int32)[:, None] + np.arange(-512, 513)[None, :]).ravel()
  bits = rng.integers(0, 0x7F800000, 100000)
  v = np.concatenate([rng.uniform(-8, 8, 20000), grid, -grid, mids, -mids, np.nextafter(mids, 0),
                      np.nextafter(mids, 10), [6.5, -7, 1e9, np.inf, -np.inf],
                      near[near >= 0].astype(np.int32).view(np.float32),
                      bits.astype(np.int32).view(np.float32)]).astype(np.float32)
  v = np.concatenate([v, -v])
  got = np.asarray(run(nm.round_e2m1_nearest, mode, jnp.asarray(v)))
  np.testing.assert_array_equal(got, ref.e2m1_codes(v))
  np.testing.assert_array_equal(np.asarray(nm.decode_e2m1(jnp.asarray(got))), ref.decode_codes(got))
  assert np.asarray(run(nm.round_e2m1_nearest, mode, jnp.asarray([np.nan, -np.nan], np.float32))).tolist() == [0, 0]


@pytest.mark.parametrize("mode", MODES)
def test_reciprocal_rn_is_the_ieee_reciprocal(rng, mode):
  """The per-block r = fp32(1 / s) is numpy's correctly rounded float32
  reciprocal, over the whole normal range, at powers of two and short
  significands (E4M3 x FP32 products); below the normal range r = inf."""
  n = 200000
  s = (rng.uniform(1, 2, n) * np.exp2(rng.integers(-126, 127, n))).astype(np.float32)
  s[:1000] = np.exp2(rng.integers(-126, 127, 1000))
  s[1000:2000] = rng.integers(1, 16, 1000) * np.exp2(rng.integers(-120, 110, 1000))
  s[2000:2010] = [1e-40, 0.0, np.nan, 1.0, 3.0, 448.0, 6.0, 2688.0, np.finfo(np.float32).max, 2.0**-126]
  got = np.asarray(run(nm.scales.reciprocal_rn, mode, jnp.asarray(s)))
  np.testing.assert_array_equal(got, ref.reciprocal(s))  # NaN positions equal too
  assert got[2000] == np.inf and got[2001] == np.inf


@pytest.mark.parametrize("mode", MODES)
def test_decode_e2m1_is_ml_dtypes_bitwise(rng, mode):
  """Every code, both nibbles of packed bytes, against ml_dtypes' float4_e2m1fn: the same
  float32 bits, -0 for code 8 included (the decode builds values from bits, no table)."""
  codes = rng.integers(0, 16, (4, 256)).astype(np.uint8)
  codes[0, :16] = np.arange(16)
  want = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
  got = np.asarray(run(lambda p: nm.decode_e2m1(nm.unpack_e2m1(p)), mode, nm.pack_e2m1(jnp.asarray(codes))))
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


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
  if kind == "lognormal":
    return (rng.lognormal(0.0, 2.0, shape) * rng.choice([-1, 1], shape)).astype(np.float32)
  if kind == "bf16_values":  # bfloat16-representable inputs (activations, gradients)
    x = rng.standard_normal(shape) * np.exp(rng.standard_normal(shape))
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)
  if kind == "grid_points":  # already quantized values: x r lands on (or an ulp off) the grid
    x = rng.standard_normal(shape).astype(np.float32)
    codes, s_in, s_out = ref.nvfp4_block(x)
    s = np.repeat(s_in.astype(np.float64), 16, -1) * np.repeat(s_out, 128, -1)
    return (ref.decode_codes(codes) * s).astype(np.float32)
  if kind == "saturation":
    # Sub-blocks whose amax_16 / s_out / 6 sits just below an E4M3 midpoint:
    # s_in rounds down, so the sub-block's max lands above 6 and saturates.
    x = rng.standard_normal(shape).astype(np.float32)
    x[..., 0] = 1000.0  # the 128-block max: s_out = 1000 / 448 / 6
    s_out = np.float32(np.float32(1000.0 / np.float32(448)) / np.float32(6))
    t = rng.choice([9.49, 19.9, 39.8, 79.5, 99.9, 199.5], x.shape[:-1] + (x.shape[-1] // 16,))
    sub = x.reshape(*x.shape[:-1], -1, 16)
    sub *= (t * 6 * s_out / np.abs(sub).max(-1))[..., None]
    sub[..., 0, :] = x.reshape(*x.shape[:-1], -1, 16)[..., 0, :]
    x = sub.reshape(shape).astype(np.float32)
    x.reshape(*shape[:-1], -1, 128)[..., 0] = 1000.0
    return x
  if kind == "subnormal_scale":
    # Blocks near the bottom of float32: s_out below 2^-117, so a tiny
    # sub-block's s = s_in s_out is subnormal (r = inf); subnormal elements.
    x = (rng.standard_normal(shape) * 1e-33).astype(np.float32)
    x[..., 16:32] *= np.float32(1e-4)
    x[..., 40] = np.float32(1e-40)
    x[..., 128:256] *= np.float32(1e-4)  # a whole block whose s_out flushes to 0 -> 1
    return x
  raise ValueError(kind)


KINDS = ["normal", "student_t", "tiny", "huge", "zero_blocks", "underflow_subblock", "wide_range", "lognormal",
         "bf16_values", "grid_points", "saturation", "subnormal_scale"]


@pytest.mark.parametrize("kind", KINDS)
def test_nvfp4_block_bitwise_under_vmap(rng, kind):
  """Rows quantized one at a time under jit(vmap): the per-block scale divisions must stay IEEE
  when their constant divisors are batched differently from the amax (OsciReset batches layers)."""
  x = _data(kind, rng, (6, 512))
  t = jax.jit(jax.vmap(tj.quantize_nvfp4))(jnp.asarray(x))
  codes, s_in, s_out = ref.nvfp4_block(x)
  np.testing.assert_array_equal(codes_of(t), codes)
  np.testing.assert_array_equal(np.asarray(t.scale_inner).astype(np.float32), s_in)
  np.testing.assert_array_equal(np.asarray(t.scale_outer), s_out)


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
  # The sub-block holding each 128-block's max gets scale 448 exactly (blocks
  # whose s_out is a normal float32, i.e. all but all-zero and near-underflow ones).
  sb = np.asarray(t.scale_inner).astype(np.float32).reshape(6, 4, 8).max(-1)
  nonzero = np.abs(x).reshape(6, 4, 128).max(-1) > 2688 * 1.01 * np.finfo(np.float32).tiny
  np.testing.assert_array_equal(sb[nonzero], 448.0)
  # Dequantized values: q * s_in * s_out, in float64 (exact for these few bits).
  want = ref.decode_codes(codes) * np.repeat(s_in.astype(np.float64), 16, -1) * np.repeat(s_out, 128, -1)
  np.testing.assert_allclose(np.asarray(tj.dequantize(t)), want.astype(np.float32), rtol=2**-23, atol=0)


def near_decision_points(rng, rows: int) -> np.ndarray:
  """Blocks whose elements sit on and a few ulps around the scaled E2M1
  midpoints and grid values (x = t s, then +-0..3 ulps), with every
  sub-block's max kept so the scales are those of the unperturbed data."""
  x = rng.standard_normal((rows, 512)).astype(np.float32) * np.float32(np.exp2(rng.integers(-20, 20)))
  _, s_in, s_out = ref.nvfp4_block(x)
  s = np.repeat((s_in * np.repeat(s_out, 8, -1)).astype(np.float32), 16, -1)
  pts = np.concatenate([ref.E2M1_VALUES[1:], (ref.E2M1_VALUES[1:] + ref.E2M1_VALUES[:-1]) / 2])
  t = pts[rng.integers(0, len(pts), x.shape)]
  y = (t * s.astype(np.float64)).astype(np.float32)
  y = (y.view(np.int32) + rng.integers(-3, 4, x.shape).astype(np.int32)).view(np.float32)
  y = np.where(rng.random(x.shape) < 0.5, -y, y)
  sub_max = np.abs(x).reshape(rows, -1, 16).max(-1, keepdims=True)
  is_max = (np.abs(x).reshape(rows, -1, 16) == sub_max).reshape(x.shape)
  keep = is_max | (np.abs(y).reshape(rows, -1, 16) >= sub_max).reshape(x.shape)
  return np.where(keep, x, y).astype(np.float32)


@pytest.mark.parametrize("mode", MODES)
def test_nvfp4_near_decision_points_bitwise(rng, mode):
  """Products x r at and within 3 ulps of every decision point: RNE of the
  float32 product, ties to even, bitwise the reference's."""
  x = near_decision_points(rng, 64)
  t = run(tj.quantize_nvfp4, mode, jnp.asarray(x))
  codes, s_in, s_out = ref.nvfp4_block(x)
  np.testing.assert_array_equal(np.asarray(t.scale_inner).astype(np.float32), s_in)
  np.testing.assert_array_equal(codes_of(t), codes)
  v = np.abs(ref.scaled(x, np.repeat((s_in * np.repeat(s_out, 8, -1)).astype(np.float32), 16, -1)))
  mids = (ref.E2M1_VALUES[1:] + ref.E2M1_VALUES[:-1]) / 2
  assert np.isin(v, mids).sum() > 100, "test data must hit exact ties of x r"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["normal", "lognormal", "wide_range"])
def test_nvfp4_bf16_input_bitwise(rng, kind, mode):
  """bfloat16 inputs quantize as their (exact) float32 values."""
  x = _data(kind, rng, (8, 384)).astype(ml_dtypes.bfloat16)
  t = run(tj.quantize_nvfp4, mode, jnp.asarray(x))
  codes, s_in, s_out = ref.nvfp4_block(x.astype(np.float32))
  np.testing.assert_array_equal(codes_of(t), codes)
  np.testing.assert_array_equal(np.asarray(t.scale_inner).astype(np.float32), s_in)
  np.testing.assert_array_equal(np.asarray(t.scale_outer), s_out)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["normal", "lognormal", "bf16_values", "zero_blocks", "saturation",
                                  "subnormal_scale"])
def test_nvfp4_stochastic_bitwise(rng, key, kind, mode):
  """SR codes equal the reference's, bit for bit: the same documented
  counter-based generator (seeded from the key) and the rule "step up iff
  (bits + 1/2) 2^-16 < p" on v = fp32(x r)."""
  x = _data(kind, rng, (6, 512))
  t = run(lambda v, k: tj.quantize_nvfp4(v, rounding="stochastic", key=k), mode, jnp.asarray(x), key)
  seed = int(jax.random.bits(key, (), jnp.uint32))
  codes, s_in, s_out = ref.nvfp4_block(x, seed=seed)
  np.testing.assert_array_equal(codes_of(t), codes)
  np.testing.assert_array_equal(np.asarray(t.scale_inner).astype(np.float32), s_in)
  np.testing.assert_array_equal(np.asarray(t.scale_outer), s_out)


def test_nvfp4_stochastic_canonical_rows(rng, key):
  """The random bits follow the canonical layout (quantized axis last, leading
  axes flattened into rows), whatever the axis and rank."""
  x = rng.standard_normal((3, 200, 5)).astype(np.float32)
  t = tj.quantize_nvfp4(jnp.asarray(x), axis=1, rounding="stochastic", key=key)
  xc = np.pad(np.moveaxis(x, 1, -1), [(0, 0), (0, 0), (0, 56)]).reshape(15, 256)
  codes, _, _ = ref.nvfp4_block(xc, seed=int(jax.random.bits(key, (), jnp.uint32)))
  np.testing.assert_array_equal(codes_of(t).reshape(15, 256), codes)


def test_nvfp4_saturates_at_six():
  # Rounding s_in down can push |x/s| past 6: it must saturate, not overflow.
  x = np.zeros((1, 128), np.float32)
  x[0, :16] = np.linspace(0.1, 1.0, 16)
  x[0, 16] = 1.0 * 0.9375 * 0.999  # next sub-block, amax just under a scale rounding edge
  x[0, 16:32] = np.linspace(0.5, 0.9366, 16)
  t = tj.quantize_nvfp4(jnp.asarray(x))
  codes, _, _ = ref.nvfp4_block(x)
  np.testing.assert_array_equal(codes_of(t), codes)
  v = ref.scaled(x[0, 16:32], np.asarray(t.scale_inner).astype(np.float32)[0, 1] * np.asarray(t.scale_outer)[0, 0])
  assert v.max() > 6.0, "test data must push |x r| past 6"
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
  s = np.repeat(np.asarray(rtn.scale_inner).astype(np.float32), 16, -1) * np.repeat(
      np.asarray(rtn.scale_outer), 128, -1)
  v = np.minimum(np.abs(ref.scaled(x, s)), 6.0)
  grid = ref.E2M1_VALUES
  lo = grid[np.searchsorted(grid, v, side="right") - 1]
  hi = grid[np.minimum(np.searchsorted(grid, v, side="right"), 7)]
  q1 = np.abs(ref.decode_codes(codes_of(sr1)))
  assert np.all((q1 == lo) | (q1 == hi)), "SR must pick one of the two neighbouring grid values"
  # Never more than one grid step from RTN.
  idx = lambda q: np.searchsorted(grid, np.abs(q))
  assert np.abs(idx(q1) - idx(ref.decode_codes(codes_of(rtn)))).max() <= 1
  assert (codes_of(sr1) != codes_of(sr2)).mean() > 0.05, "SR does not vary with the key"
  assert (codes_of(sr1) != 0).mean() > 0.5


def test_sr_unbiased(key):
  """E[SR(v)] = v (to the 2^-17 gap resolution of 16 random bits, far below
  the test's sensitivity), by a z-test on every grid interval.

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


@pytest.mark.parametrize("mode", MODES)
def test_sr_probability_resolution_is_2_to_minus_16(mode):
  """Over all 2^16 random-bit values, v = lo + p gap steps up exactly
  #{k : (k + 1/2) 2^-16 < p} times: P(up) has resolution 2^-16 (16 random bits)
  and is within 2^-17 of p. Probabilities 2^-16 apart give different counts,
  a value on the grid never steps up, saturated values never do."""
  bits = jnp.arange(2**16, dtype=jnp.uint32)
  grid = ref.E2M1_VALUES
  cases = []
  for lo_i in range(7):
    gap = grid[lo_i + 1] - grid[lo_i]
    for m in (0, 1, 2, 3, 4097, 32767, 32768, 65534, 65535):
      for frac in (0.25, 0.75):
        p = (m + frac) / 2**16
        if p < 1:
          cases.append((lo_i, np.float32(grid[lo_i] + p * gap)))  # exact in float32
  v = np.array([c[1] for c in cases], np.float32)
  fn = lambda v, b: nm.e2m1.stochastic_index(v[:, None], b[None, :])
  idx = np.asarray(run(fn, mode, jnp.asarray(v), bits))
  lo_i = np.array([c[0] for c in cases])
  assert np.all((idx == lo_i[:, None]) | (idx == lo_i[:, None] + 1))
  ups = (idx > lo_i[:, None]).sum(1)
  gap = grid[lo_i + 1] - grid[lo_i]
  p = (v.astype(np.float64) - grid[lo_i]) / gap
  want = np.array([np.sum(np.arange(2**16) + 0.5 < q * 2**16) for q in p])
  np.testing.assert_array_equal(ups, want)
  assert np.all(np.abs(ups / 2**16 - p) <= 2.0**-17)
  on_grid = np.asarray(run(fn, mode, jnp.asarray(grid.astype(np.float32)), bits))
  np.testing.assert_array_equal(on_grid, np.broadcast_to(np.arange(8)[:, None], on_grid.shape))
  sat = np.asarray(run(fn, mode, jnp.asarray(np.array([6.5, 1e30, np.inf], np.float32)), bits))
  assert np.all(sat == 7)


@pytest.mark.parametrize("mode", MODES)
def test_sr_decision_flips_exactly_at_every_threshold(mode):
  """For every bits value b and every grid cell [lo, hi) below 6: at the threshold
  lo + (b + 1/2) 2^-16 (hi - lo) (exact in float32) and one ulp below it the index
  stays lo's, one ulp above it steps up (the rule's strict '<', for all 2^16 b)."""
  grid = ref.E2M1_VALUES
  b = np.arange(2**16, dtype=np.float64)
  v, bits, want = [], [], []
  for lo_i in range(7):
    lo, gap = grid[lo_i], grid[lo_i + 1] - grid[lo_i]
    thr = (lo + (b + 0.5) / 2**16 * gap).astype(np.float32)
    assert np.array_equal(thr.astype(np.float64), lo + (b + 0.5) / 2**16 * gap)  # exact
    for point, up in ((np.nextafter(thr, np.float32(0)), 0), (thr, 0), (np.nextafter(thr, np.float32(8)), 1)):
      v.append(point)
      bits.append(np.arange(2**16, dtype=np.uint32))
      want.append(np.full(2**16, lo_i + up))
  got = np.asarray(run(nm.e2m1.stochastic_index, mode, jnp.asarray(np.concatenate(v)), jnp.asarray(np.concatenate(bits))))
  np.testing.assert_array_equal(got, np.concatenate(want))


@pytest.mark.parametrize("mode", MODES)
def test_sr_index_equals_the_float64_rule_around_every_grid_value(mode):
  """stochastic_index decides from v's float bits (a carry from 1 up, one compare
  below 1); it must give the float64 rule's index (numpy_reference.sr_codes) for every float32
  within 300 ulps of each grid value, midpoint and binade edge, on random
  values up to 10, and on 0, 2^-126, huge, inf and NaN."""
  rng = np.random.default_rng(3)
  edges = (0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 16)
  near = [(np.arange(-300, 300) + np.float32(e).view(np.int32)).astype(np.int32).view(np.float32) for e in edges]
  v = np.concatenate(near + [rng.uniform(0, 10, 50_000).astype(np.float32),
                             np.array([0, 2.0**-126, 1e30, np.inf, np.nan], np.float32)])
  bits = rng.integers(0, 2**16, v.shape).astype(np.uint32)
  bits[::7], bits[1::7] = 0, 2**16 - 1  # the extreme bit values on every stretch
  got = np.asarray(run(nm.e2m1.stochastic_index, mode, jnp.asarray(v), jnp.asarray(bits)))
  np.testing.assert_array_equal(got, ref.sr_codes(v, bits))


def test_counter_generator_bits():
  """The generator gives 16 flat bits per element (chi-square over the 256
  values of each byte), two per hash, distinct streams per row and seed, and
  it is the documented formula (the NumPy re-implementation)."""
  bits = np.asarray(jax.jit(nm.counter_rng.element_bits, static_argnums=1)(jnp.uint32(7), (512, 512)))
  np.testing.assert_array_equal(bits, ref.counter_bits(7, 512, 512))
  assert bits.max() < 2**16 and bits.dtype == np.uint32
  for byte in (bits & 0xFF, bits >> 8):
    counts = np.bincount(byte.ravel(), minlength=256)
    expected = bits.size / 256
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 380, f"chi2={chi2:.1f} (255 dof; P(chi2 > 380) < 1e-6)"
  assert len(np.unique(bits[:, 0::2] | (bits[:, 1::2] << 16))) > 0.99 * bits.size / 2  # 2^17 of 2^32
  other = np.asarray(nm.counter_rng.element_bits(jnp.uint32(8), (512, 512)))
  assert np.mean(other == bits) < 1e-3


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


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("axis", [-1, 0])
def test_rht_is_the_float32_butterfly_bitwise(rng, key, mode, axis):
  """The transform's values are those of the butterfly (a + b, a - b at distances 1, 2, 4, 8 of
  the sign-flipped chunk, then * 1/4) in float32, bit for bit, whatever form the stages take."""
  x = (rng.standard_t(2.0, (64, 256)) * np.exp(3 * rng.standard_normal((64, 256)))).astype(np.float32)
  d = np.asarray(nm.hadamard_signs(key))
  v = np.moveaxis(x, axis, -1).reshape(-1, 16) * d
  for h in (1, 2, 4, 8):
    v = v.reshape(-1, 16 // (2 * h), 2, h)
    v = np.stack([v[:, :, 0] + v[:, :, 1], v[:, :, 0] - v[:, :, 1]], axis=2).reshape(-1, 16)
  want = np.moveaxis((v * np.float32(0.25)).reshape(np.moveaxis(x, axis, -1).shape), -1, axis)
  got = np.asarray(run(lambda a: tj.random_hadamard_16(a, key, axis=axis), mode, jnp.asarray(x)))
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


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


@pytest.mark.parametrize("kind", ["normal", "tiny", "huge", "zero_blocks", "wide_range"])
@pytest.mark.parametrize("axis", [0, 1])
def test_mxfp8_values_in_place_bitwise(rng, kind, axis):
  """mxfp8_values (blocks along `axis` where it lies) is bitwise the dequantized
  quantize_mxfp8 and the NumPy rule, with padding (50 rows) and a NaN and an Inf block."""
  x = _data(kind, rng, (50, 96))
  x[3, 40] = np.nan
  x[45, 70] = np.inf
  for dtype in (jnp.float32, jnp.bfloat16):
    xj = jnp.asarray(x).astype(dtype)
    got = np.asarray(jax.jit(lambda v: nm.mxfp8_values(v, axis=axis))(xj))
    want = np.asarray(tj.dequantize(tj.quantize_mxfp8(xj, axis=axis)))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  xt = np.moveaxis(np.asarray(xj, np.float32), axis, -1)
  pad = (-xt.shape[-1]) % 32
  data, e = ref.mxfp8(np.pad(xt, [(0, 0), (0, pad)]))
  with np.errstate(invalid="ignore"):
    v = (data * np.repeat(np.exp2(e), 32, -1))[:, :xt.shape[-1]]
  blocks = np.pad(~np.isfinite(xt), [(0, 0), (0, pad)]).reshape(xt.shape[0], -1, 32).any(-1)
  v[np.repeat(blocks, 32, -1)[:, :xt.shape[-1]]] = np.nan  # a block holding NaN/Inf is NaN
  np.testing.assert_array_equal(np.moveaxis(got, axis, -1), v.astype(np.float32))


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


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("quantize", [tj.quantize_nvfp4, tj.quantize_mxfp8])
def test_check_numerics_raises_nonfinite_error_eagerly(quantize, bad):
  x = jnp.ones((2, 128)).at[0, 3].set(bad)
  with pytest.raises(tj.NonFiniteError, match="NaN or Inf"):
    with tj.check_numerics():
      quantize(x)
  with tj.check_numerics():
    quantize(jnp.ones((2, 128)))  # finite: fine
  quantize(x)  # checking off: NaN propagates into the block's scale, no error


@pytest.mark.parametrize("quantize", [tj.quantize_nvfp4, tj.quantize_mxfp8])
def test_check_numerics_raises_nonfinite_error_under_jit(quantize):
  x = jnp.ones((2, 128)).at[0, 3].set(jnp.nan)
  f = jax.jit(lambda v: quantize(v).scale_inner if quantize is tj.quantize_nvfp4 else quantize(v).data)
  with pytest.raises(tj.NonFiniteError, match="NaN or Inf"):  # awaited inside the context
    with tj.check_numerics():
      jax.block_until_ready(f(x))
  g = jax.jit(lambda v: jnp.sum(quantize(v * 2.0).dequantize()))
  with pytest.raises(tj.NonFiniteError, match="NaN or Inf"):  # not awaited: raised when the context exits
    with tj.check_numerics():
      g(x)
  with tj.check_numerics():
    jax.block_until_ready(g(jnp.ones((2, 128))))  # finite: fine (and no stale error from before)


@pytest.mark.parametrize("shape,axis", [((0, 128), -1), ((0, 128), 0), ((4, 0), -1), ((0,), 0), ((2, 0, 3), 1)])
def test_empty_inputs(shape, axis):
  x = jnp.zeros(shape, jnp.float32)
  for t in (tj.quantize_nvfp4(x, axis=axis), tj.quantize_mxfp8(x, axis=axis),
            tj.quantize_nvfp4(x, axis=axis, scaling="tensor"),
            tj.quantize_nvfp4(x, axis=axis, rounding="stochastic", key=jax.random.key(0)),
            jax.jit(lambda v: tj.quantize_nvfp4(v, axis=axis))(x)):
    y = tj.dequantize(t)
    assert y.shape == shape and y.dtype == jnp.float32
  if len(shape) == 2:
    assert tj.dequantize(tj.quantize_nvfp4(x, block_2d=True, scaling="tensor")).shape == shape


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
