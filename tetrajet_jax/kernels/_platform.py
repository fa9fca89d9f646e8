"""Capability probe and interpret-mode plumbing shared by the kernels.

Every kernel here targets Hopper (sm_90): Mosaic GPU (wgmma, TMA), and Pallas
Triton for `nvfp4_quantize_triton`. Elsewhere the callers fall back to the XLA
path; `interpret=True` runs the same kernel body on CPU, in Mosaic GPU's
interpreter (JAX 0.11's `InterpretGPUParams`, which simulates SMEM, TMA,
barriers, warpgroups and wgmma) or Pallas's generic one for Triton, so CI
exercises the real kernel code, not a re-implementation of it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import typing
from typing import Literal

import jax
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax._src.pallas.triton import gpu_info as triton_gpu_info  # what `assume_hopper` stands in for


# Compiler parameters of the quantizer kernels. Pallas brackets every SMEM store with two
# warpgroup barriers by default (four per inner block in `quantize_tile`), which stalls the
# four warps on each other in a loop that is latency-bound. The kernels need none of them:
# every SMEM buffer they write is either written before a `commit_smem` (fence + warpgroup
# barrier) that precedes every read of it by another thread or by TMA/wgmma, or rewritten
# only after a `wait_smem_to_gmem` (which also ends in a warpgroup barrier); the wgmma
# operand buffer is rewritten only after `wgmma_wait`, which returns once the whole
# warpgroup's MMA has read it. Scale stores from the row layout write equal values.
#
# Lowering semantics: "warpgroup" (Pallas's default in JAX 0.11) runs Mosaic GPU's layout
# inference, about half of the kernels' lowering time; "lane" skips it, as every value the
# kernels compute already has an explicit layout. Lane is bitwise the same on the H200 and
# lowers a 20m step's kernels in 6.8 s instead of 10.2 s, but its kernels run 8-15% slower
# (RHT + SR 0.378 against 0.328 ms; the step 0.72x bf16 against 0.75x; docs/notes/kernels.md),
# so warpgroup stays the default and lane a knob (`_semantics`, or the environment below).
Semantics = Literal["warpgroup", "lane"]
_SEMANTICS = {"warpgroup": plgpu.LoweringSemantics.Warpgroup, "lane": plgpu.LoweringSemantics.Lane}
# The kernels' default, read once at import: TETRAJET_QUANTIZER_SEMANTICS=lane selects lane for a
# whole process (`experiments.bench train --quantizer-semantics` sets it in its worker processes).
SEMANTICS_ENV = "TETRAJET_QUANTIZER_SEMANTICS"
DEFAULT_SEMANTICS: Semantics = os.environ.get(SEMANTICS_ENV, "warpgroup")  # type: ignore[assignment]
if DEFAULT_SEMANTICS not in _SEMANTICS:
  raise ValueError(f"{SEMANTICS_ENV}={DEFAULT_SEMANTICS!r}: use one of {', '.join(_SEMANTICS)}.")


# Which kernels the layer's block-scaled quantizers run on: "triton" (the default:
# `nvfp4_quantize_triton` for RTN and for RHT + SR, the faster family on an H100 for both, and the
# faster compile), "mosaic" (the Mosaic GPU kernels) or "triton_rtn" (Triton's RTN, Mosaic's
# RHT + SR). All three give the same bits. Tensor scaling and the RHT-free backward quantizer stay
# on Mosaic. Read once at import, like the semantics above; `linear.gemm` asks
# `triton_quantizer(kind)` when it traces a quantizer.
QuantizerKernels = Literal["mosaic", "triton", "triton_rtn"]
QUANTIZER_KERNELS_ENV = "TETRAJET_QUANTIZER_KERNELS"
QUANTIZER_KERNELS: QuantizerKernels = os.environ.get(QUANTIZER_KERNELS_ENV, "triton")  # type: ignore[assignment]
if QUANTIZER_KERNELS not in typing.get_args(QuantizerKernels):
  raise ValueError(f"{QUANTIZER_KERNELS_ENV}={QUANTIZER_KERNELS!r}: "
                   f"use one of {', '.join(typing.get_args(QuantizerKernels))}.")


# The tiles of the layer's NVFP4 GEMMs (`nvfp4_gemm.layer_gemm_config`): "narrow" (the default,
# 128 x 64 per compute warpgroup, m64n64 wgmmas), "overlap" (the narrow tiles, each partial promoted
# while the next wgmma runs: the narrow bits) or "wide" (128 x 128 per warpgroup as 64-row m64n128
# wgmmas, 64-wide K steps) where the output's rows and columns tile by it, narrow elsewhere. The
# products are the same; the 64-wide steps change the FP32 summation order. Read once at import.
GemmTiling = Literal["narrow", "overlap", "wide"]
GEMM_TILING_ENV = "TETRAJET_GEMM_TILING"
GEMM_TILING: GemmTiling = os.environ.get(GEMM_TILING_ENV, "narrow")  # type: ignore[assignment]
if GEMM_TILING not in typing.get_args(GemmTiling):
  raise ValueError(f"{GEMM_TILING_ENV}={GEMM_TILING!r}: use one of {', '.join(typing.get_args(GemmTiling))}.")


# What the layer's backward quantizers hand the backward GEMMs where the Triton kernels run: "codes"
# (the default: packed codes and scales, decoded to the GEMM's bf16 operand by an XLA pass) or "bf16"
# (the kernel writes that operand, q * s_in in bfloat16, itself: `numerics.NVFP4Operand`, no decode
# pass, 2 bytes written per element where codes take 0.56). The same products. Read once at import.
BackwardOperands = Literal["codes", "bf16"]
BACKWARD_OPERANDS_ENV = "TETRAJET_BACKWARD_OPERANDS"
BACKWARD_OPERANDS: BackwardOperands = os.environ.get(BACKWARD_OPERANDS_ENV, "codes")  # type: ignore[assignment]
if BACKWARD_OPERANDS not in typing.get_args(BackwardOperands):
  raise ValueError(f"{BACKWARD_OPERANDS_ENV}={BACKWARD_OPERANDS!r}: "
                   f"use one of {', '.join(typing.get_args(BackwardOperands))}.")


def backward_operands() -> BackwardOperands:
  """What the backward quantizers hand the backward GEMMs in this process (see BACKWARD_OPERANDS)."""
  return BACKWARD_OPERANDS


def gemm_tiling() -> GemmTiling:
  """The tiling family of the layer's NVFP4 GEMMs in this process (see GEMM_TILING)."""
  return GEMM_TILING


