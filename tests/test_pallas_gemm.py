"""Pallas block-scaled NVFP4 GEMM vs the dequantize-then-matmul reference.

Tolerance: FP32 accumulation order only. Products q*s_in are exact in bf16,
so the kernel and the float64 reference differ by FP32 rounding of the
partial sums; 1e-5 of the output's max magnitude is a hundred times that
level, while skipping the per-chunk promotion (e.g. one scale per row) or
mixing up chunks gives errors of order 1.
CI: Mosaic GPU's CPU interpreter (wgmma, TMA and the warp-specialized
pipeline simulated) at small shapes; `gpu`: compiled on the H200.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tetrajet_jax.kernels import (GemmConfig, block_scaled_bf16_gemm, can_use_nvfp4_gemm, can_use_pallas_gemm,
                            nvfp4_gemm)
from tetrajet_jax.kernels import _platform
from tetrajet_jax.kernels.nvfp4_gemm import OVERLAP_CONFIG, WIDE_CONFIG, gemm_k_splits
from tetrajet_jax.numerics import NVFP4Operand, dequantize_nvfp4_canonical, nvfp4_bf16_operand, quantize_nvfp4

SMALL = GemmConfig(tile_m=64, tile_n=64, grid_tile_width=1)
PAIRED = dataclasses.replace(SMALL, cluster_m=True)  # 2-CTA clusters sharing B tiles
HALF_STEPS = dataclasses.replace(SMALL, k_step=64, max_concurrent_steps=4)  # two pipeline steps per chunk
ROW_GROUPS = GemmConfig(tile_m=128, tile_n=64, mma_rows=64, grid_tile_width=1)  # two wgmmas per warpgroup step
# The tilings beside the default that the kernel bench times on the GPU.
GPU_CONFIGS = {"single": GemmConfig(), "pairs": GemmConfig(cluster_m=True),
               "half_steps": GemmConfig(k_step=64, max_concurrent_steps=4),
               "half_steps_pairs": GemmConfig(k_step=64, max_concurrent_steps=4, cluster_m=True),
               "wide_row_groups": WIDE_CONFIG, "overlap": OVERLAP_CONFIG}


def operands(rng, m, k, n, scaling="block"):
  # Per-row, per-block magnitudes spanning ~e^+-6 so outer scales differ per chunk.
  a = rng.standard_normal((m, k)) * np.exp(2.0 * rng.standard_normal((m, k // 128)).repeat(128, 1))
  b = rng.standard_normal((n, k)) * np.exp(rng.standard_normal((n, k // 128)).repeat(128, 1))
  return (quantize_nvfp4(jnp.asarray(a, jnp.float32), axis=-1, scaling=scaling),
          quantize_nvfp4(jnp.asarray(b, jnp.float32), axis=-1, scaling=scaling))


def reference64(a, b):
  a_hat = np.asarray(dequantize_nvfp4_canonical(a), np.float64)
  b_hat = np.asarray(dequantize_nvfp4_canonical(b), np.float64)
  return a_hat @ b_hat.T


def rel_err(out, ref):
  return float(np.max(np.abs(np.asarray(out, np.float64) - ref)) / np.max(np.abs(ref)))


@pytest.mark.parametrize("scaling", ["block", "tensor"])
def test_gemm_matches_reference_interpret(rng, scaling):
  a, b = operands(rng, 128, 384, 256, scaling)
  out = nvfp4_gemm(a, b, out_dtype=jnp.float32, config=SMALL, interpret=True)
  assert out.shape == (128, 256) and out.dtype == jnp.float32
  assert rel_err(out, reference64(a, b)) < 1e-5


def test_gemm_promotion_is_per_chunk_interpret(rng):
  """A kernel that applied one chunk's scales to all chunks would fail here."""
  a, b = operands(rng, 128, 256, 128)
  ref = reference64(a, b)
  out = nvfp4_gemm(a, b, out_dtype=jnp.float32, config=SMALL, interpret=True)
  a_qs = np.asarray(dequantize_nvfp4_canonical(a), np.float64) / np.asarray(a.scale_outer).repeat(128, 1)
  b_qs = np.asarray(dequantize_nvfp4_canonical(b), np.float64) / np.asarray(b.scale_outer).repeat(128, 1)
  wrong = (a_qs @ b_qs.T) * np.outer(np.asarray(a.scale_outer)[:, 0], np.asarray(b.scale_outer)[:, 0])
  assert rel_err(wrong, ref) > 1e-2  # the test data can tell the two apart
  assert rel_err(out, ref) < 1e-5


