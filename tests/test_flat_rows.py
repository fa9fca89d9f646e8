"""The kernels' flat view (`flat_rows=True`): [R, K] quantized as padded 128-wide rows.

Bitwise the unflattened kernel and the XLA quantizer (codes, scales, SR bits), in Mosaic GPU's
interpreter on the CPU with a small bucket (the default bucket, 8192 rows, is too slow to
interpret); lowered for Hopper on the CPU, every weight shape of a bucket is one kernel instance
(Mosaic module or Triton kernel).
"""

from __future__ import annotations

import jax
import jax.experimental.mosaic.gpu.core as mosaic_core
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_pallas_quantize import assert_reference, assert_same_tensor, hard_input
from tetrajet_jax.kernels import _flat_rows, _platform, quantize_nvfp4_backward, quantize_nvfp4_rtn
from tetrajet_jax.linear import gemm as gemm_lib
from tetrajet_jax.numerics import hadamard_signs, nvfp4_bf16_operand, quantize_nvfp4, tensor_outer_scale
from tetrajet_jax.numerics.counter_rng import element_bits, high_bits, low_bits, pair_hash, sr_seed


@pytest.fixture
def small_bucket(monkeypatch):
  monkeypatch.setattr(_flat_rows, "MIN_BUCKET_ROWS", 64)


def test_bucket_rows_are_powers_of_two_from_the_minimum():
  b = _flat_rows.MIN_BUCKET_ROWS
  assert [_flat_rows.bucket_rows(n) for n in (1, b - 1, b, b + 1, 3 * b)] == [b, b, b, 2 * b, 4 * b]


def test_flat_rows_draw_the_bits_of_the_original_rows(small_bucket):
  """Flat row i = r K/128 + j with row r's key and pair offset 64 j hashes to exactly the bits
  `element_bits` gives element (r, 128 j + c) of the [R, K] tensor; padding rows hold zeros."""
  shape, seed = (5, 384), np.uint32(123456789)
  ko = np.asarray(_flat_rows.row_keys_and_offsets(seed, shape))
  n = shape[0] * shape[1] // 128
  assert ko.shape == (2, _flat_rows.bucket_rows(n)) and not ko[:, n:].any()
  h = pair_hash(jnp.asarray(ko[0, :n, None]), jnp.asarray(ko[1, :n, None]) + jnp.arange(64, dtype=jnp.uint32))
  flat_bits = np.stack([np.asarray(low_bits(h)), np.asarray(high_bits(h))], axis=-1).reshape(n, 128)
  np.testing.assert_array_equal(flat_bits, np.asarray(element_bits(seed, shape)).reshape(n, 128))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rtn_flat_rows_is_bitwise_interpret(rng, small_bucket, dtype):
  """Rows that are no multiple of the tile (R = 40) and several 128-blocks per row: the same
  tensor as quantize_nvfp4 and the NumPy reference, and the same bf16 operand."""
  x = hard_input(rng, (40, 256), dtype)
  t, qs = quantize_nvfp4_rtn(x, emit_operand=True, flat_rows=True, interpret=True)
  assert_same_tensor(t, quantize_nvfp4(x, axis=-1))
  assert_reference(t, x)
  np.testing.assert_array_equal(np.asarray(qs, np.float32), np.asarray(nvfp4_bf16_operand(t)[0], np.float32))
  scale = tensor_outer_scale(jnp.max(jnp.abs(x.astype(jnp.float32))))
  assert_same_tensor(quantize_nvfp4_rtn(x, scale, flat_rows=True, interpret=True),
                     quantize_nvfp4(x, axis=-1, scaling="tensor"))