def quantizer_kernels() -> QuantizerKernels:
  """The kernels the layer's block-scaled quantizers run on (see QUANTIZER_KERNELS)."""
  return QUANTIZER_KERNELS


def triton_quantizer(kind: Literal["rtn", "backward"]) -> bool:
  """Whether the block-scaled `kind` quantizer (RTN, or the RHT + SR backward one) runs on the
  Triton kernels under this process's QUANTIZER_KERNELS."""
  return QUANTIZER_KERNELS == "triton" or (QUANTIZER_KERNELS == "triton_rtn" and kind == "rtn")


def quantizer_params(semantics: Semantics = DEFAULT_SEMANTICS) -> plgpu.CompilerParams:
  """The quantizer kernels' compiler parameters (see above)."""
  if semantics not in _SEMANTICS:
    raise ValueError(f"unknown lowering semantics {semantics!r}; use one of {', '.join(_SEMANTICS)}.")
  return plgpu.CompilerParams(unsafe_no_auto_barriers=True, lowering_semantics=_SEMANTICS[semantics])


# Set by `assume_hopper`: the SM count of the Hopper GPU a lowering-only process pretends to have.
_assumed_sms: int | None = None


def hopper_available() -> bool:
  """True when the default JAX device is a CUDA GPU of compute capability 9.x (or `assume_hopper`)."""
  return _assumed_sms is not None or _device_is_hopper()


