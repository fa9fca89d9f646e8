"""Pallas Triton NVFP4 quantizers (RTN; RHT + SR) vs the XLA path, bitwise.

The Triton backward quantizer runs the XLA RHT's operations in their order, so
unlike the Mosaic kernel (whose transform is a tensor-core product) it must
equal `quantize_nvfp4(random_hadamard_16(x))` bit for bit, transform included.

CI: the kernel bodies run in Pallas's interpreter at small shapes, and lower to
Triton modules for an sm_90 target (which catches operations Pallas Triton
cannot lower); the `gpu`-marked tests compile and run them on the GPU host.
"""

from __future__ import annotations

import dataclasses
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_pallas_quantize import assert_reference, assert_same_tensor, hard_input
from tetrajet_jax.kernels import _flat_rows, _platform
from tetrajet_jax.kernels.nvfp4_quantize_backward import quantize_nvfp4_backward_reference
from tetrajet_jax.kernels.nvfp4_quantize_triton import (quantize_nvfp4_backward_triton, quantize_nvfp4_rtn_triton,
                                                        requantize_nvfp4_backward_triton)
from tetrajet_jax.numerics import (NVFP4Operand, dequantize_nvfp4_canonical, hadamard_signs, nvfp4_bf16_operand,
                                   quantize_nvfp4, random_hadamard_16)
from tetrajet_jax.numerics.counter_rng import sr_seed


def _edge_input(rng, shape, dtype):
  """hard_input plus NaN, Inf and subnormal elements in their own blocks."""
  x = np.array(hard_input(rng, shape, jnp.float32))
  x[5, 3] = np.nan
  x[6, 200] = -np.inf
  x[7, 130] = 3e-40
  x[8, :16] = -0.0
  return jnp.asarray(x).astype(dtype)


@pytest.mark.parametrize("block_rows", [16, 32])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rtn_triton_bitwise_interpret(rng, dtype, block_rows):
  x = _edge_input(rng, (64, 256), dtype)
  t = quantize_nvfp4_rtn_triton(x, block_rows=block_rows, interpret=True)
  assert_same_tensor(t, quantize_nvfp4(x, axis=-1))
  so = np.asarray(t.scale_outer)
  assert np.isnan(so[5, 0]) and np.isnan(so[6, 1]) and np.isfinite(so[5, 1]) and np.isfinite(so[6, 0])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rtn_triton_matches_the_numpy_reference_interpret(rng, dtype):
  x = hard_input(rng, (32, 384), dtype)
  assert_reference(quantize_nvfp4_rtn_triton(x, block_rows=32, interpret=True), x)


def _backward_want(x, rht_key, sr_key, axis: int, stochastic: bool):
  """The XLA path's result, with the kernel's logical shape (axis 0 pads the tokens)."""
  if stochastic:
    want = quantize_nvfp4_backward_reference(x, rht_key, sr_key, axis=axis)
  else:
    xp = x if axis == -1 else jnp.pad(x, ((0, -x.shape[0] % 128), (0, 0)))
    want = quantize_nvfp4(random_hadamard_16(xp, rht_key, axis=axis), axis=axis)
  return dataclasses.replace(want, shape=x.shape)


@pytest.mark.parametrize("stochastic", [True, False])
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_backward_triton_bitwise_interpret(rng, key, dtype, axis, stochastic):
  """RHT + double-block scales + SR (or RTN), both axes; axis 0 with tokens not a multiple of 128
  (zero-padded); NaN, Inf and subnormal elements in their own blocks."""
  x = _edge_input(rng, (64, 256), dtype)
  x = x if axis == -1 else x.T[:200]
  rht_key, sr_key = jax.random.split(key)
  t = quantize_nvfp4_backward_triton(x, hadamard_signs(rht_key), sr_seed(sr_key) if stochastic else None,
                                     axis=axis, block_rows=16, interpret=True)
  assert t.shape == x.shape and t.axis == axis % 2
  assert_same_tensor(t, _backward_want(x, rht_key, sr_key, axis, stochastic))


