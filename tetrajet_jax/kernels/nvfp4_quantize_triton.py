"""NVFP4 RTN quantizer (double-block scaling) along the last axis, as a Pallas Triton kernel.

The contract is `nvfp4_quantize.quantize_nvfp4_rtn`'s: codes, E4M3 inner
scales and FP32 outer scales bitwise `numerics.quantize_nvfp4(x, axis=-1)`
(docs/SPEC.md section 1: two correctly rounded divisions per scale, E4M3 round
to nearest even, one correctly rounded reciprocal per 16-block, one float32
product per element, E2M1 round to nearest even).

What differs is the thread layout. The Mosaic GPU kernel holds its tile in the
wgmma register layout, where the 16 elements of an inner block are spread over
four lanes, so each of those lanes repeats the block's scale arithmetic (two
divisions, the E4M3 rounding, the reciprocal: dozens of instructions) for
four elements of its own. Here Triton's blocked layout keeps a row's
contiguous elements in one thread (16-byte loads), so a block's scale work is
shared by at most two threads, and the kernel is a plain load, per-block and
per-element arithmetic, and stores: no shared memory, no barriers.

Semantics that Triton and the interpreter must agree on:
- block maxima are integer maxima of |x|'s float32 bits: for non-negative
  floats the integer order is the float order, and NaN bits exceed Inf's, so a
  block holding NaN gets a NaN amax on every backend (Triton lowers a float
  max to `maxnumf`, which drops NaN);
- E4M3 rounding is the float32 -> float8_e4m3fn conversion (round to nearest
  even in both; the quotient it rounds is at most 448 (1 + 2^-21), so the
  saturation rule of `numerics.scales.round_to_e4m3` never applies);
- divisions and the reciprocal are single correctly rounded PTX instructions
  on the GPU (`div.rn.ftz.f32`, `rcp.rn.ftz.f32`) and the XLA path's own
  `numerics.scales` functions in the interpreter.

Packing: the tile is viewed as [rows, 8 inner blocks, 8 pairs, 2], and a pair's
two codes (element 2i in the low nibble) are combined in the thread that holds
both. Outputs are written in the canonical layouts: codes [R, K/2], inner
scales [R, K/16] as E4M3, outer scales [R, K/128].
"""

from __future__ import annotations

import functools

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.triton as pltriton
import jax.numpy as jnp
import numpy as np
from jax import lax

from tetrajet_jax.numerics import NVFP4Tensor, scales
from tetrajet_jax.numerics.e2m1 import E2M1_MAX, flush_subnormal, nearest_index
from tetrajet_jax.numerics.nvfp4 import INNER_BLOCK, OUTER_BLOCK
from tetrajet_jax.numerics.scales import E4M3_MAX, E4M3_MIN_SUBNORMAL

_BLOCKS = OUTER_BLOCK // INNER_BLOCK  # inner blocks per outer block
_PAIRS = INNER_BLOCK // 2  # packed bytes per inner block
_F32_MAX_BITS = int(np.float32(np.finfo(np.float32).max).view(np.int32))


def _ptx_f32(asm: str, *operands: jax.Array) -> jax.Array:
  """One PTX instruction ($0 the result, $1... the operands, all f32) on every element."""
  constraints = "=f" + ",f" * len(operands)
  [out] = pltriton.elementwise_inline_asm(asm, args=list(operands), constraints=constraints, pack=1,
                                          result_shape_dtypes=[jax.ShapeDtypeStruct(operands[0].shape,
                                                                                    jnp.float32)])
  return out


def _div_rn(x: jax.Array, y: jax.Array | float, interpret: bool) -> jax.Array:
  """x / y correctly rounded (subnormals flushed), y positive: `numerics.scales.div_rn`'s rule."""
  if interpret:
    return scales.div_rn(x, y, positive_divisor=True)
  if isinstance(y, float):
    bits = int(np.float32(y).view(np.uint32))
    return _ptx_f32(f"div.rn.ftz.f32 $0, $1, 0f{bits:08X};", x)
  return _ptx_f32("div.rn.ftz.f32 $0, $1, $2;", x, y)


def _reciprocal_rn(s: jax.Array, interpret: bool) -> jax.Array:
  """fp32(1 / s) correctly rounded: `numerics.scales.reciprocal_rn`'s rule."""
  if interpret:
    return scales.reciprocal_rn(s)
  return _ptx_f32("rcp.rn.ftz.f32 $0, $1;", s)


def _abs_bits(x: jax.Array) -> jax.Array:
  """|x|'s float32 bits as int32: ordered as the magnitudes are, NaN above Inf."""
  return lax.bitcast_convert_type(x, jnp.int32) & jnp.int32(0x7FFFFFFF)


def _as_float(bits: jax.Array) -> jax.Array:
  return lax.bitcast_convert_type(bits, jnp.float32)