@functools.lru_cache(maxsize=None)
def _device_is_hopper() -> bool:
  try:
    dev = jax.devices()[0]
  except RuntimeError:
    return False
  if dev.platform != "gpu":
    return False
  cc = str(getattr(dev, "compute_capability", ""))
  return cc.startswith("9.")


def num_sms(interpret: bool) -> int:
  """Streaming multiprocessors to launch persistent grids over (2 when interpreting)."""
  if interpret:
    return 2
  if _assumed_sms is not None:
    return _assumed_sms
  return int(jax.devices()[0].core_count) if _device_is_hopper() else 2


@contextlib.contextmanager
def assume_hopper(sms: int = 132):
  """For lowering only: inside, the layer's dispatch takes the device for a Hopper GPU with
  `sms` SMs (132: H100 SXM, H200), so a whole train step can be lowered for CUDA
  (`.lower(lowering_platforms=("cuda",))`) with its kernels on a host without one, e.g. to
  time Mosaic lowering (`python -m experiments.bench lowering --steps`). Nothing built
  inside may run. Kernel wrappers traced earlier in the process keep the SM count they saw."""
  global _assumed_sms  # pylint: disable=global-statement
  before, _assumed_sms = _assumed_sms, sms
  # Pallas Triton reads the target's compute capability from a device while lowering.
  triton_info, get_info = triton_gpu_info, triton_gpu_info.get_gpu_info
  hopper = triton_info._get_gpu_info_impl(triton_info.GpuVersion.H100)  # pylint: disable=protected-access
  triton_info.get_gpu_info = lambda: hopper
  try:
    yield
  finally:
    _assumed_sms = before
    triton_info.get_gpu_info = get_info


def one_lowering_per_instance(*static_argnames: str):
  """Decorator: `jax.jit` with the kernel's options static. Every call with the
  same shapes and options inside one traced computation then shares one jaxpr,
  so JAX lowers the Mosaic GPU module (seconds of Python each: module emission
  and layout inference) once per distinct kernel instance, not once per call
  site (a layer's forward and its rematerialized copy, linears of equal shape)."""
  return functools.partial(jax.jit, static_argnames=static_argnames)


def interpret_context(interpret: bool):
  """Context manager that runs Mosaic GPU kernels traced inside it on the CPU interpreter."""
  if not interpret:
    return contextlib.nullcontext()
  return plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams())


def interpret_params(interpret: bool):
  """The `interpret=` argument of pl.pallas_call: GPU interpreter params, or False."""
  return plgpu.InterpretGPUParams() if interpret else False


def k_splits(row_blocks: int, k_blocks: int, interpret: bool, requested: int | None = None) -> int:
  """CTAs per row block along the quantized axis for the quantizer kernels.

  Every 128-block is independent, so the K loop can be cut into equal parts,
  one CTA each. With one CTA per row block, a short canonical row count
  starves the GPU (X^T of a 16384 x 1024 activation is 16 row blocks: 16 of
  132 SMs busy). The default is the fewest parts (a divisor of k_blocks) that
  give every SM four CTAs: two are resident at a time (shared memory), and
  more, shorter CTAs shrink the last, partly filled wave (docs/notes/kernels.md);
  `requested` forces a count (it must divide k_blocks).
  """
  if requested is not None:
    if requested <= 0 or k_blocks % requested:
      raise ValueError(f"k_splits={requested} must be a positive divisor of the {k_blocks} blocks of 128 "
                       "along the quantized axis.")
    return requested
  target = 4 * num_sms(interpret)
  for s in range(1, k_blocks + 1):
    if k_blocks % s == 0 and row_blocks * s >= target:
      return s
  return k_blocks


def swizzled(dtype, minor: int) -> tuple:
  """SMEM transforms for a wgmma/TMA operand whose minor dimension holds `minor` elements of
  `dtype`: 8-row tiles and the widest swizzle that minor dimension allows (bank-conflict-free)."""
  bits = jnp.dtype(dtype).itemsize * 8
  swizzle = plgpu.find_swizzle(minor * bits)
  return (plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle))