@pytest.mark.parametrize("rows", [256, 200])
@pytest.mark.parametrize("stochastic", [True, False])
def test_requantize_from_codes_bitwise_interpret(rng, key, stochastic, rows):
  """Q6 read from Q1's codes and scales (X_hat never in memory) is the backward quantizer of the
  dequantized X_hat along tokens, and so the XLA path, bit for bit: NaN/Inf blocks (NaN X_hat),
  subnormal and zero blocks, and a crop of the rows to a count that is not a multiple of 128."""
  x = _edge_input(rng, (256, 256), jnp.bfloat16)
  t = quantize_nvfp4(x, axis=-1)
  x_hat = dequantize_nvfp4_canonical(t)[:rows]
  rht_key, sr_key = jax.random.split(key)
  seed = sr_seed(sr_key) if stochastic else None
  got = requantize_nvfp4_backward_triton(t, hadamard_signs(rht_key), seed, rows=rows, block_rows=16, interpret=True)
  assert got.shape == (rows, 256) and got.axis == 0
  assert_same_tensor(got, quantize_nvfp4_backward_triton(x_hat, hadamard_signs(rht_key), seed, axis=0,
                                                         block_rows=16, interpret=True))
  assert_same_tensor(got, _backward_want(x_hat, rht_key, sr_key, 0, stochastic))


def _assert_operand_of(op, t):
  """op (an NVFP4Operand) is t's bf16 GEMM operand and outer scales, bit for bit (NaN blocks as NaN)."""
  values, s_out = nvfp4_bf16_operand(t)
  assert isinstance(op, NVFP4Operand) and (op.shape, op.axis) == (t.shape, t.axis)
  assert op.values.dtype == jnp.bfloat16 and op.values.shape == values.shape
  np.testing.assert_array_equal(np.asarray(op.values.view(jnp.uint16)), np.asarray(values.view(jnp.uint16)))
  np.testing.assert_array_equal(np.asarray(op.scale_outer), np.asarray(s_out))


@pytest.mark.parametrize("stochastic", [True, False])
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_backward_triton_operand_is_the_gemm_operand_of_its_codes_interpret(rng, key, dtype, axis, stochastic):
  """operand=True writes q s_in in bfloat16 where the codes were: exactly what the GEMM decodes the
  codes to (signed zeros, NaN and Inf blocks included), in the canonical layout, with the same
  outer scales; the XLA fallback's values (`dequantize_nvfp4_canonical`) agree too."""
  x = _edge_input(rng, (64, 256), dtype)
  x = x if axis == -1 else x.T[:200]
  rht_key, sr_key = jax.random.split(key)
  args = (x, hadamard_signs(rht_key), sr_seed(sr_key) if stochastic else None)
  t = quantize_nvfp4_backward_triton(*args, axis=axis, block_rows=16, interpret=True)
  op = quantize_nvfp4_backward_triton(*args, axis=axis, block_rows=16, operand=True, interpret=True)
  _assert_operand_of(op, t)
  np.testing.assert_array_equal(np.asarray(dequantize_nvfp4_canonical(op)), np.asarray(dequantize_nvfp4_canonical(t)))


@pytest.mark.parametrize("stochastic", [True, False])
def test_requantize_operand_is_the_gemm_operand_of_its_codes_interpret(rng, key, stochastic):
  x = _edge_input(rng, (256, 256), jnp.bfloat16)
  t = quantize_nvfp4(x, axis=-1)
  rht_key, sr_key = jax.random.split(key)
  args = (t, hadamard_signs(rht_key), sr_seed(sr_key) if stochastic else None)
  _assert_operand_of(requantize_nvfp4_backward_triton(*args, rows=200, block_rows=16, operand=True, interpret=True),
                     requantize_nvfp4_backward_triton(*args, rows=200, block_rows=16, interpret=True))


def test_requantize_from_codes_bad_input(key):
  t = quantize_nvfp4(jnp.ones((64, 128)), axis=-1)
  signs = hadamard_signs(key)
  with pytest.raises(ValueError, match="rows=65 must be in"):
    requantize_nvfp4_backward_triton(t, signs, None, rows=65, interpret=True)
  with pytest.raises(ValueError, match="1x16 blocks"):
    requantize_nvfp4_backward_triton(quantize_nvfp4(jnp.ones((64, 128)), block_2d=True), signs, None, rows=64)
  with pytest.raises(ValueError, match="signs_16 must have shape"):
    requantize_nvfp4_backward_triton(t, signs[:8], None, rows=64, interpret=True)
  with pytest.raises(ValueError, match="block_rows=256 must be between 16 and 128"):
    requantize_nvfp4_backward_triton(quantize_nvfp4(jnp.ones((64, 256)), axis=-1), signs, None, rows=64,
                                     block_rows=256, interpret=True)


