"""Pallas RTN NVFP4 quantizer vs tetrajet_jax.numerics.quantize_nvfp4, bitwise.

CI: the kernel runs in Mosaic GPU's CPU interpreter (same kernel body: TMA
pipeline, SMEM, wgmma register layouts simulated) at small shapes. The
`gpu`-marked tests compile it with Mosaic GPU on the H200 at real shapes.
"""

from __future__ import annotations

import jax
import jax.experimental.mosaic.gpu.core as mosaic_core
import jax.numpy as jnp
import numpy as np
import pytest

from tests import numpy_reference as ref
from tetrajet_jax.kernels import can_use_pallas_quantizer, quantize_nvfp4_rtn, quantize_nvfp4_rtn_reference
from tetrajet_jax.numerics import nvfp4_bf16_operand, quantize_nvfp4, tensor_outer_scale, unpack_e2m1


def _bits(a):
  return np.atleast_1d(np.asarray(a)).view(np.uint8)


def assert_same_tensor(t, want):
  np.testing.assert_array_equal(_bits(t.codes), _bits(want.codes))
  np.testing.assert_array_equal(_bits(t.scale_inner), _bits(want.scale_inner))
  np.testing.assert_array_equal(_bits(t.scale_outer), _bits(want.scale_outer))
  assert (t.shape, t.axis, t.scaling, t.block_2d) == (want.shape, want.axis, want.scaling, want.block_2d)


def hard_input(rng, shape, dtype):
  """Wide dynamic range plus the edge cases of the scale rules."""
  x = rng.standard_normal(shape) * np.exp(2.0 * rng.standard_normal(shape))
  x[0, :128] = 0.0  # all-zero outer block: s_out = 1
  x[1, :16] = 1e-30  # sub-block far below the block max: s_in rounds to 0 -> 2^-9
  x[1, 16] = 1e4
  x[2, 128:256] = np.array([6.0, 5.0, 0.75, 0.25, 1.25, 2.5, 3.5, -1.75] * 16)  # RNE ties after scaling
  # Elements on and an ulp around the scaled decision points (x r near a tie):
  # a block whose max is 6 * 448 * s_out, so its inner scales are 448 * s_out.
  x[3, 128:256] = rng.choice([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 3.0], 128) * (1000.0 / 6.0)
  x[3, 128::16][:8] = 1000.0
  x = x.astype(np.float32)
  x[3, 128:256] = (x[3, 128:256].view(np.int32) + rng.integers(-1, 2, 128).astype(np.int32)).view(np.float32)
  return jnp.asarray(x).astype(dtype)


def assert_reference(t, x):
  """Codes and scales bitwise the NumPy reference's (the element rule written independently)."""
  codes, s_in, s_out = ref.nvfp4_block(np.asarray(jnp.asarray(x, jnp.float32)))
  np.testing.assert_array_equal(np.asarray(unpack_e2m1(t.codes)), codes)
  np.testing.assert_array_equal(np.asarray(t.scale_inner, np.float32), s_in)
  np.testing.assert_array_equal(np.asarray(t.scale_outer), s_out)


@pytest.mark.parametrize("k_splits", [1, 2])  # one CTA per row block, or the K loop cut in two
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rtn_bitwise_interpret(rng, dtype, k_splits):
  x = hard_input(rng, (64, 256), dtype)
  t, qs = quantize_nvfp4_rtn(x, emit_operand=True, k_splits=k_splits, interpret=True)
  want = quantize_nvfp4_rtn_reference(x)
  assert_same_tensor(t, want)
  np.testing.assert_array_equal(_bits(qs), _bits(nvfp4_bf16_operand(want)[0]))
  assert_reference(t, x)


def test_rtn_nonfinite_blocks_marked_nan_interpret(rng):
  x = np.array(hard_input(rng, (64, 256), jnp.float32))
  x[3, 5] = np.nan
  x[4, 200] = np.inf
  t = quantize_nvfp4_rtn(jnp.asarray(x), interpret=True)
  so = np.asarray(t.scale_outer)
  assert np.isnan(so[3, 0]) and np.isnan(so[4, 1])
  assert np.isfinite(so[3, 1]) and np.isfinite(so[4, 0])
  assert_same_tensor(t, quantize_nvfp4_rtn_reference(jnp.asarray(x)))
  assert_reference(t, x)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rtn_tensor_scaled_bitwise_interpret(rng, dtype):
  """NVIDIA's scaling: the caller's per-tensor scale, 1x16 E4M3 scales under it (the wide
  dynamic range of hard_input sends many 16-blocks to the smallest E4M3 scales)."""
  x = hard_input(rng, (64, 256), dtype)
  scale = tensor_outer_scale(jnp.max(jnp.abs(x.astype(jnp.float32))))
  t, qs = quantize_nvfp4_rtn(x, scale, emit_operand=True, k_splits=2, interpret=True)
  want = quantize_nvfp4(x, axis=-1, scaling="tensor")
  assert_same_tensor(t, want)
  np.testing.assert_array_equal(_bits(qs), _bits(nvfp4_bf16_operand(want)[0]))
  codes, s_in, s_out = ref.nvfp4_tensor(np.asarray(jnp.asarray(x, jnp.float32)))
  np.testing.assert_array_equal(np.asarray(unpack_e2m1(t.codes)), codes)
  np.testing.assert_array_equal(np.asarray(t.scale_inner, np.float32), s_in)
  np.testing.assert_array_equal(np.asarray(t.scale_outer), s_out)


