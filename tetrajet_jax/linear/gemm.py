"""GEMM execution for quantized operands: C = A @ B^T over the shared last axis (`gemm_nt`),
and C = A^T @ B over the shared first axis for dense operands (`gemm_tn`).

Operands are NVFP4Tensor / MXFP8Tensor in canonical layout ([rows, Kp],
quantized along the last axis) or plain arrays [rows, K]. The backend (a
Recipe field) picks how the layer's quantizers and GEMMs execute:

  reference  Dequantize both operands to FP32 and multiply at full FP32
             precision (Precision.HIGHEST, so no TF32 on GPU). The test
             reference; quantizers on XLA.
  xla        bf16 tensor-core GEMM with FP32 accumulation (XLA). Products are
             exact wherever the operand is exact in bf16:
               * MXFP8: e4m3 * 2^e is exact in bf16;
               * NVFP4 with tensor scaling: q * s_in is exact in bf16 and the
                 two per-tensor FP32 scales multiply the FP32 result once;
               * NVFP4 with block scaling: q * s_in * s_out is rounded to bf16
                 (relative error <= 2^-9 per element, the same size as the
                 bf16 rounding of the output itself); applying s_out exactly
                 needs a promotion per 128-wide K chunk, which only the Pallas
                 kernel does efficiently. tests/test_linear.py measures the
                 deviation.
  pallas     The Pallas (Mosaic GPU) kernels of tetrajet_jax.kernels: the
             NVFP4 GEMM with exact products and per-128 promotion, the fused
             RTN forward quantizer and the fused RHT + SR backward quantizer,
             for every operation they cover. Raises BackendUnavailableError
             where a kernel cannot run (no Hopper GPU, unsupported shape).
  auto       (default) The Pallas kernels where `can_use_*` says they run,
             XLA elsewhere.

"pallas" and "auto" run the block-scaled quantizers on the Pallas Triton
kernels (`kernels.nvfp4_quantize_triton`; docs/KERNELS.md) under
TETRAJET_QUANTIZER_KERNELS=triton, the default; on the Mosaic ones under
mosaic; RTN on Triton and RHT + SR on Mosaic under triton_rtn. The bits are
the same.

Testing: `interpret_kernels(...)` runs the named kernels in Mosaic GPU's
interpreter on the CPU, as if the device could run them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator, Literal, Union

import jax
import jax.numpy as jnp
from jax import lax

from tetrajet_jax import kernels
from tetrajet_jax.linear.recipes import BACKENDS, Backend, Rounding, Scaling
from tetrajet_jax.numerics import (MXFP8Tensor, NVFP4Operand, NVFP4Tensor, counter_rng, dequantize_mxfp8_canonical,
                                   dequantize_nvfp4_canonical, hadamard_signs, nvfp4_bf16_operand,
                                   tensor_outer_scale)
from tetrajet_jax.numerics.checks import pad_axis_to_multiple
from tetrajet_jax.numerics.nvfp4 import OUTER_BLOCK

KERNELS = ("rtn", "backward", "gemm")  # names for interpret_kernels
Operand = Union[NVFP4Tensor, NVFP4Operand, MXFP8Tensor, jax.Array]

_interpreted: frozenset[str] = frozenset()


class BackendUnavailableError(ValueError):
  """backend="pallas" was asked for an operation whose kernel cannot run here."""


def check_backend(backend: str) -> None:
  if backend not in BACKENDS:
    raise ValueError(f"Unknown backend {backend!r}; use one of {', '.join(BACKENDS)}.")


@contextlib.contextmanager
def interpret_kernels(*names: str) -> Iterator[None]:
  """Runs the named Pallas kernels ("rtn", "backward", "gemm"; default all) in
  Mosaic GPU's interpreter on the CPU, as if this device could run them, for
  computations traced inside the context (testing: the real kernel bodies
  inside the layer without a Hopper GPU). The kernels' own shape checks still
  apply. Kernels not named keep the device's answer.
  """
  global _interpreted
  names = names or KERNELS
  for n in names:
    if n not in KERNELS:
      raise ValueError(f"interpret_kernels: unknown kernel {n!r}; use some of {', '.join(KERNELS)}.")
  before, _interpreted = _interpreted, _interpreted | frozenset(names)
  try:
    yield
  finally:
    _interpreted = before


def interpreted() -> frozenset[str]:
  """The kernels interpret_kernels currently runs in the interpreter."""
  return _interpreted


def _padded_k(op: Operand) -> int:
  if isinstance(op, (NVFP4Tensor, NVFP4Operand)):
    return kernels.operand_rows_and_k(op)[1]
  if isinstance(op, MXFP8Tensor):
    return op.data.shape[-1]
  return op.shape[-1]


def _dense(op: Operand, dtype) -> jax.Array:
  """The operand's values as a dense [rows, Kp] array of `dtype`."""
  if isinstance(op, (NVFP4Tensor, NVFP4Operand)):
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