def test_backward_triton_seed_selects_the_bits_interpret(rng, key):
  x = hard_input(rng, (32, 256), jnp.float32)
  signs = hadamard_signs(key)
  a, b, c = (quantize_nvfp4_backward_triton(x, signs, s, block_rows=32, interpret=True) for s in (1, 1, 2))
  np.testing.assert_array_equal(np.asarray(a.codes), np.asarray(b.codes))
  assert np.mean(np.asarray(a.codes) != np.asarray(c.codes)) > 0.1
  np.testing.assert_array_equal(np.asarray(a.scale_inner, np.float32), np.asarray(c.scale_inner, np.float32))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_triton_kernels_lower_for_hopper(dtype):
  """Every operation of the kernel bodies has a Pallas Triton lowering for sm_90."""
  spec = jax.ShapeDtypeStruct((256, 512), dtype)
  signs = jnp.ones((16,), jnp.float32)
  fns = [quantize_nvfp4_rtn_triton, functools.partial(quantize_nvfp4_rtn_triton, flat_rows=True),
         lambda v: quantize_nvfp4_backward_triton(v, signs, jnp.uint32(3), flat_rows=True)] + [
      lambda v, axis=axis, seed=seed: quantize_nvfp4_backward_triton(v, signs, seed, axis=axis)
      for axis in (-1, 0) for seed in (jnp.uint32(3), None)] + [
      lambda v: requantize_nvfp4_backward_triton(quantize_nvfp4(v, axis=-1), signs, jnp.uint32(3), rows=200)] + [
      lambda v, axis=axis: quantize_nvfp4_backward_triton(v, signs, jnp.uint32(3), axis=axis, operand=True).values
      for axis in (-1, 0)] + [
      lambda v: requantize_nvfp4_backward_triton(quantize_nvfp4(v, axis=-1), signs, jnp.uint32(3), rows=200,
                                                 operand=True).values]
  with _platform.assume_hopper():
    for fn in fns:
      text = jax.jit(fn).trace(spec).lower(lowering_platforms=("cuda",)).as_text()
      assert "__gpu$xla.gpu.triton" in text


@pytest.mark.parametrize("shape, dtype, block_rows, match", [
    ((4, 64, 128), jnp.float32, 32, "2-D"),
    ((64, 128), jnp.int32, 32, "dtype"),
    ((64, 200), jnp.float32, 32, "multiple of 128"),
    ((48, 128), jnp.float32, 32, "rows % 32"),
    ((64, 128), jnp.float32, 24, "power of two"),
])
def test_rtn_triton_bad_input(shape, dtype, block_rows, match):
  with pytest.raises(ValueError, match=match):
    quantize_nvfp4_rtn_triton(jnp.zeros(shape, dtype), block_rows=block_rows, interpret=True)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rtn_triton_flat_rows_is_bitwise_interpret(rng, monkeypatch, dtype):
  """The flat view (a weight's [R, K] as padded 128-wide rows, R no multiple of the tile): the
  same tensor as quantize_nvfp4 and the unflattened kernel, and one instance for two shapes."""
  monkeypatch.setattr(_flat_rows, "MIN_BUCKET_ROWS", 64)
  x = _edge_input(rng, (40, 256), dtype)
  assert_same_tensor(quantize_nvfp4_rtn_triton(x, flat_rows=True, interpret=True), quantize_nvfp4(x, axis=-1))
  y = hard_input(rng, (30, 384), dtype)
  assert_same_tensor(quantize_nvfp4_rtn_triton(y, flat_rows=True, interpret=True), quantize_nvfp4(y, axis=-1))
  assert _flat_rows.to_flat(x).shape == _flat_rows.to_flat(y).shape == (128, 128)