def test_gemm_takes_quantizer_operands_bitwise_interpret(rng):
  """An NVFP4Operand (the bf16 q s_in a quantizer kernel writes in place of codes) is the operand
  the GEMM decodes the codes to: the same output bit for bit, mixed with an NVFP4Tensor too; and
  the checks apply to it (K must match)."""
  a, b = operands(rng, 128, 384, 256)
  as_operand = lambda t: NVFP4Operand(*nvfp4_bf16_operand(t), shape=t.shape, axis=t.axis)
  want = np.asarray(nvfp4_gemm(a, b, out_dtype=jnp.float32, config=SMALL, interpret=True))
  for x, y in ((as_operand(a), as_operand(b)), (as_operand(a), b)):
    assert can_use_nvfp4_gemm(x, y) == can_use_nvfp4_gemm(a, b)
    np.testing.assert_array_equal(np.asarray(nvfp4_gemm(x, y, out_dtype=jnp.float32, config=SMALL, interpret=True)),
                                  want)
  c = quantize_nvfp4(jnp.ones((256, 256), jnp.float32), axis=-1)
  with pytest.raises(ValueError, match="padded K differs"):
    nvfp4_gemm(as_operand(a), as_operand(c), config=SMALL, interpret=True)


@pytest.mark.parametrize("k_splits", [2, 4])
def test_gemm_split_k_interpret(rng, k_splits):
  """K cut into parts, each an FP32 partial over its own chunks, summed: the same product (to
  FP32 order) with every chunk's own scales; a split that dropped or repeated a part, or took
  another part's scales, would be off by order 1."""
  a, b = operands(rng, 64, 512, 128)
  ref = reference64(a, b)
  out = nvfp4_gemm(a, b, out_dtype=jnp.float32, config=SMALL, k_splits=k_splits, interpret=True)
  assert out.shape == (64, 128) and out.dtype == jnp.float32
  assert rel_err(out, ref) < 1e-5
  out_bf16 = nvfp4_gemm(a, b, config=SMALL, k_splits=k_splits, interpret=True)
  np.testing.assert_allclose(np.asarray(out_bf16, np.float64), ref, rtol=2**-8, atol=1e-30)


def test_gemm_k_splits_fill_the_sms():
  with _platform.assume_hopper(132):  # the H200
    # Weight gradients of the 20m model over 32768 tokens (256 chunks; CTA tiles of 128 x 128):
    assert gemm_k_splits(384, 384, 32768) == 8  # 9 tiles: 72 work items (16 would make 144 > 132)
    assert gemm_k_splits(384, 2048, 32768) == 2  # 48 tiles: 96
    assert gemm_k_splits(1024, 384, 32768) == 4  # 24 tiles: 96
    assert gemm_k_splits(32768, 384, 384) == 1  # a forward GEMM: 768 tiles fill the SMs alone
    assert gemm_k_splits(128, 128, 512) == 1  # 4 chunks: no part would keep 4
  if jax.default_backend() == "cpu":  # the pretence ends with the block
    assert not _platform.hopper_available() and _platform.num_sms(False) == 2
  a, b = operands(np.random.default_rng(0), 64, 512, 128)
  with pytest.raises(ValueError, match="k_splits=3 must be a positive divisor"):
    nvfp4_gemm(a, b, config=SMALL, k_splits=3, interpret=True)


def test_gemm_bf16_output_interpret(rng):
  a, b = operands(rng, 128, 128, 128)
  out = nvfp4_gemm(a, b, config=SMALL, interpret=True)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out, np.float64), reference64(a, b), rtol=2**-8, atol=1e-30)


@pytest.mark.parametrize("n_extra", [38, 160])
def test_gemm_extra_chunks_join_the_sum_interpret(rng, n_extra):
  """OutControl's outlier product (MXFP8 values, exact in bf16) as extra K chunks of outer scale
  1: one FP32 sum with the FP4 product, rounded once. 160 columns take two extra chunks; a kernel
  that dropped or scaled them, or rounded the FP4 part to bf16 first, would fail."""
  from tetrajet_jax.numerics import dequantize_mxfp8_canonical, quantize_mxfp8  # noqa: PLC0415

  a, b = operands(rng, 128, 256, 128)
  xa = quantize_mxfp8(jnp.asarray(rng.standard_normal((128, n_extra)) * 300, jnp.float32))
  xb = quantize_mxfp8(jnp.asarray(rng.standard_normal((128, n_extra)), jnp.float32))
  va, vb = (np.asarray(dequantize_mxfp8_canonical(t), np.float64) for t in (xa, xb))
  extra = tuple(dequantize_mxfp8_canonical(t, jnp.bfloat16) for t in (xa, xb))
  ref = reference64(a, b) + va @ vb.T
  assert rel_err(reference64(a, b), ref) > 1e-2  # the extra product is not negligible here
  out = nvfp4_gemm(a, b, extra=extra, out_dtype=jnp.float32, config=SMALL, interpret=True)
  assert rel_err(out, ref) < 1e-5
  out_bf16 = nvfp4_gemm(a, b, extra=extra, config=SMALL, interpret=True)
  np.testing.assert_array_equal(np.asarray(out_bf16), np.asarray(out.astype(jnp.bfloat16)))
  with pytest.raises(ValueError, match="extra operand b must be"):
    nvfp4_gemm(a, b, extra=(extra[0], extra[1][:64]), config=SMALL, interpret=True)