def _kernel_runs(name: str, can_use: bool, backend: Backend, what: str) -> bool:
  """Whether to run kernel `name`: interpreted, or the device can (`can_use`).
  backend="pallas" raises where it cannot; "auto" falls back; others never run it."""
  if backend not in ("auto", "pallas"):
    return False
  if name in _interpreted or can_use:
    return True
  if backend == "pallas":
    raise _unavailable(what)
  return False


def _unavailable(what: str) -> BackendUnavailableError:
  return BackendUnavailableError(
      f"backend='pallas': the Pallas {what} cannot run here (it needs a Hopper GPU, sm_90, and a supported "
      f"shape; device {jax.devices()[0].device_kind!r}). Use backend='auto' to fall back to XLA where the "
      "kernels do not run, or backend='xla'.")


def _unsupported(backend: Backend, what: str) -> None:
  """An operand no kernel takes on any device: None (XLA) unless backend="pallas", which raises
  BackendUnavailableError (interpreted or not)."""
  if backend == "pallas":
    raise _unavailable(what)
  return None


def _interpret(name: str) -> dict:
  return {"interpret": True} if name in _interpreted else {}


def _triton_quantizers(scaling: Scaling, kind: Literal["rtn", "backward"]) -> bool:
  """Whether a block-scaled quantizer runs on the Triton kernels (`kernels.triton_quantizer`, set by
  TETRAJET_QUANTIZER_KERNELS); tensor scaling always runs on the Mosaic ones."""
  return scaling == "block" and kernels.triton_quantizer(kind)