@pytest.mark.parametrize("seeded", [True, False])
def test_backward_triton_flat_rows_is_bitwise_interpret(rng, key, monkeypatch, seeded):
  """The weights' flat view of the backward quantizer (axis -1, R no multiple of the tile): each
  flat row draws its original row's bits, so the result is the unflattened kernel's and the XLA
  path's, bit for bit."""
  monkeypatch.setattr(_flat_rows, "MIN_BUCKET_ROWS", 64)
  rht_key, sr_key = jax.random.split(key)
  x = _edge_input(rng, (40, 256), jnp.float32)
  seed = sr_seed(sr_key) if seeded else None
  flat = quantize_nvfp4_backward_triton(x, hadamard_signs(rht_key), seed, flat_rows=True, interpret=True)
  assert_same_tensor(flat, quantize_nvfp4_backward_triton(x, hadamard_signs(rht_key), seed, block_rows=8,
                                                          interpret=True))
  assert_same_tensor(flat, _backward_want(x, rht_key, sr_key, -1, seeded))
  with pytest.raises(ValueError, match="along the last axis"):
    quantize_nvfp4_backward_triton(x, hadamard_signs(rht_key), seed, axis=0, flat_rows=True, interpret=True)


@pytest.mark.parametrize("shape, dtype, match", [
    ((4, 64, 128), jnp.float32, "2-D"),
    ((64, 200), jnp.float32, "multiple of 128"),
    ((40, 256), jnp.int32, "dtype"),
])
def test_rtn_triton_flat_rows_bad_input(shape, dtype, match):
  with pytest.raises(ValueError, match=match):
    quantize_nvfp4_rtn_triton(jnp.zeros(shape, dtype), flat_rows=True, interpret=True)


@pytest.mark.parametrize("kwargs, match", [
    (dict(axis=2), "axis=2"),
    (dict(signs_16=jnp.ones((8,))), "shape \\(16,\\)"),
    (dict(seed=jnp.ones((2,), jnp.uint32)), "scalar"),
    (dict(x=jnp.zeros((64, 100), jnp.float32)), "multiple of 128"),
    (dict(x=jnp.zeros((100, 48), jnp.float32), axis=0), "cols % 32"),
])
def test_backward_triton_bad_input(kwargs, match):
  args = dict(x=jnp.zeros((64, 128), jnp.float32), signs_16=jnp.ones((16,)), seed=jnp.uint32(1)) | kwargs
  with pytest.raises(ValueError, match=match):
    quantize_nvfp4_backward_triton(args.pop("x"), args.pop("signs_16"), args.pop("seed"), interpret=True, **args)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16384, 1024), (4096, 4096)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rtn_triton_bitwise_gpu(rng, dtype, shape):
  x = _edge_input(rng, shape, dtype)
  t = jax.jit(quantize_nvfp4_rtn_triton)(x)
  assert_same_tensor(t, jax.jit(lambda v: quantize_nvfp4(v, axis=-1))(x))
  assert_reference(t, x)


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_backward_triton_operand_bitwise_gpu(rng, key, dtype, axis):
  """The compiled operand kernels (both axes, and Q6's from codes) write what the GEMM decodes the
  compiled codes kernels' output to, bit for bit."""
  x = _edge_input(rng, (4096, 4096), dtype)
  rht_key, sr_key = jax.random.split(key)
  signs, seed = hadamard_signs(rht_key), sr_seed(sr_key)
  fn = jax.jit(lambda v, s, operand: quantize_nvfp4_backward_triton(v, signs, s, axis=axis, operand=operand),
               static_argnums=2)
  _assert_operand_of(fn(x, seed, True), fn(x, seed, False))
  if axis == -1:
    t = quantize_nvfp4(x, axis=-1)
    fn = jax.jit(lambda s, operand: requantize_nvfp4_backward_triton(t, signs, s, rows=4000, operand=operand),
                 static_argnums=1)
    _assert_operand_of(fn(seed, True), fn(seed, False))


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_backward_triton_bitwise_gpu(rng, key, dtype, axis):
  x = _edge_input(rng, (4096, 4096), dtype)
  rht_key, sr_key = jax.random.split(key)
  signs, seed = hadamard_signs(rht_key), sr_seed(sr_key)
  for stochastic in (True, False):
    t = jax.jit(lambda v, s: quantize_nvfp4_backward_triton(v, signs, s, axis=axis))(x, seed if stochastic else None)
    assert_same_tensor(t, jax.jit(lambda v: _backward_want(v, rht_key, sr_key, axis, stochastic))(x))