def test_gemm_rejects_bad_operands(rng):
  a, b = operands(rng, 128, 128, 128)
  with pytest.raises(ValueError, match=r"multiples of \(256, 128\), the CTA tile"):
    nvfp4_gemm(a, b, config=GemmConfig(tile_m=256, tile_n=64), interpret=True)
  a3 = quantize_nvfp4(jnp.ones((128, 256)), axis=-1)
  with pytest.raises(ValueError, match="padded K differs"):
    nvfp4_gemm(a3, b, config=SMALL, interpret=True)
  with pytest.raises(ValueError, match="16x16 blocks"):
    nvfp4_gemm(quantize_nvfp4(jnp.ones((128, 128)), axis=-1, block_2d=True), b, config=SMALL, interpret=True)
  with pytest.raises(ValueError, match="bfloat16"):
    block_scaled_bf16_gemm(jnp.ones((128, 128)), 1.0, jnp.ones((128, 128)), 1.0, config=SMALL, interpret=True)
  with pytest.raises(ValueError, match="multiples of 64"):
    GemmConfig(tile_m=96)
  with pytest.raises(ValueError, match="k_step=32 must be 128 or 64"):
    GemmConfig(k_step=32)


def test_gemm_axis0_operand_is_the_transpose_interpret(rng):
  """quantize_nvfp4(y, axis=0) is the operand y^T (canonical layout), as the dW GEMM uses it."""
  y = jnp.asarray(rng.standard_normal((256, 128)), jnp.float32)  # [K, M]: quantized along K = axis 0
  a = quantize_nvfp4(y, axis=0)
  b = quantize_nvfp4(jnp.asarray(rng.standard_normal((128, 256)), jnp.float32), axis=-1)
  out = nvfp4_gemm(a, b, out_dtype=jnp.float32, config=SMALL, interpret=True)
  assert out.shape == (128, 128)
  assert rel_err(out, reference64(a, b)) < 1e-5


@pytest.mark.parametrize("k_splits", [1, 2])
@pytest.mark.parametrize("config", [PAIRED, HALF_STEPS, dataclasses.replace(HALF_STEPS, cluster_m=True)],
                         ids=["pairs", "half_steps", "both"])
def test_gemm_tilings_interpret(rng, config, k_splits):
  """CTA pairs that share each B tile through one multicast load (cluster_m), and 64-wide K steps
  (two per promotion chunk): the same product. A pair that computed the same rows twice or took
  the other CTA's scales, or a half step promoted with the next chunk's scales, would be off by
  order 1 (the operands' outer scales differ by e^+-6 between chunks)."""
  a, b = operands(rng, 256, 512, 128)
  out = nvfp4_gemm(a, b, out_dtype=jnp.float32, config=config, k_splits=k_splits, interpret=True)
  assert rel_err(out, reference64(a, b)) < 1e-5


@pytest.mark.parametrize("k_splits", [1, 2])
def test_gemm_row_groups_are_bitwise_one_wgmma_interpret(rng, k_splits):
  """mma_rows=64 on a 128-row warpgroup tile: two wgmmas per step, each promoted into its own
  running sum, give the bits of one wgmma over the tile (every output element sums the same
  products in the same order); a group that took the other group's rows or outer scales would be
  off by order 1. Also through the epilogue of a 64 x 64 sub-tile per group."""
  a, b = operands(rng, 256, 512, 128)
  one = dataclasses.replace(ROW_GROUPS, mma_rows=None)
  out = nvfp4_gemm(a, b, out_dtype=jnp.float32, config=ROW_GROUPS, k_splits=k_splits, interpret=True)
  np.testing.assert_array_equal(np.asarray(out),
                                np.asarray(nvfp4_gemm(a, b, out_dtype=jnp.float32, config=one, k_splits=k_splits,
                                                      interpret=True)))
  assert rel_err(out, reference64(a, b)) < 1e-5
  for bad in (dict(mma_rows=96), dict(tile_m=64, mma_rows=128), dict(epi_tile_m=128, mma_rows=64, tile_m=256)):
    with pytest.raises(ValueError, match="mma_rows="):
      dataclasses.replace(ROW_GROUPS, **bad)


