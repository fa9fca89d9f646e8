"""Pallas Triton RTN NVFP4 quantizer vs tetrajet_jax.numerics.quantize_nvfp4, bitwise.

CI: the kernel body runs in Pallas's interpreter at small shapes, and lowers to
a Triton module for an sm_90 target (which catches operations Pallas Triton
cannot lower); the `gpu`-marked tests compile and run it on the GPU host.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_pallas_quantize import assert_reference, assert_same_tensor, hard_input
from tetrajet_jax.kernels import _platform
from tetrajet_jax.kernels.nvfp4_quantize_triton import quantize_nvfp4_rtn_triton
from tetrajet_jax.numerics import quantize_nvfp4


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


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rtn_triton_lowers_for_hopper(dtype):
  """Every operation of the kernel body has a Pallas Triton lowering for sm_90."""
  spec = jax.ShapeDtypeStruct((256, 512), dtype)
  with _platform.assume_hopper():
    text = jax.jit(quantize_nvfp4_rtn_triton).trace(spec).lower(lowering_platforms=("cuda",)).as_text()
  assert "__gpu$xla.gpu.triton" in text


@pytest.mark.parametrize("shape, dtype, block_rows, match", [
    ((4, 64, 128), jnp.float32, 32, "2-D"),
    ((64, 128), jnp.int32, 32, "dtype"),
    ((64, 200), jnp.float32, 32, "multiple of 128"),
    ((48, 128), jnp.float32, 32, "R % 32"),
    ((64, 128), jnp.float32, 24, "power of two"),
])
def test_rtn_triton_bad_input(shape, dtype, block_rows, match):
  with pytest.raises(ValueError, match=match):
    quantize_nvfp4_rtn_triton(jnp.zeros(shape, dtype), block_rows=block_rows, interpret=True)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16384, 1024), (4096, 4096)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rtn_triton_bitwise_gpu(rng, dtype, shape):
  x = _edge_input(rng, shape, dtype)
  t = jax.jit(quantize_nvfp4_rtn_triton)(x)
  assert_same_tensor(t, jax.jit(lambda v: quantize_nvfp4(v, axis=-1))(x))
  assert_reference(t, x)