@pytest.mark.parametrize("seeded", [True, False])  # RHT + SR, or RHT + RTN
def test_backward_flat_rows_is_bitwise_the_unflattened_kernel_interpret(rng, key, small_bucket, seeded):
  """Same codes, scales (SR: the same random bits) and emitted operand as the kernel on [R, K]."""
  x = hard_input(rng, (64, 256), jnp.float32)
  signs, seed = hadamard_signs(key), (sr_seed(jax.random.fold_in(key, 1)) if seeded else None)
  rounding = "stochastic" if seeded else "nearest"
  flat, qs_flat = quantize_nvfp4_backward(x, signs, seed, rounding=rounding, emit_operand=True, flat_rows=True,
                                          interpret=True)
  want, qs = quantize_nvfp4_backward(x, signs, seed, rounding=rounding, emit_operand=True, interpret=True)
  assert_same_tensor(flat, want)
  np.testing.assert_array_equal(np.asarray(qs_flat, np.float32), np.asarray(qs, np.float32))


def test_flat_rows_rejects_what_it_cannot_view():
  x = jnp.ones((64, 200), jnp.float32)
  with pytest.raises(ValueError, match="multiple of 128"):
    quantize_nvfp4_rtn(x, flat_rows=True)
  with pytest.raises(ValueError, match="multiple of 128"):
    quantize_nvfp4_backward(x, None, None, rounding="nearest", flat_rows=True)
  with pytest.raises(ValueError, match="along the last axis"):
    quantize_nvfp4_backward(jnp.ones((64, 256)), None, None, rounding="nearest", axis=0, flat_rows=True)


@pytest.mark.parametrize("family", ["mosaic", "triton"])
def test_weights_of_every_shape_share_one_kernel_instance(monkeypatch, fresh_lowering_cache, family):
  """Lowered for Hopper on the CPU: the layer's weight quantizers (Q2: RTN of W^T; Q4: RHT + SR of
  W_hat along N) on three weight shapes lower one kernel each in the flat view, three each without
  it, on either kernel family (TETRAJET_QUANTIZER_KERNELS; here the module setting)."""
  from jax._src.pallas.triton import pallas_call_registration  # noqa: PLC0415

  monkeypatch.setattr(_platform, "QUANTIZER_KERNELS", family)
  modules = []
  if family == "mosaic":
    lower_module = mosaic_core.lower_mgpu_module
    monkeypatch.setattr(mosaic_core, "lower_mgpu_module", lambda *a, **k: modules.append(1) or lower_module(*a, **k))
  else:
    triton_lowering = pallas_call_registration.lowering
    lower_module = triton_lowering.lower_jaxpr_to_triton_module
    monkeypatch.setattr(triton_lowering, "lower_jaxpr_to_triton_module",
                        lambda *a, **k: modules.append(1) or lower_module(*a, **k))
  key = jax.random.key(0)

  def quantizers(flat):
    def f(*ws):
      out = []
      for w in ws:
        out.append(gemm_lib.rtn_quantize(w.T, "pallas", flat_rows=flat).codes)
        out.append(gemm_lib.backward_quantize(w, key, key, axis=-1, backend="pallas", flat_rows=flat).codes)
      return out
    return jax.jit(f)

  shapes = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((384, 1152), (384, 2048), (1024, 384))]
  with _platform.assume_hopper():
    for flat, want in ((True, 2), (False, 6)):
      modules.clear()
      quantizers(flat).trace(*shapes).lower(lowering_platforms=("cuda",))
      assert len(modules) == want, (flat, len(modules))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(384, 1152), (1024, 384), (512, 2048)])  # weights of the 20m and 70m models
def test_flat_rows_at_the_default_bucket_gpu(rng, key, shape):
  """On the GPU, compiled: RTN (Q2) and RHT + SR (Q4) of a weight in the flat view are bitwise the
  unflattened kernels' (and RTN the XLA quantizer's)."""
  w = jnp.asarray(rng.standard_normal(shape), jnp.float32)
  rtn = jax.jit(lambda v, flat: quantize_nvfp4_rtn(v, flat_rows=flat), static_argnums=1)
  assert_same_tensor(rtn(w, True), rtn(w, False))
  assert_same_tensor(rtn(w, True), quantize_nvfp4(w, axis=-1))
  signs, seed = hadamard_signs(key), sr_seed(key)
  bwd = jax.jit(lambda v, flat: quantize_nvfp4_backward(v, signs, seed, flat_rows=flat), static_argnums=1)
  assert_same_tensor(bwd(w, True), bwd(w, False))
