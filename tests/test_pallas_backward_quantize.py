"""Pallas backward quantizer (RHT-16 + double-block scales + SR) vs the XLA numerics.

CI runs the kernel in Mosaic GPU's CPU interpreter at small shapes, and lowers
it for CUDA (Mosaic GPU's layout inference and SMEM budget run on the CPU), so
a kernel that cannot compile for the H200 fails here too. The `gpu`-marked
tests run the compiled kernel on the H200 at real shapes.

What is exact and what is not: the kernel's transform y = (1/4) H16 D x
(tensor cores, exact products, FP32 accumulation) equals random_hadamard_16's
butterfly up to FP32 accumulation order, so y is checked within a few ulps;
the scales and the stochastically rounded codes are then checked bitwise
against quantize_nvfp4 applied to the kernel's own y (both draw their bits
from the counter-based generator, seeded with counter_rng.sr_seed(key)), and
against the NumPy reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tetrajet_jax.kernels import can_use_pallas_backward_quantizer, quantize_nvfp4_backward, transformed_amax
from tetrajet_jax.kernels._rht_operands import transform_block, transform_matrix
from tests import numpy_reference as ref
from tetrajet_jax.numerics import (decode_e2m1, hadamard_signs, nvfp4_bf16_operand, quantize_nvfp4,
                                   random_hadamard_16, tensor_outer_scale, unpack_e2m1)
from tetrajet_jax.numerics.counter_rng import row_keys, sr_seed

GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def hard_input(rng, shape, dtype, nonfinite=False):
  """Wide dynamic range, zero blocks, tiny sub-blocks (rows are the quantized lines)."""
  x = rng.standard_normal(shape) * np.exp(1.5 * rng.standard_normal(shape))
  x[0, :128] = 0.0  # all-zero block: s_out = 1
  x[1, :16] = 1e-30  # tiny chunk next to a large one: s_in rounds to 0 -> 2^-9
  x[1, 16] = 1e4
  if nonfinite:
    x[3, 5] = np.nan
    x[4, 200] = np.inf
  return jnp.asarray(x.astype(np.float32)).astype(dtype)


def exact_rht_input(rng, shape, dtype, nonfinite=False):
  """Like hard_input (rows are the quantized lines; a zero 128-block, a tiny 16-block beside a large
  one, scales spread over 2^+-30), but every 16-block is small integers times one power of two, so
  its RHT sums are exact in FP32 in any order. For bitwise comparisons of two transforms in the
  interpreter: there XLA's CPU dot, whose accumulation order follows the host's vector width,
  computes them (on the GPU the hard input is compared bitwise: test_backward_quantizer_gpu,
  test_tensor_scaled_modes_gpu)."""
  rows, cols = shape
  m = rng.integers(-127, 128, size=shape).astype(np.float64)
  e = np.repeat(rng.integers(-30, 31, size=(rows, cols // 16)), 16, axis=1)
  x = m * np.exp2(e)
  x[0, :128] = 0.0  # all-zero block: s_out = 1
  x[1, :16] = 2.0**-100  # tiny chunk next to a large one: s_in rounds to 0 -> 2^-9
  x[1, 16:32] = rng.integers(-127, 128, size=16)
  x[1, 16] = 2.0**13
  if nonfinite:
    x[3, 5] = np.nan
    x[4, 200] = np.inf
  return jnp.asarray(x.astype(np.float32)).astype(dtype)


def _codes(t):
  return np.asarray(unpack_e2m1(t.codes))


def check_tensor(t, y, x_lines, key, sr_key, *, qs=None):
  """All contracts for one kernel output on canonical lines x_lines [rows, Kp]
  (rows quantized along -1), made with seed sr_seed(sr_key)."""
  y = np.asarray(y)
  # 1. The transform: random_hadamard_16 up to FP32 accumulation order.
  yr = np.asarray(random_hadamard_16(x_lines.astype(jnp.float32), key, axis=-1))
  # A non-finite input poisons its 128-block (0 * inf in the dense transform); the
  # quantizer marks that whole block NaN anyway (checked in 2).
  finite = np.isfinite(yr) & np.isfinite(y)
  blk_bad = ~np.isfinite(yr).reshape(yr.shape[0], -1, 128).all(-1)
  assert np.array_equal(~np.isfinite(y).reshape(y.shape[0], -1, 128).all(-1), blk_bad)
  chunk_max = np.abs(np.where(finite, yr, 0)).reshape(yr.shape[0], -1, 16).max(-1, keepdims=True)
  tol = np.broadcast_to(chunk_max * 2.0**-20, (yr.shape[0], yr.shape[1] // 16, 16)).reshape(yr.shape)
  assert np.all(np.abs(np.where(finite, y - yr, 0)) <= tol), "RHT differs from random_hadamard_16"
  # 2. Codes and scales: bitwise those of the XLA quantizer (same generator, same
  # seed) on the kernel's own transformed values, and of the NumPy reference.
  r = quantize_nvfp4(jnp.asarray(y), axis=-1, rounding="stochastic", key=sr_key)
  np.testing.assert_array_equal(np.asarray(t.scale_outer), np.asarray(r.scale_outer))
  np.testing.assert_array_equal(np.asarray(t.scale_inner, np.float32), np.asarray(r.scale_inner, np.float32))
  np.testing.assert_array_equal(_codes(t), _codes(r))
  codes, s_in, s_out = ref.nvfp4_block(y, seed=int(sr_seed(sr_key)))
  np.testing.assert_array_equal(_codes(t), codes)
  np.testing.assert_array_equal(np.asarray(t.scale_inner, np.float32), s_in)
  np.testing.assert_array_equal(np.asarray(t.scale_outer), s_out)
  # 3. Codes: one of the two E2M1 neighbours of v = y r (the exact grid value when v is on the grid).
  s = (np.repeat(np.asarray(t.scale_inner, np.float32), 16, 1) * np.repeat(np.asarray(t.scale_outer), 128, 1))
  v = ref.scaled(y, s.astype(np.float32))
  ok_block = np.isfinite(s)
  q = np.asarray(decode_e2m1(unpack_e2m1(t.codes)))
  a = np.minimum(np.abs(np.where(ok_block, v, 0)), 6.0)
  lo_i = np.searchsorted(GRID, a, side="right") - 1
  lo, hi = GRID[lo_i], GRID[np.minimum(lo_i + 1, 7)]
  mag = np.abs(q)
  on_grid = a == lo
  assert np.all(np.where(ok_block & on_grid, mag == lo, True)), "a grid value was not kept"
  assert np.all(np.where(ok_block, (mag == lo) | (mag == hi), True)), "SR picked a non-neighbour"
  assert np.all(np.where(ok_block & (mag > 0), np.sign(q) == np.sign(v), True)), "wrong sign"
  assert np.all(_codes(t)[~ok_block] == 0), "a NaN block must hold zero codes"
  if qs is not None:
    np.testing.assert_array_equal(np.asarray(qs).view(np.uint16), np.asarray(nvfp4_bf16_operand(t)[0]).view(np.uint16))


def _assert_sr_unbiased(t, y, n: int) -> np.ndarray:
  """z-test of E[|decode(code)|] = |y/s| per column over n identical rows (|z| < 4.5); returns |q|."""
  y = np.asarray(y)
  assert np.all(y == y[:1])
  s = (np.repeat(np.asarray(t.scale_inner, np.float32), 16, 1) * np.repeat(np.asarray(t.scale_outer), 128, 1))[0]
  v = np.minimum(np.abs(ref.scaled(y[0], s.astype(np.float32)).astype(np.float64)), 6.0)  # beyond 6 saturates
  q = np.abs(np.asarray(decode_e2m1(unpack_e2m1(t.codes)), np.float64))
  lo_i = np.searchsorted(GRID, v, side="right") - 1
  gap = GRID[np.minimum(lo_i + 1, 7)] - GRID[lo_i]
  p = (v - GRID[lo_i]) / np.where(gap > 0, gap, 1)
  std = gap * np.sqrt(np.maximum(p * (1 - p), 1e-12) / n)
  z = (q.mean(0) - v) / np.maximum(std, 1e-12)
  assert np.all(np.abs(z) < 4.5), f"SR biased: max |z| = {np.abs(z).max():.2f}"
  return q

@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_backward_quantizer_interpret(rng, key, dtype):
  """axis=-1 on [64, 256] and axis=0 on its transpose: all contracts, and both give the same tensor."""
  xl = hard_input(rng, (64, 256), dtype, nonfinite=dtype == jnp.float32)
  signs = hadamard_signs(key)
  sr_key = jax.random.fold_in(key, 1)
  seed = sr_seed(sr_key)
  t, qs, y = quantize_nvfp4_backward(xl, signs, seed, axis=-1, emit_operand=True, emit_transformed=True,
                                   interpret=True)
  check_tensor(t, y, xl, key, sr_key, qs=qs)
  r = quantize_nvfp4(random_hadamard_16(xl, key, axis=-1), axis=-1, rounding="stochastic", key=key)
  assert (t.shape, t.axis, t.scaling, t.block_2d) == (r.shape, r.axis, r.scaling, r.block_2d)
  assert (t.codes.shape, t.codes.dtype, t.scale_inner.shape, t.scale_inner.dtype, t.scale_outer.shape) == (
      r.codes.shape, r.codes.dtype, r.scale_inner.shape, r.scale_inner.dtype, r.scale_outer.shape)

  x0 = xl.T  # [256, 64]: axis=0 quantizes its columns, canonical = xl's layout
  t0, y0 = quantize_nvfp4_backward(x0, signs, seed, axis=0, emit_transformed=True, interpret=True)
  r0 = quantize_nvfp4(random_hadamard_16(x0, key, axis=0), axis=0, rounding="stochastic", key=key)
  assert (t0.shape, t0.axis, t0.codes.shape, t0.scale_inner.shape, t0.scale_outer.shape) == (
      r0.shape, r0.axis, r0.codes.shape, r0.scale_inner.shape, r0.scale_outer.shape)
  np.testing.assert_array_equal(np.asarray(y0), np.asarray(y))
  np.testing.assert_array_equal(np.asarray(t0.codes), np.asarray(t.codes))
  np.testing.assert_array_equal(np.asarray(t0.scale_inner, np.float32), np.asarray(t.scale_inner, np.float32))
  np.testing.assert_array_equal(np.asarray(t0.scale_outer), np.asarray(t.scale_outer))
  # One CTA per row block (the default cut the K loop in two here): the same bits.
  t1 = quantize_nvfp4_backward(xl, signs, seed, axis=-1, k_splits=1, interpret=True)
  np.testing.assert_array_equal(np.asarray(t1.codes), np.asarray(t.codes))
  np.testing.assert_array_equal(np.asarray(t1.scale_outer), np.asarray(t.scale_outer))


def check_tensor_scaled(x, signs, sr_key, *, axis, rounding, interpret, k_splits=None):
  """NVIDIA's modes of the kernel on x: `transformed_amax` is max |y| of the kernel's own transform
  (bitwise; y = x exactly without signs), and the tensor-scaled codes and scales under
  tensor_outer_scale of it are bitwise the XLA quantizer's and the NumPy reference's on y."""
  seed = sr_seed(sr_key) if rounding == "stochastic" else None
  amax = transformed_amax(x, signs, axis=axis, k_splits=k_splits, interpret=interpret)
  scale = tensor_outer_scale(amax)
  t, y = quantize_nvfp4_backward(x, signs, seed, axis=axis, rounding=rounding, tensor_scale=scale,
                                 emit_transformed=True, k_splits=k_splits, interpret=interpret)
  y = np.asarray(y)
  np.testing.assert_array_equal(np.asarray(amax), np.max(np.abs(y)))
  if signs is None:
    xc = np.asarray(jnp.asarray(x, jnp.float32))
    xc = xc if axis == -1 else np.pad(xc, ((0, -xc.shape[0] % 128), (0, 0))).T
    np.testing.assert_array_equal(y, xc)
  assert (t.scaling, t.scale_outer.shape) == ("tensor", ())
  r = quantize_nvfp4(jnp.asarray(y), axis=-1, rounding=rounding, scaling="tensor",
                     key=sr_key if rounding == "stochastic" else None)
  for leaf in ("codes", "scale_inner", "scale_outer"):
    np.testing.assert_array_equal(np.atleast_1d(np.asarray(getattr(t, leaf))).view(np.uint8),
                                  np.atleast_1d(np.asarray(getattr(r, leaf))).view(np.uint8), err_msg=leaf)
  codes, s_in, s_out = ref.nvfp4_tensor(y, None if seed is None else int(seed))
  np.testing.assert_array_equal(_codes(t), codes)
  np.testing.assert_array_equal(np.asarray(t.scale_inner, np.float32), s_in)
  np.testing.assert_array_equal(np.asarray(t.scale_outer), s_out)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tensor_scaled_modes_interpret(rng, key, dtype):
  """SR without RHT (NVIDIA's dY along N), SR and RTN after the RHT (dY^T, X^T along tokens),
  both axes; the input's spread sends many 16-blocks under the per-tensor scale to the smallest
  E4M3 scales (exact RHT sums: the amax pass and the quantizing pass compare bitwise)."""
  xl = exact_rht_input(rng, (64, 256), dtype)
  sr_key = jax.random.fold_in(key, 4)
  for signs, rounding in ((None, "stochastic"), (hadamard_signs(key), "stochastic"), (hadamard_signs(key), "nearest")):
    for x, axis in ((xl, -1), (xl.T, 0)):
      check_tensor_scaled(x, signs, sr_key, axis=axis, rounding=rounding, interpret=True)


def test_tensor_scaled_nonfinite_input_gives_nan_scale_interpret(rng, key):
  x = hard_input(rng, (64, 256), jnp.float32, nonfinite=True)
  for signs in (None, hadamard_signs(key)):
    amax = transformed_amax(x, signs, interpret=True)
    assert not np.isfinite(np.asarray(amax))
    t = quantize_nvfp4_backward(x, signs, None, rounding="nearest", tensor_scale=tensor_outer_scale(amax),
                                interpret=True)
    assert np.isnan(np.asarray(t.scale_outer))
    r = quantize_nvfp4(random_hadamard_16(x, key) if signs is not None else x, axis=-1, scaling="tensor")
    assert np.isnan(np.asarray(r.scale_outer))


def test_rounding_and_seed_must_agree():
  s, x = jnp.ones((16,)), jnp.zeros((64, 128))
  with pytest.raises(ValueError, match="needs a seed"):
    quantize_nvfp4_backward(x, s, None)
  with pytest.raises(ValueError, match="takes no seed"):
    quantize_nvfp4_backward(x, s, jnp.uint32(0), rounding="nearest")
  with pytest.raises(ValueError, match="rounding must be"):
    quantize_nvfp4_backward(x, s, None, rounding="up")
  with pytest.raises(ValueError, match="tensor_scale must be a float32 scalar"):
    quantize_nvfp4_backward(x, s, None, rounding="nearest", tensor_scale=jnp.ones((2,), jnp.float32))
  with pytest.raises(ValueError, match="transformed_amax: .*cols % 128"):
    transformed_amax(jnp.zeros((64, 100)), s)


def test_axis0_pads_tokens_interpret(rng, key):
  """Tokens not a multiple of 128 are zero-padded, as the linear layer pads them."""
  x = hard_input(rng, (200, 64), jnp.bfloat16)
  sr_key = jax.random.fold_in(key, 3)
  t, y = quantize_nvfp4_backward(x, hadamard_signs(key), sr_seed(sr_key), axis=0, emit_transformed=True,
                               interpret=True)
  xp = jnp.pad(x, ((0, 56), (0, 0)))
  check_tensor(t, y, xp.T, key, sr_key)
  assert t.shape == (200, 64) and t.codes.shape == (64, 128)


def test_sr_unbiased_and_seeded_interpret(rng, key):
  """E[q s] = y by a z-test over 2048 draws (identical rows: each row draws its own bits).

  All rows hold the same 128 values, so y and the scales are the same in every
  row while the random bits differ (row keys). For each of the 128 values the
  mean of 2048 draws is tested at |z| < 4.5: family-wise false-alarm rate below
  128 * 6.8e-6 = 8.7e-4. Then: another seed changes the codes, not the scales;
  the same seed reproduces them bitwise.
  """
  n = 2048
  row = rng.standard_normal(128).astype(np.float32) * 3.0
  x = jnp.asarray(np.tile(row, (n, 1)))
  signs = hadamard_signs(key)
  f = jax.jit(lambda x, s: quantize_nvfp4_backward(x, signs, s, axis=-1, emit_transformed=True, interpret=True))
  t, y = f(x, jnp.uint32(1))
  q = _assert_sr_unbiased(t, y, n)
  assert len(np.unique(q, axis=0)) > 100, "rows did not draw independent bits"

  t2, _ = f(x, jnp.uint32(2))
  np.testing.assert_array_equal(np.asarray(t2.scale_outer), np.asarray(t.scale_outer))
  assert np.mean(np.asarray(t2.codes) != np.asarray(t.codes)) > 0.1, "the seed does not change the bits"
  t3, _ = f(x, jnp.uint32(1))
  np.testing.assert_array_equal(np.asarray(t3.codes), np.asarray(t.codes))


def test_generator_row_keys():
  """The kernel's row keys are the generator's (counter_rng), distinct per seed."""
  np.testing.assert_array_equal(np.asarray(row_keys(jnp.uint32(7), 64)),
                                ref.fmix32((ref.fmix32(np.uint64(7) ^ 0x9E3779B9)
                                            + ref.fmix32(np.arange(64, dtype=np.uint64) ^ 0x7F4A7C15)) & 0xFFFFFFFF))
  assert not np.array_equal(np.asarray(row_keys(jnp.uint32(7), 8)), np.asarray(row_keys(jnp.uint32(8), 8)))


def test_transform_matrix_is_the_rht(key):
  """B^T rows are (1/4) H16 D rows (even outputs first), exactly, and match random_hadamard_16."""
  d = hadamard_signs(key)
  bt = np.asarray(transform_matrix(d), np.float32)
  t16 = 0.25 * ref.sylvester_hadamard(16) @ np.diag(np.asarray(d))
  full = np.kron(np.eye(8), t16)
  perm = np.concatenate([np.arange(0, 128, 2), np.arange(1, 128, 2)])
  np.testing.assert_array_equal(bt, full[perm])
  x = np.random.default_rng(0).standard_normal((4, 128)).astype(np.float32)
  np.testing.assert_allclose((x @ bt.T)[:, np.argsort(perm)], np.asarray(random_hadamard_16(x, key)), atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_register_tile_source_is_bitwise_the_smem_one_interpret(rng, key, dtype):
  """The quantizer slicing the wgmma accumulator in registers gives the SMEM tile source's bits,
  both axes, with and without the operand (NaN/Inf blocks included for f32)."""
  xl = hard_input(rng, (64, 256), dtype, nonfinite=dtype == jnp.float32)
  signs, seed = hadamard_signs(key), sr_seed(jax.random.fold_in(key, 2))
  for x, axis in ((xl, -1), (xl.T, 0)):
    for emit in (False, True):
      smem, regs = (quantize_nvfp4_backward(x, signs, seed, axis=axis, emit_operand=emit, interpret=True,
                                          _tile_source=src) for src in ("smem", "registers"))
      for a, b in zip(jax.tree.leaves(smem), jax.tree.leaves(regs)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
  _, y = quantize_nvfp4_backward(xl, signs, seed, emit_transformed=True, interpret=True, _tile_source="registers")
  _, y_smem = quantize_nvfp4_backward(xl, signs, seed, emit_transformed=True, interpret=True, _tile_source="smem")
  np.testing.assert_array_equal(np.asarray(y), np.asarray(y_smem))  # y is still emitted through SMEM


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_block_tile_source_is_bitwise_the_smem_one_interpret(rng, key, dtype):
  """Each inner block transformed by its own K=16 wgmma (the "blocks" tile source) gives the dense
  transform's bits: codes, scales, operand and transformed values, both axes, SR after the RHT
  (NaN/Inf blocks included for f32), RTN without it, and the tensor-scaled mode. A non-finite
  input makes the dense transform's whole 128-block of y NaN (its zero weights times Inf) and the
  per-block one's 16-block only, as the reference butterfly does: under block scaling either
  128-block is NaN-scaled with zero codes; under a finite tensor scale (which a non-finite
  tensor's amax never gives) the dense transform would also zero the other seven inner blocks,
  so that mode runs on finite input. Exact RHT sums (exact_rht_input): both transforms run in the
  interpreter."""
  xl = exact_rht_input(rng, (64, 256), dtype, nonfinite=dtype == jnp.float32)
  x_finite = exact_rht_input(rng, (64, 256), dtype)
  signs, seed = hadamard_signs(key), sr_seed(jax.random.fold_in(key, 2))
  modes = ((xl, dict(signs_16=signs, seed=seed, emit_operand=True, emit_transformed=True)),
           (xl, dict(signs_16=None, seed=None, rounding="nearest")),
           (x_finite, dict(signs_16=signs, seed=seed, tensor_scale=jnp.float32(0.125))))
  for lines, kw in modes:
    for x, axis in ((lines, -1), (lines.T, 0)):
      dense, blocks = (jax.tree.leaves(quantize_nvfp4_backward(x, axis=axis, interpret=True, _tile_source=src,
                                                               **kw)) for src in ("smem", "blocks"))
      if kw.get("emit_transformed"):
        y_dense, y_blocks = np.asarray(dense.pop()), np.asarray(blocks.pop())
        finite = np.isfinite(y_dense)
        np.testing.assert_array_equal(y_blocks[finite], y_dense[finite])
        assert np.all(np.isnan(y_dense[np.isnan(y_blocks)]))
        assert np.isnan(y_blocks).any() == (dtype == jnp.float32)
      for a, b in zip(dense, blocks, strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_transform_block_is_one_block_of_the_dense_transform(key):
  """transform_block's rows are the dense transform's rows of the first inner block's outputs
  (even outputs first), restricted to that block's 16 inputs; the other inputs weigh zero."""
  d = hadamard_signs(key)
  bt = np.asarray(transform_matrix(d), np.float32)
  tb = np.asarray(transform_block(d), np.float32)
  evens, odds = bt[:8], bt[64:72]
  np.testing.assert_array_equal(tb, np.concatenate([evens, odds])[:, :16])
  assert not np.any(np.concatenate([evens, odds])[:, 16:])
  np.testing.assert_array_equal(np.asarray(transform_block(None), np.float32),
                                np.eye(16)[np.r_[0:16:2, 1:16:2]])


@pytest.mark.parametrize("dtype,axis", [(jnp.float32, -1), (jnp.bfloat16, 0)])
def test_lowers_for_hopper(dtype, axis):
  """Mosaic GPU lowering for CUDA (layout inference, SMEM budget) succeeds on the CPU."""
  shape = (256, 512) if axis == -1 else (512, 128)
  for k_splits, source in ((None, "smem"), (2, "smem"), (None, "registers"), (None, "blocks")):
    f = jax.jit(lambda v, k_splits=k_splits, source=source: quantize_nvfp4_backward(
        v, jnp.ones((16,)), jnp.uint32(0), axis=axis, emit_operand=True, k_splits=k_splits, _tile_source=source))
    f.trace(jax.ShapeDtypeStruct(shape, dtype)).lower(lowering_platforms=("cuda",))
  # NVIDIA's modes: the transformed amax, and tensor-scaled SR without RHT and RTN after it.
  spec = jax.ShapeDtypeStruct(shape, dtype)
  scale = jnp.float32(0.5)
  for f in (lambda v: transformed_amax(v, jnp.ones((16,)), axis=axis),
            lambda v: quantize_nvfp4_backward(v, None, jnp.uint32(0), axis=axis, tensor_scale=scale).codes,
            lambda v: quantize_nvfp4_backward(v, jnp.ones((16,)), None, axis=axis, rounding="nearest",
                                              tensor_scale=scale).codes):
    jax.jit(f).trace(spec).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("dtype,axis", [(jnp.float32, -1), (jnp.float32, 0), (jnp.bfloat16, -1), (jnp.bfloat16, 0)])
def test_lane_semantics_lowers_for_hopper(dtype, axis):
  """The same kernel under Mosaic GPU's lane semantics (no layout inference) lowers for CUDA on
  the CPU in TetraJet's and NVIDIA's modes, with both tile sources and the memory-ceiling variant."""
  shape = (256, 512) if axis == -1 else (512, 128)
  spec, scale, signs = jax.ShapeDtypeStruct(shape, dtype), jnp.float32(0.5), jnp.ones((16,))
  for f in (lambda v: quantize_nvfp4_backward(v, signs, jnp.uint32(0), axis=axis, emit_operand=True,
                                              _semantics="lane")[0].codes,
            lambda v: quantize_nvfp4_backward(v, signs, jnp.uint32(0), axis=axis, _tile_source="registers",
                                              _semantics="lane").codes,
            lambda v: quantize_nvfp4_backward(v, signs, jnp.uint32(0), axis=axis, _tile_source="blocks",
                                              _semantics="lane").codes,
            lambda v: quantize_nvfp4_backward(v, None, jnp.uint32(0), axis=axis, tensor_scale=scale,
                                              _semantics="lane").codes,
            lambda v: quantize_nvfp4_backward(v, signs, None, axis=axis, rounding="nearest", tensor_scale=scale,
                                              _semantics="lane").codes,
            lambda v: quantize_nvfp4_backward(v, signs, jnp.uint32(0), axis=axis, _math="none",
                                              _semantics="lane").codes):
    jax.jit(f).trace(spec).lower(lowering_platforms=("cuda",))


def test_rejects_bad_arguments():
  s, z = jnp.ones((16,)), jnp.uint32(0)
  with pytest.raises(ValueError, match="unknown lowering semantics 'thread'"):
    quantize_nvfp4_backward(jnp.zeros((64, 128)), s, z, _semantics="thread")
  with pytest.raises(ValueError, match="cols % 128"):
    quantize_nvfp4_backward(jnp.zeros((64, 100)), s, z, axis=-1)
  with pytest.raises(ValueError, match="rows % 64"):
    quantize_nvfp4_backward(jnp.zeros((32, 128)), s, z, axis=-1)
  with pytest.raises(ValueError, match="cols % 64"):
    quantize_nvfp4_backward(jnp.zeros((128, 32)), s, z, axis=0)
  with pytest.raises(ValueError, match="2-D"):
    quantize_nvfp4_backward(jnp.zeros((2, 64, 128)), s, z)
  with pytest.raises(ValueError, match="dtype"):
    quantize_nvfp4_backward(jnp.zeros((64, 128), jnp.float16), s, z)
  with pytest.raises(ValueError, match="signs_16"):
    quantize_nvfp4_backward(jnp.zeros((64, 128)), jnp.ones((8,)), z)
  with pytest.raises(ValueError, match="axis"):
    quantize_nvfp4_backward(jnp.zeros((64, 128)), s, z, axis=2)
  with pytest.raises(ValueError, match="block"):
    quantize_nvfp4_backward(jnp.zeros((64, 128)), s, z, block=32)
  with pytest.raises(ValueError, match="k_splits=3 must be a positive divisor"):
    quantize_nvfp4_backward(jnp.zeros((64, 512)), s, z, k_splits=3)
  with pytest.raises(ValueError, match="_tile_source='sram'"):
    quantize_nvfp4_backward(jnp.zeros((64, 128)), s, z, _tile_source="sram")


def test_can_use_backward_quantizer():
  if jax.default_backend() != "gpu":
    assert not can_use_pallas_backward_quantizer((1024, 1024), jnp.bfloat16)
  assert not can_use_pallas_backward_quantizer((1024, 100), jnp.bfloat16, axis=-1)
  assert not can_use_pallas_backward_quantizer((1024, 100), jnp.bfloat16, axis=0)
  assert not can_use_pallas_backward_quantizer((1024, 128), jnp.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,shape", [(jnp.bfloat16, (16384, 4096)), (jnp.float32, (4096, 4096)),
                                         (jnp.float32, (16384, 1024))])
def test_backward_quantizer_gpu(rng, key, dtype, shape):
  xl = hard_input(rng, shape, dtype, nonfinite=True)
  signs = hadamard_signs(key)
  sr_key = jax.random.fold_in(key, 99)
  seed = sr_seed(sr_key)
  f = jax.jit(lambda v: quantize_nvfp4_backward(v, signs, seed, axis=-1, emit_operand=True, emit_transformed=True))
  t, qs, y = f(xl)
  check_tensor(t, y, xl, key, sr_key, qs=qs)
  f0 = jax.jit(lambda v: quantize_nvfp4_backward(v, signs, seed, axis=0, emit_transformed=True))
  t0, y0 = f0(xl.T)
  np.testing.assert_array_equal(np.asarray(y0), np.asarray(y))
  np.testing.assert_array_equal(np.asarray(t0.codes), np.asarray(t.codes))
  for axis, x in ((-1, xl), (0, xl.T)):  # the register and block tile sources: the same bits as the SMEM one
    for source in ("registers", "blocks"):
      tr = jax.jit(lambda v, axis=axis, source=source: quantize_nvfp4_backward(
          v, signs, seed, axis=axis, emit_operand=True, _tile_source=source))(x)
      for a, b in zip(jax.tree.leaves(tr), jax.tree.leaves((t, qs)), strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
  assert can_use_pallas_backward_quantizer(shape, dtype, axis=-1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_lane_semantics_is_bitwise_the_default_gpu(rng, key, dtype):
  """Lowered under lane semantics, the kernel computes the same bits as under warpgroup semantics
  (the default): both axes, SR after the RHT, and NVIDIA's tensor-scaled RTN after it."""
  xl = hard_input(rng, (4096, 1024), dtype, nonfinite=True)
  signs, seed = hadamard_signs(key), sr_seed(jax.random.fold_in(key, 5))
  scale = jnp.float32(0.25)
  for axis, x in ((-1, xl), (0, xl.T)):
    for kw in (dict(seed=seed), dict(seed=None, rounding="nearest", tensor_scale=scale)):
      f = lambda v, sem, axis=axis, kw=kw: quantize_nvfp4_backward(v, signs, axis=axis, _semantics=sem, **kw)
      lane, default = jax.jit(lambda v: f(v, "lane"))(x), jax.jit(lambda v: f(v, "warpgroup"))(x)
      for a, b in zip(jax.tree.leaves(lane), jax.tree.leaves(default)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
  assert can_use_pallas_backward_quantizer(xl.T.shape, dtype, axis=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,shape", [(jnp.bfloat16, (16384, 1024)), (jnp.float32, (4096, 4096))])
def test_tensor_scaled_modes_gpu(rng, key, dtype, shape):
  xl = hard_input(rng, shape, dtype)
  sr_key = jax.random.fold_in(key, 5)
  for signs, rounding in ((None, "stochastic"), (hadamard_signs(key), "stochastic"), (hadamard_signs(key), "nearest")):
    for x, axis in ((xl, -1), (xl.T, 0)):
      check_tensor_scaled(x, signs, sr_key, axis=axis, rounding=rounding, interpret=False)


@pytest.mark.gpu
def test_sr_unbiased_gpu(rng, key):
  n = 65536
  row = rng.standard_normal(128).astype(np.float32) * 3.0
  x = jnp.asarray(np.tile(row, (n, 1)))
  t, y = jax.jit(lambda v: quantize_nvfp4_backward(v, hadamard_signs(key), jnp.uint32(5), emit_transformed=True))(x)
  _assert_sr_unbiased(t, y, n)