def _rtn_kernel(x_ref, codes_ref, s_in_ref, s_out_ref, *, interpret: bool):
  """One [bm, 128] tile: bm outer blocks of eight inner blocks."""
  bm = x_ref.shape[0]
  x = x_ref[...].astype(jnp.float32).reshape(bm, _BLOCKS, _PAIRS, 2)
  amax_bits = jnp.max(_abs_bits(x), axis=(2, 3))  # [bm, 8]
  amax_128 = _as_float(jnp.max(amax_bits, axis=1))  # [bm]
  s_out = _div_rn(_div_rn(amax_128, E4M3_MAX, interpret), E2M1_MAX, interpret)
  s_out = jnp.where(s_out == 0.0, 1.0, s_out)
  s_out = jnp.where(lax.bitcast_convert_type(amax_128, jnp.int32) <= _F32_MAX_BITS, s_out, jnp.nan)
  s_out_b = lax.broadcast_in_dim(s_out, (bm, _BLOCKS), (0,))
  quotient = _div_rn(_div_rn(_as_float(amax_bits), s_out_b, interpret), E2M1_MAX, interpret)
  s_in = quotient.astype(jnp.float8_e4m3fn).astype(jnp.float32)
  s_in = jnp.where(s_in == 0.0, E4M3_MIN_SUBNORMAL, s_in)
  recip = _reciprocal_rn(s_in * s_out_b, interpret)  # r = fp32(1 / s), once per inner block
  v = flush_subnormal(jnp.abs(x)) * lax.broadcast_in_dim(recip, x.shape, (0, 1))
  idx = nearest_index(v)
  codes = jnp.where((x < 0.0) & (idx > 0), idx | 8, idx)
  shift = lax.broadcasted_iota(jnp.int32, x.shape, 3) * 4  # element 2i low nibble, 2i+1 high
  codes_ref[...] = jnp.sum(codes << shift, axis=3).astype(jnp.uint8)
  s_in_ref[...] = s_in.astype(jnp.float8_e4m3fn)
  s_out_ref[...] = s_out.reshape(bm, 1)


def _check_input(x, block_rows: int) -> None:
  if jnp.ndim(x) != 2:
    raise ValueError(f"quantize_nvfp4_rtn_triton: expected a 2-D array [R, K], got shape {jnp.shape(x)}; "
                     "reshape leading axes into R.")
  if jnp.dtype(x.dtype) not in (jnp.bfloat16, jnp.float32):
    raise ValueError(f"quantize_nvfp4_rtn_triton: dtype {x.dtype} not supported; pass bfloat16 or float32.")
  if block_rows < 1 or block_rows & (block_rows - 1):
    raise ValueError(f"quantize_nvfp4_rtn_triton: block_rows={block_rows} must be a power of two.")
  r, k = x.shape
  if r % block_rows or k % OUTER_BLOCK or k == 0:
    raise ValueError(f"quantize_nvfp4_rtn_triton: shape {x.shape} needs R % {block_rows} == 0 and K a positive "
                     f"multiple of {OUTER_BLOCK}; pad (zeros change no scale) or use "
                     "tetrajet_jax.numerics.quantize_nvfp4.")


def quantize_nvfp4_rtn_triton(x: jax.Array, *, block_rows: int = 32, num_warps: int = 4,
                              interpret: bool = False) -> NVFP4Tensor:
  """RTN NVFP4 quantization of a 2-D array along its last axis (Pallas Triton kernel).

  Args:
    x: bf16 or f32 [R, K], R % block_rows == 0, K % 128 == 0.
    block_rows: rows per program (a power of two); each program quantizes
      one [block_rows, 128] tile.
    num_warps: warps per program.
    interpret: run the kernel body on the CPU (Pallas's interpreter).

  Returns:
    NVFP4Tensor bitwise equal to `numerics.quantize_nvfp4(x, axis=-1)`.
  """
  _check_input(x, block_rows)
  return _rtn_instance(x, block_rows=block_rows, num_warps=num_warps, interpret=interpret)


@functools.partial(jax.jit, static_argnames=("block_rows", "num_warps", "interpret"))
def _rtn_instance(x, *, block_rows: int, num_warps: int, interpret: bool) -> NVFP4Tensor:
  r, k = x.shape
  kb = k // OUTER_BLOCK
  out_shape = (jax.ShapeDtypeStruct((r, k // INNER_BLOCK, _PAIRS), jnp.uint8),
               jax.ShapeDtypeStruct((r, k // INNER_BLOCK), jnp.float8_e4m3fn),
               jax.ShapeDtypeStruct((r, kb), jnp.float32))
  codes, s_in, s_out = pl.pallas_call(
      functools.partial(_rtn_kernel, interpret=interpret),
      out_shape=out_shape,
      grid=(r // block_rows, kb),
      in_specs=[pl.BlockSpec((block_rows, OUTER_BLOCK), lambda i, j: (i, j))],
      out_specs=[pl.BlockSpec((block_rows, _BLOCKS, _PAIRS), lambda i, j: (i, j, 0)),
                 pl.BlockSpec((block_rows, _BLOCKS), lambda i, j: (i, j)),
                 pl.BlockSpec((block_rows, 1), lambda i, j: (i, j))],
      compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret,
      name="nvfp4_rtn_triton",
  )(x)
  return NVFP4Tensor(codes=codes.reshape(r, k // 2), scale_inner=s_in, scale_outer=s_out, shape=(r, k), axis=1,
                     scaling="block", block_2d=False)