def test_triton_isa_bench_lowers_each_kernel_to_one_triton_module():
  """`python -m experiments.bench triton-isa` hands each kernel's Triton IR to the triton package
  (not installed here): every case lowers to exactly one module with the kernel function, and the
  rendered table divides the static SASS count by the elements a thread holds."""
  from experiments.bench import triton_isa  # noqa: PLC0415

  cases = triton_isa.kernel_cases(["bfloat16", "float32"], [(16, 2)])
  assert [c[0] for c in cases] == ["triton rtn bfloat16 rows16_w2", "triton rht+sr bfloat16 axis=-1 rows16_w2",
                                   "triton rht+sr bfloat16 axis=0 rows16_w2", "triton rtn float32 rows16_w2",
                                   "triton rht+sr float32 axis=-1 rows16_w2", "triton rht+sr float32 axis=0 rows16_w2",
                                   "triton rht+sr from codes axis=0 rows16_w2"]
  for name, fn, warps, per_thread, dtype in cases:
    ttir = triton_isa.lower_to_ttir(fn, jax.ShapeDtypeStruct(triton_isa.SHAPE, dtype))
    assert "tt.func" in ttir and "tt.store" in ttir, name
    assert (warps, per_thread) == (2, 32)
  row = dict(name="k", sass=640, elements_per_thread=32, convert_layouts=2, shared_bytes=128, registers=56,
             spill_bytes=0, sass_by_class=dict(SHFL=6, BAR=3, CALL=10))
  assert triton_isa.table({"rows": [row]}).splitlines()[-1] == "| k | 20 | 2 | 128 | 56 | 0 | 6 | 3 | 10 |"
  for bad in ("16x2x2", "16", "16xw"):  # refused before anything is lowered or compiled
    with pytest.raises(SystemExit) as e:
      triton_isa.main(["--triton-python", sys.executable, "--tilings", f"32x4,{bad}"])
    assert e.value.code == 2


@pytest.mark.gpu
def test_requantize_from_codes_bitwise_gpu(rng, key):
  """Q6 from Q1's codes compiled for Hopper, at a 20m activation's shape with a token count that
  is not a multiple of 128: bitwise the XLA path on the dequantized X_hat."""
  x = _edge_input(rng, (4000, 1024), jnp.bfloat16)
  rht_key, sr_key = jax.random.split(key)
  signs, seed = hadamard_signs(rht_key), sr_seed(sr_key)
  t = jax.jit(lambda v: quantize_nvfp4(v, axis=-1))(x)
  got = jax.jit(lambda t: requantize_nvfp4_backward_triton(t, signs, seed, rows=3900))(t)
  want = jax.jit(lambda t: _backward_want(dequantize_nvfp4_canonical(t)[:3900], rht_key, sr_key, 0, True))(t)
  assert_same_tensor(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("tiling", [(16, 2), (64, 4)])
def test_triton_tilings_and_flat_views_bitwise_gpu(rng, key, tiling):
  """The bench's other tilings, and the weights' flat views (a 20m weight shape, default bucket),
  compiled on the GPU: bitwise the XLA path."""
  block_rows, num_warps = tiling
  rht_key, sr_key = jax.random.split(key)
  signs, seed = hadamard_signs(rht_key), sr_seed(sr_key)
  x = _edge_input(rng, (2048, 1024), jnp.bfloat16)
  for axis in (-1, 0):
    t = jax.jit(lambda v: quantize_nvfp4_backward_triton(v, signs, seed, axis=axis, block_rows=block_rows,
                                                         num_warps=num_warps))(x)
    assert_same_tensor(t, jax.jit(lambda v: _backward_want(v, rht_key, sr_key, axis, True))(x))
  assert_same_tensor(jax.jit(lambda v: quantize_nvfp4_rtn_triton(v, block_rows=block_rows, num_warps=num_warps))(x),
                     quantize_nvfp4(x, axis=-1))
  w = _edge_input(rng, (1536, 512), jnp.float32)
  assert_same_tensor(jax.jit(lambda v: quantize_nvfp4_rtn_triton(v, flat_rows=True))(w), quantize_nvfp4(w, axis=-1))
  flat = jax.jit(lambda v: quantize_nvfp4_backward_triton(v, signs, seed, flat_rows=True))(w)
  assert_same_tensor(flat, jax.jit(lambda v: _backward_want(v, rht_key, sr_key, -1, True))(w))