@pytest.mark.parametrize("k_splits", [1, 2])
@pytest.mark.parametrize("config", [SMALL, HALF_STEPS, dataclasses.replace(ROW_GROUPS, mma_rows=None)],
                         ids=["one_chunk_steps", "half_steps", "rows128"])
def test_gemm_overlapped_promotion_is_bitwise_interpret(rng, config, k_splits):
  """overlap_promotion: each partial promoted one step later, while the next wgmma runs, with the
  scales it was loaded with, and the last one after the pipeline: the bits of the default order. A
  partial promoted with the next step's scales, or a last partial never promoted, is off by order 1."""
  a, b = operands(rng, 256, 512, 128)
  out = nvfp4_gemm(a, b, out_dtype=jnp.float32, config=dataclasses.replace(config, overlap_promotion=True),
                   k_splits=k_splits, interpret=True)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(nvfp4_gemm(a, b, out_dtype=jnp.float32, config=config,
                                                                       k_splits=k_splits, interpret=True)))
  assert rel_err(out, reference64(a, b)) < 1e-5
  with pytest.raises(ValueError, match="overlap_promotion needs one row group"):
    dataclasses.replace(ROW_GROUPS, overlap_promotion=True)


def test_gemm_cta_pairs_need_rows_for_both():
  """M must cover whole pairs of row tiles: a typed error before any compute, and can_use says no."""
  a, b = operands(np.random.default_rng(1), 64, 256, 128)
  with pytest.raises(ValueError, match=r"multiples of \(128, 128\)"):
    nvfp4_gemm(a, b, config=PAIRED, interpret=True)
  with _platform.assume_hopper(132):
    assert can_use_pallas_gemm(64, 128, 256, config=SMALL)
    assert not can_use_pallas_gemm(64, 128, 256, config=PAIRED)
    assert can_use_pallas_gemm(128, 128, 256, config=PAIRED)


@pytest.mark.parametrize("name", list(GPU_CONFIGS))
def test_gemm_lowers_for_hopper(name):
  """The kernel lowers to a Mosaic GPU module for an sm_90 target (the multicast specs of a CTA pair
  included), on a host without a GPU."""
  spec = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype)
  config = GPU_CONFIGS[name]
  assert config.smem_bytes() <= 227 * 1024
  with _platform.assume_hopper(132):
    f = jax.jit(lambda a, sa, b, sb: block_scaled_bf16_gemm(a, sa, b, sb, config=config, k_splits=1))
    text = f.trace(spec(1024, 512), spec(1024, 4, dtype=jnp.float32), spec(512, 512),
                   spec(512, 4, dtype=jnp.float32)).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text


def test_can_use_pallas_gemm_shapes():
  if jax.default_backend() != "gpu":
    assert not can_use_pallas_gemm(8192, 8192, 8192)
    assert not can_use_nvfp4_gemm(quantize_nvfp4(jnp.ones((256, 256))), quantize_nvfp4(jnp.ones((256, 256))))
  assert not can_use_pallas_gemm(8192, 8192, 100)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_CONFIGS))
@pytest.mark.parametrize("mkn", [(2048, 1024, 3072), (1024, 4096, 1024), (4096, 2048, 8192)])
def test_gemm_matches_reference_gpu(rng, mkn, name):
  m, k, n = mkn
  config = GPU_CONFIGS[name]
  a, b = operands(rng, m, k, n)
  out = jax.jit(lambda a, b: nvfp4_gemm(a, b, out_dtype=jnp.float32, config=config))(a, b)
  assert rel_err(out, reference64(a, b)) < 1e-5
  assert can_use_pallas_gemm(m, n, k, config=config) and can_use_nvfp4_gemm(a, b, config=config)


@pytest.mark.gpu
def test_gemm_extra_chunks_gpu(rng):
  """The outlier chunks compiled for Hopper: 102 MXFP8 channels beside a [4096, 1024] x [1024, 2048] GEMM."""
  from tetrajet_jax.numerics import dequantize_mxfp8_canonical, quantize_mxfp8  # noqa: PLC0415

  a, b = operands(rng, 4096, 1024, 2048)
  xa, xb = (quantize_mxfp8(jnp.asarray(rng.standard_normal((r, 102)) * 300, jnp.float32)) for r in (4096, 2048))
  va, vb = (np.asarray(dequantize_mxfp8_canonical(t), np.float64) for t in (xa, xb))
  extra = tuple(dequantize_mxfp8_canonical(t, jnp.bfloat16) for t in (xa, xb))
  out = jax.jit(lambda a, b, e: nvfp4_gemm(a, b, extra=e, out_dtype=jnp.float32))(a, b, extra)
  assert rel_err(out, reference64(a, b) + va @ vb.T) < 1e-5
