"""GEMM execution for quantized operands: C = A @ B^T over the shared last axis.

Operands are NVFP4Tensor / MXFP8Tensor in canonical layout ([rows, Kp],
quantized along the last axis) or plain arrays [rows, K]. Modes:

  exact   Dequantize both operands to FP32 and multiply at full FP32
          precision (Precision.HIGHEST, so no TF32 on GPU). The reference.
  fast    bf16 tensor-core GEMM with FP32 accumulation (XLA). Products are
          exact wherever the operand is exact in bf16:
            * MXFP8: e4m3 * 2^e is exact in bf16;
            * NVFP4 with tensor scaling: q * s_in is exact in bf16 and the two
              per-tensor FP32 scales multiply the FP32 result once;
            * NVFP4 with block scaling: q * s_in * s_out is rounded to bf16
              (relative error <= 2^-9 per element, the same size as the bf16
              rounding of the output itself); applying s_out exactly needs a
              promotion per 128-wide K chunk, which only the Pallas kernel
              does efficiently. tests/test_linear.py measures the deviation.
  pallas  The Pallas (Mosaic GPU) NVFP4 GEMM with exact products and per-128
          promotion when `pallas_kernels` can run the shapes on this
          backend; otherwise falls back to `fast`. In this mode the linear
          layer also uses the fused Pallas quantizers (RTN forward,
          RHT + SR backward) where they run.
"""

from __future__ import annotations

import functools
from typing import Literal, Union

import jax
import jax.numpy as jnp
from jax import lax

from tetrajet_jax.numerics import (MXFP8Tensor, NVFP4Tensor, counter_rng, dequantize_mxfp8_canonical,
                                   dequantize_nvfp4_canonical, hadamard_signs, nvfp4_bf16_operand)

GemmMode = Literal["exact", "fast", "pallas"]
GEMM_MODES = ("exact", "fast", "pallas")
Operand = Union[NVFP4Tensor, MXFP8Tensor, jax.Array]


def check_gemm_mode(gemm: str) -> None:
  if gemm not in GEMM_MODES:
    raise ValueError(f"Unknown gemm mode {gemm!r}; use one of {', '.join(GEMM_MODES)}.")


def _padded_k(op: Operand) -> int:
  if isinstance(op, NVFP4Tensor):
    return op.codes.shape[-1] * 2
  if isinstance(op, MXFP8Tensor):
    return op.data.shape[-1]
  return op.shape[-1]


def _dense(op: Operand, dtype) -> jax.Array:
  """The operand's values as a dense [rows, Kp] array of `dtype`."""
  if isinstance(op, NVFP4Tensor):
    if op.ndim != 2:
      raise ValueError(f"gemm: NVFP4 operands must be 2-D, got logical shape {op.shape}.")
    return dequantize_nvfp4_canonical(op, dtype)
  if isinstance(op, MXFP8Tensor):
    return dequantize_mxfp8_canonical(op, dtype)
  return op.astype(dtype)


def _pad_k(x: jax.Array, k: int) -> jax.Array:
  if x.shape[-1] == k:
    return x
  return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, k - x.shape[-1])])


def _dot_nt(a: jax.Array, b: jax.Array, precision=None) -> jax.Array:
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=precision,
                         preferred_element_type=jnp.float32)


@functools.cache
def _pallas_kernels():
  """The pallas_kernels package, or None where it is not importable (no Mosaic GPU)."""
  try:
    import pallas_kernels  # noqa: PLC0415 (optional: only gemm="pallas" needs it)
  except ImportError:
    return None
  return pallas_kernels


def pallas_rtn_quantize(x: jax.Array) -> NVFP4Tensor | None:
  """The fused Pallas RTN quantizer along x's last axis where it runs (Hopper,
  supported shape), bitwise equal to quantize_nvfp4(x, axis=-1); else None."""
  kernels = _pallas_kernels()
  if kernels is None or not kernels.can_use_pallas_quantizer(x.shape, x.dtype):
    return None
  return kernels.quantize_nvfp4_rtn(x)


def pallas_rht_sr_quantize(x: jax.Array, rht_key: jax.Array, sr_key: jax.Array, *,
                           axis: int) -> NVFP4Tensor | None:
  """The fused Pallas backward quantizer (RHT-16 + double-block scales + SR in
  one pass) where it runs (Hopper, supported shape), else None.

  Same transform, scales and random bits as quantize_nvfp4(random_hadamard_16(x,
  rht_key, axis=axis), rounding="stochastic", key=sr_key): both draw from the
  counter-based generator (numerics.counter_rng) seeded with sr_seed(sr_key),
  so the codes agree bitwise wherever the transformed values do (the kernel's
  transform differs from the XLA butterfly only in FP32 accumulation order).
  """
  kernels = _pallas_kernels()
  if kernels is None or not kernels.can_use_pallas_backward_quantizer(x.shape, x.dtype, axis=axis):
    return None
  return kernels.quantize_nvfp4_rht_sr(x, hadamard_signs(rht_key), counter_rng.sr_seed(sr_key), axis=axis)


def gemm_nt(a: Operand, b: Operand, *, mode: GemmMode = "fast", out_dtype=jnp.bfloat16) -> jax.Array:
  """C[i, j] = sum_k A[i, k] B[j, k] with FP32 accumulation, cast to out_dtype."""
  check_gemm_mode(mode)
  k = max(_padded_k(a), _padded_k(b))
  both_fp4 = isinstance(a, NVFP4Tensor) and isinstance(b, NVFP4Tensor)
  if mode == "pallas" and both_fp4:
    kernels = _pallas_kernels()
    if kernels is not None and kernels.can_use_nvfp4_gemm(a, b):
      return kernels.nvfp4_gemm(a, b, out_dtype=out_dtype)
  if mode == "exact":
    out = _dot_nt(_pad_k(_dense(a, jnp.float32), k), _pad_k(_dense(b, jnp.float32), k),
                  precision=lax.Precision.HIGHEST)
    return out.astype(out_dtype)
  if both_fp4 and a.scaling == "tensor" and b.scaling == "tensor":
    qa, sa = nvfp4_bf16_operand(a)
    qb, sb = nvfp4_bf16_operand(b)
    out = _dot_nt(_pad_k(qa, k), _pad_k(qb, k)) * (sa * sb)
    return out.astype(out_dtype)
  out = _dot_nt(_pad_k(_dense(a, jnp.bfloat16), k), _pad_k(_dense(b, jnp.bfloat16), k))
  return out.astype(out_dtype)