def rtn_quantize(x: jax.Array, backend: Backend, *, scaling: Scaling = "block",
                 flat_rows: bool = False) -> NVFP4Tensor | None:
  """The fused Pallas RTN quantizer along x's last axis where the backend
  runs it, bitwise equal to quantize_nvfp4(x, axis=-1, scaling=scaling); else
  None (XLA).

  Block scaling: a last axis that is not a multiple of 128 (OutControl's FP4
  channels, K - round(0.1 K)) is zero-padded first, as the XLA quantizer pads
  it internally: zeros change no scale, and the result carries x's shape.
  Tensor scaling: XLA reduces the tensor's amax first (no CTA sees the whole
  tensor); the XLA quantizer pads K only to 16 there, so a K that is not a
  multiple of 128 stays on XLA (the GEMM needs both operands padded alike).
  flat_rows (the weights): the kernel's flat view, one instance for every small tensor
  (`kernels.quantize_nvfp4_rtn`); the same result.
  """
  tensor = scaling == "tensor"
  if tensor and x.shape[-1] % OUTER_BLOCK:
    return _unsupported(backend, f"tensor-scaled RTN quantizer for {x.dtype}{x.shape} (K % 128 != 0)")
  padded_shape = (*x.shape[:-1], -(-x.shape[-1] // OUTER_BLOCK) * OUTER_BLOCK)
  triton = _triton_quantizers(scaling, "rtn")
  can = backend in ("auto", "pallas") and (kernels.can_use_triton_quantizer(padded_shape, x.dtype) if triton
                                           else kernels.can_use_pallas_quantizer(padded_shape, x.dtype))
  if not _kernel_runs("rtn", can, backend, f"{'Triton ' if triton else ''}RTN quantizer for {x.dtype}{x.shape}"):
    return None
  xp = pad_axis_to_multiple(x, x.ndim - 1, OUTER_BLOCK)
  if triton:
    t = kernels.quantize_nvfp4_rtn_triton(xp, flat_rows=flat_rows and x.ndim == 2, **_interpret("rtn"))
  else:
    scale = tensor_outer_scale(jnp.max(jnp.abs(x)).astype(jnp.float32)) if tensor else None
    t = kernels.quantize_nvfp4_rtn(xp, tensor_scale=scale, flat_rows=flat_rows and x.ndim == 2, **_interpret("rtn"))
  return t if padded_shape == x.shape else dataclasses.replace(t, shape=tuple(x.shape))


def gemm_operands() -> bool:
  """Whether the backward quantizers write the backward GEMMs' bf16 operands (`NVFP4Operand`) where
  the Triton kernels run (TETRAJET_BACKWARD_OPERANDS=bf16, `kernels._platform`) instead of codes."""
  return kernels.backward_operands() == "bf16"


def backward_quantize(x: jax.Array, rht_key: jax.Array | None, sr_key: jax.Array | None, *, axis: int,
                      rounding: Rounding = "stochastic", scaling: Scaling = "block",
                      backend: Backend, flat_rows: bool = False,
                      operand: bool = False) -> NVFP4Tensor | NVFP4Operand | None:
  """The fused Pallas backward quantizer (RHT-16 if rht_key is given, NVFP4
  scales, stochastic rounding or RTN, in one pass) where the backend runs it,
  else None (XLA).

  Same transform, scales and random bits as quantize_nvfp4(random_hadamard_16(x,
  rht_key, axis=axis), rounding=rounding, key=sr_key, scaling=scaling): both
  draw from the counter-based generator (numerics.counter_rng) seeded with
  sr_seed(sr_key), so the codes agree bitwise wherever the transformed values
  do (the kernel's transform differs from the XLA butterfly only in FP32
  accumulation order; without RHT they are x itself). Tensor scaling first
  takes the amax of the transformed values (`kernels.transformed_amax`, or an
  XLA reduction of |x| without RHT). flat_rows (the weights, along the last axis): the
  kernel's flat view, one instance for every small tensor; the same result. operand: where the
  Triton kernel runs (without flat_rows), its bf16 GEMM operand (`NVFP4Operand`) in place of codes.
  """
  what = (f"{'RHT + ' if rht_key is not None else ''}{rounding} {scaling}-scaled quantizer for {x.dtype}{x.shape} "
          f"along axis {axis}")
  triton = _triton_quantizers(scaling, "backward") and rht_key is not None
  can = backend in ("auto", "pallas") and (
      kernels.can_use_triton_quantizer(x.shape, x.dtype, axis=axis) if triton
      else kernels.can_use_pallas_backward_quantizer(x.shape, x.dtype, axis=axis))
  if not _kernel_runs("backward", can, backend, ("Triton " if triton else "") + what):
    return None
  signs = None if rht_key is None else hadamard_signs(rht_key)
  seed = counter_rng.sr_seed(sr_key) if rounding == "stochastic" else None
  if triton:
    flat = flat_rows and axis in (-1, 1)
    return kernels.quantize_nvfp4_backward_triton(x, signs, seed, axis=axis, flat_rows=flat,
                                                  operand=operand and not flat, **_interpret("backward"))
  scale = None
  if scaling == "tensor":
    amax = (jnp.max(jnp.abs(x)).astype(jnp.float32) if signs is None
            else kernels.transformed_amax(x, signs, axis=axis, **_interpret("backward")))
    scale = tensor_outer_scale(amax)
  return kernels.quantize_nvfp4_backward(x, signs, seed, axis=axis, rounding=rounding, tensor_scale=scale,
                                         flat_rows=flat_rows and axis in (-1, 1), **_interpret("backward"))


def backward_requantize(t: NVFP4Tensor, rows: int, rht_key: jax.Array, sr_key: jax.Array, *,
                        rounding: Rounding = "stochastic", backend: Backend,
                        operand: bool = False) -> NVFP4Tensor | NVFP4Operand | None:
  """backward_quantize(dequantize_nvfp4_canonical(t)[:rows], rht_key, sr_key, axis=0) read straight
  from t's codes and scales by the Triton kernel, so no float32 X_hat passes through memory (Q6 of
  the aligned recipes). None where that kernel does not run here: the caller then dequantizes and
  calls backward_quantize, which applies the backend's rules. operand: as backward_quantize's."""
  if backend not in ("auto", "pallas") or t.codes.ndim != 2 or t.block_2d or not _triton_quantizers(t.scaling,
                                                                                                    "backward"):
    return None
  k = 2 * t.codes.shape[1]
  if not ("backward" in _interpreted or kernels.can_use_triton_quantizer((rows, k), jnp.float32, axis=0)):
    return None
  seed = counter_rng.sr_seed(sr_key) if rounding == "stochastic" else None
  return kernels.requantize_nvfp4_backward_triton(t, hadamard_signs(rht_key), seed, rows=rows, operand=operand,
                                                  **_interpret("backward"))


def gemm_nt(a: Operand, b: Operand, *, backend: Backend = "xla", out_dtype=jnp.bfloat16,
            extra: tuple[Operand, Operand] | None = None) -> jax.Array:
  """C[i, j] = sum_k A[i, k] B[j, k] with FP32 accumulation, cast to out_dtype.

  extra: (A2, B2), MXFP8 or dense operands of their own reduction length whose
  product joins the same FP32 sum before the one cast (OutControl's outlier
  channels). The Pallas GEMM takes them as more K chunks of outer scale 1; XLA adds
  a second product.

  Raises:
    BackendUnavailableError: backend="pallas", two NVFP4 operands, and the
      Pallas GEMM cannot run them here.
  """
  check_backend(backend)
  k = max(_padded_k(a), _padded_k(b))
  both_fp4 = all(isinstance(op, (NVFP4Tensor, NVFP4Operand)) for op in (a, b))
  if both_fp4:
    config = kernels.layer_gemm_config(kernels.operand_rows_and_k(a)[0], kernels.operand_rows_and_k(b)[0])
    can = backend in ("auto", "pallas") and kernels.can_use_nvfp4_gemm(a, b, config=config)
    if _kernel_runs("gemm", can, backend, f"NVFP4 GEMM for {a.shape} x {b.shape}^T"):
      dense_extra = None if extra is None else tuple(_dense(op, jnp.bfloat16) for op in extra)
      return kernels.nvfp4_gemm(a, b, extra=dense_extra, out_dtype=out_dtype, config=config, **_interpret("gemm"))
  if extra is not None:
    out = gemm_nt(a, b, backend=backend, out_dtype=jnp.float32) + gemm_nt(*extra, backend=backend,
                                                                            out_dtype=jnp.float32)
    return out.astype(out_dtype)
  if backend == "reference":
    out = _dot_nt(_pad_k(_dense(a, jnp.float32), k), _pad_k(_dense(b, jnp.float32), k),
                  precision=lax.Precision.HIGHEST)
    return out.astype(out_dtype)
  if both_fp4 and getattr(a, "scaling", "block") == "tensor" and getattr(b, "scaling", "block") == "tensor":
    qa, sa = nvfp4_bf16_operand(a)
    qb, sb = nvfp4_bf16_operand(b)
    out = _dot_nt(_pad_k(qa, k), _pad_k(qb, k)) * (sa * sb)
    return out.astype(out_dtype)
  out = _dot_nt(_pad_k(_dense(a, jnp.bfloat16), k), _pad_k(_dense(b, jnp.bfloat16), k))
  return out.astype(out_dtype)


def gemm_tn(a: jax.Array, b: jax.Array, *, backend: Backend = "xla", out_dtype=jnp.float32) -> jax.Array:
  """C[i, j] = sum_m A[m, i] B[m, j] of dense operands whose values are exact in bf16
  (MXFP8 values: e4m3 * 2^e), FP32 accumulation, cast to out_dtype. The reduction
  axis is the first of both, where the weight gradient's operands already have it:
  no transposed copy. backend="reference" multiplies in FP32 at full precision."""
  check_backend(backend)
  exact = backend == "reference"
  dtype = jnp.float32 if exact else jnp.bfloat16
  out = lax.dot_general(a.astype(dtype), b.astype(dtype), (((0,), (0,)), ((), ())),
                        precision=lax.Precision.HIGHEST if exact else None, preferred_element_type=jnp.float32)
  return out.astype(out_dtype)
