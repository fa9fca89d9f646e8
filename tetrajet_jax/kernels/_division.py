"""Correctly rounded float32 division for the quantizer kernels' per-block scale arithmetic.

The rule is `tetrajet_jax.numerics.scales.div_rn`'s: the IEEE quotient, ties
to even, subnormal operands and results flushed to zero. Mosaic GPU lowers a
plain f32 division to the approximate `div.full.f32` (LLVM's NVPTX precision
option is process-wide, and XLA sets it), so on the GPU each division here is
one PTX instruction that rounds correctly by definition: `div.rn.ftz.f32`, and
`rcp.rn.ftz.f32` for the reciprocal the elements are multiplied by. Each call
is a single custom op for Mosaic's layout inference. The integer emulation
these replace (`scales.div_rn_from_estimate`, about 60 ops per division)
made up most of each kernel body, and so most of its lowering time.

In the interpreter (a CPU running the kernel body as XLA ops) the same
quotients come from `scales.div_rn`, the XLA path's own division.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.experimental.mosaic.gpu as mgpu
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import llvm

from tetrajet_jax.numerics import scales

# Per-row values of a tile ([rows] f32, one per row of the wgmma register layout).
_ROW = plgpu.Layout.WGMMA.reduce(1)


def _f32_immediate(c: float) -> str:
  """A float32 constant as a PTX immediate (0f + its bits in hex: exact)."""
  return f"0f{int(np.float32(c).view(np.uint32)):08X}"


def _ptx_elementwise(asm: str, *operands: jax.Array) -> jax.Array:
  """Applies the one-instruction PTX `asm` ($0: result, $1...: operands, all f32) to every
  element of [rows] f32 arrays in the row layout."""
  shape = operands[0].shape

  @plgpu.inline_mgpu(arg_types=tuple(_ROW for _ in operands),
                     return_type=plgpu.ShapeDtypeStruct(shape, jnp.float32, layout=_ROW))
  def apply(ctx, *arrays):
    del ctx
    f32 = ir.F32Type.get()
    scalar = lambda *vals: llvm.inline_asm(f32, list(vals), asm, "=f" + ",f" * len(vals))
    return arrays[0]._pointwise(mgpu.FragmentedArray._lift_fast_instr(scalar), *arrays[1:])

  return apply(*operands)


# Applies a one-instruction PTX string to every element of its f32 operands: `_ptx_elementwise` in
# Mosaic GPU kernels; the Triton kernels pass their own (`nvfp4_quantize_triton`).
PtxElementwise = Callable[..., jax.Array]


def div_rn(x: jax.Array, y: jax.Array | float, *, interpret: bool,
           ptx: PtxElementwise = _ptx_elementwise) -> jax.Array:
  """x / y correctly rounded, for f32 x (by default [rows] in the row layout) and a positive
  divisor y (an array of x's shape or a Python float); NaN in either gives NaN."""
  if interpret:
    return scales.div_rn(x, y, positive_divisor=True)
  if isinstance(y, float):
    return ptx(f"div.rn.ftz.f32 $0, $1, {_f32_immediate(y)};", x)
  return ptx("div.rn.ftz.f32 $0, $1, $2;", x, y)


def reciprocal_rn(s: jax.Array, *, interpret: bool, ptx: PtxElementwise = _ptx_elementwise) -> jax.Array:
  """fp32(1 / s) correctly rounded, as `scales.reciprocal_rn` (a subnormal s gives +inf)."""
  if interpret:
    return scales.reciprocal_rn(s)
  return ptx("rcp.rn.ftz.f32 $0, $1;", s)