def test_rtn_tensor_scale_must_be_a_float32_scalar():
  x = jnp.zeros((64, 128), jnp.float32)
  with pytest.raises(ValueError, match="tensor_scale must be a float32 scalar"):
    quantize_nvfp4_rtn(x, jnp.ones((1,), jnp.float32), interpret=True)


def test_rtn_rejects_bad_shapes():
  with pytest.raises(ValueError, match="K % 128"):
    quantize_nvfp4_rtn(jnp.zeros((64, 100), jnp.float32), interpret=True)
  with pytest.raises(ValueError, match="2-D"):
    quantize_nvfp4_rtn(jnp.zeros((2, 64, 128), jnp.float32), interpret=True)
  with pytest.raises(ValueError, match="pairs"):
    quantize_nvfp4_rtn(jnp.zeros((64, 128), jnp.float32), packing="pairs", interpret=True)
  with pytest.raises(ValueError, match="k_splits=3 must be a positive divisor"):
    quantize_nvfp4_rtn(jnp.zeros((64, 512), jnp.float32), k_splits=3, interpret=True)
  with pytest.raises(ValueError, match="unknown lowering semantics 'thread'"):
    quantize_nvfp4_rtn(jnp.zeros((64, 128), jnp.float32), _semantics="thread")


def test_can_use_is_false_off_hopper():
  if jax.default_backend() != "gpu":
    assert not can_use_pallas_quantizer((1024, 1024), jnp.bfloat16)
  assert not can_use_pallas_quantizer((1024, 100), jnp.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape", [(16384, 1024), (4096, 4096)])
def test_rtn_bitwise_gpu(rng, dtype, shape):
  x = hard_input(rng, shape, dtype)
  t, qs = jax.jit(lambda v: quantize_nvfp4_rtn(v, emit_operand=True))(x)
  want = jax.jit(quantize_nvfp4_rtn_reference)(x)
  assert_same_tensor(t, want)
  np.testing.assert_array_equal(_bits(qs), _bits(nvfp4_bf16_operand(want)[0]))
  assert_reference(t, x)
  assert can_use_pallas_quantizer(shape, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rtn_lane_semantics_is_bitwise_the_default_gpu(rng, dtype):
  """Lowered under lane semantics, the RTN kernel computes the same bits as under warpgroup
  semantics (the default), with its operand and under a tensor scale."""
  x = hard_input(rng, (4096, 1024), dtype)
  for scale in (None, jnp.float32(0.25)):
    f = lambda v, sem, scale=scale: quantize_nvfp4_rtn(v, scale, emit_operand=True, _semantics=sem)
    lane, default = jax.jit(lambda v: f(v, "lane"))(x), jax.jit(lambda v: f(v, "warpgroup"))(x)
    for a, b in zip(jax.tree.leaves(lane), jax.tree.leaves(default)):
      np.testing.assert_array_equal(_bits(a), _bits(b))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rtn_tensor_scaled_bitwise_gpu(rng, dtype):
  x = hard_input(rng, (16384, 1024), dtype)
  scale = tensor_outer_scale(jnp.max(jnp.abs(x.astype(jnp.float32))))
  t = jax.jit(quantize_nvfp4_rtn)(x, scale)
  assert_same_tensor(t, jax.jit(lambda v: quantize_nvfp4(v, axis=-1, scaling="tensor"))(x))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_rtn_lowers_for_hopper(dtype, monkeypatch, fresh_lowering_cache):
  """Mosaic GPU lowering for CUDA (layouts, supported ops: e.g. no boolean
  vector arithmetic in the exact division) succeeds on the CPU, and equal
  kernel instances in one computation are lowered once: three calls, two of
  them the same instance, lower two Mosaic modules."""
  modules = []
  lower_module = mosaic_core.lower_mgpu_module
  monkeypatch.setattr(mosaic_core, "lower_mgpu_module", lambda *a, **k: modules.append(1) or lower_module(*a, **k))
  rtn = lambda v, k_splits=None: quantize_nvfp4_rtn(v, emit_operand=True, k_splits=k_splits)[1]
  f = jax.jit(lambda a, b: (rtn(a), rtn(b), rtn(a, k_splits=4)))
  spec = jax.ShapeDtypeStruct((256, 512), dtype)
  f.trace(spec, spec).lower(lowering_platforms=("cuda",))
  assert len(modules) == 2
  # The tensor-scaled instance (NVIDIA's Q1) lowers too.
  jax.jit(lambda v: quantize_nvfp4_rtn(v, jnp.float32(0.5)).codes).trace(spec).lower(lowering_platforms=("cuda",))
  # Under lane semantics (no layout inference) too, double-block and tensor-scaled.
  for scale in (None, jnp.float32(0.5)):
    jax.jit(lambda v, scale=scale: quantize_nvfp4_rtn(v, scale, emit_operand=True, _semantics="lane")[0].codes).trace(
        spec).lower(lowering_platforms=("cuda",))


def test_semantics_from_the_environment_is_checked_at_import():
  """TETRAJET_QUANTIZER_SEMANTICS sets the kernels' default lowering semantics for a process; an
  unknown value stops the import with a message that names the choices."""
  import os
  import subprocess
  import sys

  probe = "from tetrajet_jax.kernels import _platform; print(_platform.DEFAULT_SEMANTICS)"
  run = lambda value: subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False,
                                     env={**os.environ, "TETRAJET_QUANTIZER_SEMANTICS": value})
  ok = run("lane")
  assert ok.returncode == 0 and ok.stdout.strip() == "lane", ok.stderr
  bad = run("thread")
  assert bad.returncode != 0 and "TETRAJET_QUANTIZER_SEMANTICS='thread': use one of warpgroup, lane" in bad.stderr
