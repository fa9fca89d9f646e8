"""NVFP4 quantizers as Pallas Triton kernels: RTN along the last axis, and the backward
quantizer (RHT-16, double-block scales, stochastic rounding) along either axis.

The contracts are those of the Mosaic GPU kernels (`nvfp4_quantize`,
`nvfp4_quantize_backward`), with one stronger: codes, E4M3 inner scales and
FP32 outer scales are bitwise `numerics.quantize_nvfp4` (docs/SPEC.md section 1:
two correctly rounded divisions per scale, E4M3 round to nearest even, one
correctly rounded reciprocal per 16-block, one float32 product per element),
and the backward kernel's RHT runs the XLA transform's own operations in their
order (`_rht16`), so it is bitwise `quantize_nvfp4(random_hadamard_16(x))` too,
where the Mosaic kernel's tensor-core transform agrees up to FP32 summation
order. Stochastic rounding draws the XLA path's counter-based bits
(`numerics.counter_rng`: row keys from XLA, one hash per element pair).

What differs is the thread layout. The Mosaic GPU kernels hold a tile in the
wgmma register layout, where the 16 elements of an inner block are spread over
four lanes, so each of those lanes repeats the block's scale arithmetic (two
divisions, the E4M3 rounding, the reciprocal: dozens of instructions) for
four elements of its own. Here every thread holds whole inner blocks: a tile
is loaded as sixteen tensors, one per element position j of the block (four
quarter loads of x viewed [R, K/16, 16] along the last axis; sixteen row
slices of x viewed [T/16, 16, C] along the first), all in one layout. The RHT
butterfly, block maxima, scales, hashes, rounding and packing are then
elementwise between those tensors; the only steps that cross threads are the
maximum over an outer block's eight inner blocks and, along the first axis,
the transpose of the per-block results into the canonical layout. Compiled for
sm_90 (`python -m experiments.bench triton-isa`) that is 2-3 layout
conversions and no register spills per kernel; a kernel is a plain load,
arithmetic and stores, with no pipeline or barrier written in it.

Semantics that Triton and the interpreter must agree on:
- block maxima are integer maxima of |x|'s float32 bits: for non-negative
  floats the integer order is the float order, and NaN bits exceed Inf's, so a
  block holding NaN gets a NaN amax on every backend (Triton lowers a float
  max to `maxnumf`, which drops NaN);
- E4M3 rounding is the float32 -> float8_e4m3fn conversion (round to nearest
  even in both; the quotient it rounds is at most 448 (1 + 2^-21), so the
  saturation rule of `numerics.scales.round_to_e4m3` never applies);
- divisions and the reciprocal are `kernels._division`'s: single correctly
  rounded PTX instructions on the GPU (`div.rn.ftz.f32`, `rcp.rn.ftz.f32`),
  the XLA path's own `numerics.scales` functions in the interpreter.

Packing: an inner block's 16 codes leave as two uint32 words (element 8w + i
in bits 4i..4i+3 of word w), whose little-endian bytes are the packed bytes
(element 2i in the low nibble). Outputs are the canonical layouts: codes
[R, K/2], inner scales [R, K/16] as E4M3, outer scales [R, K/128].

JAX 0.11 marks the Pallas Triton backend deprecated (a DeprecationWarning
while lowering). The layer runs its block-scaled quantizers on these kernels
by default (TETRAJET_QUANTIZER_KERNELS=triton; `kernels._platform`): on an
H100 they beat the Mosaic ones at every shape, dtype and axis
(`python -m experiments.bench kernels --only quant,bwdquant`).
"""

from __future__ import annotations

import functools

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.triton as pltriton
import jax.numpy as jnp
import numpy as np
from jax import lax

from tetrajet_jax.kernels import _flat_rows
from tetrajet_jax.kernels._triton_tiles import join_last, load_columns, load_decoded_columns, load_rows
from tetrajet_jax.kernels._division import div_rn, reciprocal_rn
from tetrajet_jax.kernels._platform import hopper_available
from tetrajet_jax.numerics import NVFP4Operand, NVFP4Tensor
from tetrajet_jax.numerics.checks import pad_axis_to_multiple
from tetrajet_jax.numerics.counter_rng import high_bits, low_bits, pair_hash, row_keys
from tetrajet_jax.numerics.e2m1 import E2M1_MAX, flush_subnormal, grid_value, nearest_index, stochastic_index
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


def _abs_bits(x: jax.Array) -> jax.Array:
  """|x|'s float32 bits as int32: ordered as the magnitudes are, NaN above Inf."""
  return lax.bitcast_convert_type(x, jnp.int32) & jnp.int32(0x7FFFFFFF)


def _as_float(bits: jax.Array) -> jax.Array:
  return lax.bitcast_convert_type(bits, jnp.float32)


def _scaled_magnitude(x: jax.Array, recip: jax.Array, interpret: bool) -> jax.Array:
  """flush_subnormal(|x|) r, the XLA path's element product; on the GPU as one flush-to-zero
  product. That also flushes a subnormal product, which changes no index: RTN rounds it to 0, and
  SR's lowest threshold is 2^-18. r itself is never subnormal: s <= FP32 max / 6, so r > 1.7e-38."""
  if interpret:
    return flush_subnormal(jnp.abs(x)) * recip
  return _ptx_f32("abs.ftz.f32 $0, $1;\n\tmul.ftz.f32 $0, $0, $2;", x, recip)


# The kernels' array-level steps are jitted: a kernel body calls each as one nested jaxpr, traced
# once per block shape and reused by every instance of that shape (the train step's quantizers
# share a few tile shapes), which shortens tracing a step; lowering inlines them, so the kernel is
# the same.
@jax.jit
def _rht16(xs: list[jax.Array]) -> list[jax.Array]:
  """(1/4) H16 on the sign products xs (element j of each block), with the operations of
  `numerics.hadamard.random_hadamard_16` in its order (pairs j, j ^ h for h = 1, 2, 4, 8, a + b at j
  and a - b at j ^ h, then the product by 1/4): the same values bit for bit, elementwise."""
  for h in (1, 2, 4, 8):
    xs = [xs[j] + xs[j ^ h] if not j & h else xs[j ^ h] - xs[j] for j in range(INNER_BLOCK)]
  return [x * 0.25 for x in xs]


def _pair_hashes(keys_ref, shape: tuple[int, int], block_axis: int) -> list[jax.Array]:
  """The counter_rng hash of each element pair i of every inner block, 8 uint32 tensors of `shape`
  (blocks along block_axis, canonical rows along the other): the row's key, and the pair index
  canonical column // 2 = 64 outer block + 8 block + i. keys_ref: [bm] row keys, or [2, bm] keys
  and each row's first pair index (the flat view of `_flat_rows`)."""
  rows_axis = 1 - block_axis
  first = (lax.broadcasted_iota(jnp.int32, shape, block_axis) * _PAIRS
           + _outer_block_program(block_axis) * (OUTER_BLOCK // 2)).astype(jnp.uint32)
  if len(keys_ref.shape) == 2:
    key = lax.broadcast_in_dim(keys_ref[0, :], shape, (rows_axis,))
    first = first + lax.broadcast_in_dim(keys_ref[1, :], shape, (rows_axis,))
  else:
    key = lax.broadcast_in_dim(keys_ref[...], shape, (rows_axis,))
  return _block_pair_hashes(key, first)


@jax.jit
def _block_pair_hashes(key: jax.Array, first: jax.Array) -> list[jax.Array]:
  return [pair_hash(key, first + jnp.uint32(i)) for i in range(_PAIRS)]


def _blocks_first(block_axis: int) -> bool:
  """Whether the grid's first (fastest-launched) axis walks the outer blocks: so along the last
  axis, where consecutive programs then read one stretch of the same rows (a [bm, 128] tile alone
  covers only 256 bytes of each bf16 row); along the first axis the row tiles are adjacent columns
  of x already."""
  return block_axis == 1


def _outer_block_program(block_axis: int) -> jax.Array:
  """This program's outer block index along the quantized axis."""
  return pl.program_id(0 if _blocks_first(block_axis) else 1)


@functools.partial(jax.jit, static_argnames=("interpret", "block_axis", "operand"))
def _quantize_elements(xs: list[jax.Array], hashes: list[jax.Array] | None, interpret: bool, block_axis: int,
                       operand: bool = False):
  """Quantizes 16 float32 tensors, element j of each inner block, with the 8 blocks of an outer
  block along block_axis ([bm, 8] for 1, [8, bm] for 0). hashes: None (round to nearest even) or
  8 uint32 pair hashes (element 2i takes the low 16 bits, 2i + 1 the high). Returns the codes as
  two uint32 words stacked last (element 8w + i in bits 4i..4i+3 of word w, so their little-endian
  bytes are the packed bytes), the E4M3 inner scales (the shape of xs[0]) and the FP32 outer
  scales [bm]. operand: ([16 bf16 tensors q s_in, element j of each block], the outer scales)
  instead, the GEMM's operand (`numerics.nvfp4_bf16_operand`) with no codes in between."""
  shape, rows_axis = xs[0].shape, 1 - block_axis
  div = functools.partial(div_rn, interpret=interpret, ptx=_ptx_f32)
  amax_bits = functools.reduce(jnp.maximum, [_abs_bits(x) for x in xs])  # per block, in one thread
  amax_128 = _as_float(jnp.max(amax_bits, axis=block_axis))  # [bm]
  s_out = div(div(amax_128, E4M3_MAX), E2M1_MAX)
  s_out = jnp.where(s_out == 0.0, 1.0, s_out)
  s_out = jnp.where(lax.bitcast_convert_type(amax_128, jnp.int32) <= _F32_MAX_BITS, s_out, jnp.nan)
  s_out_b = lax.broadcast_in_dim(s_out, shape, (rows_axis,))
  quotient = div(div(_as_float(amax_bits), s_out_b), E2M1_MAX)
  s_in = quotient.astype(jnp.float8_e4m3fn).astype(jnp.float32)
  s_in = jnp.where(s_in == 0.0, E4M3_MIN_SUBNORMAL, s_in)
  recip = reciprocal_rn(s_in * s_out_b, interpret=interpret, ptx=_ptx_f32)  # r = fp32(1 / s), once per block
  words, values = ([] if operand else [jnp.zeros(shape, jnp.uint32) for _ in range(2)]), []
  for j, x in enumerate(xs):
    v = _scaled_magnitude(x, recip, interpret)
    idx = nearest_index(v) if hashes is None else stochastic_index(v, (high_bits if j % 2 else low_bits)(hashes[j // 2]))
    negative = (x < 0.0) & (idx > 0)  # zero stays +0, as its code does
    if operand:  # q s_in has at most 2 + 4 significant bits: exact in float32 and in bfloat16
      q = grid_value(idx) * s_in
      values.append(jnp.where(negative, -q, q).astype(jnp.bfloat16))
      continue
    code = jnp.where(negative, idx | 8, idx).astype(jnp.uint32)
    words[j // 8] = words[j // 8] + (code << jnp.uint32(4 * (j % 8)))  # disjoint nibbles: + is |, one LEA
  if operand:
    return values, s_out
  return jnp.stack(words, axis=-1), s_in.astype(jnp.float8_e4m3fn), s_out


def _rows_kernel(x_ref, *refs, rht: bool, stochastic: bool, interpret: bool, operand: bool = False):
  """One [bm, 8, 16] tile of x viewed [R, K/16, 16], quantized along the last axis: RTN, or the
  backward quantizer (RHT, then SR with the row keys, or RTN). operand: writes the bf16 GEMM
  operand [bm, 8, 16] and the outer scales (`_quantize_elements`)."""
  signs_ref, refs = (refs[0], refs[1:]) if rht else (None, refs)
  keys_ref, *out_refs = refs if stochastic else (None, *refs)
  xs = load_rows(x_ref, signs_ref)
  xs = _rht16(xs) if rht else xs
  hashes = _pair_hashes(keys_ref, xs[0].shape, 1) if stochastic else None
  if operand:
    values, s_out = _quantize_elements(xs, hashes, interpret, block_axis=1, operand=True)
    out_refs[0][...], out_refs[1][...] = join_last(values), s_out[:, None]
    return
  codes, s_in, s_out = _quantize_elements(xs, hashes, interpret, block_axis=1)
  out_refs[0][...], out_refs[1][...], out_refs[2][...] = codes, s_in, s_out[:, None]


def _columns_kernel(*refs, stochastic: bool, interpret: bool, decoded: bool = False, operand: bool = False):
  """One [8, 16, bm] tile of x viewed [T/16, 16, C], quantized along the first axis (RHT, then SR
  or RTN): bm canonical rows (columns of x), one outer block of tokens each. Only the per-block
  results are transposed to the canonical layout. decoded: x is X_hat, read from the refs of
  `load_decoded_columns` in place of x_ref. operand: as in `_rows_kernel` (the values transposed
  to the canonical [bm, 8, 16])."""
  loaded, refs = (refs[:4], refs[4:]) if decoded else (refs[:2], refs[2:])
  keys_ref, *out_refs = refs if stochastic else (None, *refs)
  xs = _rht16(load_decoded_columns(*loaded) if decoded else load_columns(*loaded))
  hashes = _pair_hashes(keys_ref, xs[0].shape, 0) if stochastic else None
  if operand:
    values, s_out = _quantize_elements(xs, hashes, interpret, block_axis=0, operand=True)
    out_refs[0][...], out_refs[1][...] = jnp.transpose(join_last(values), (1, 0, 2)), s_out[:, None]
    return
  codes, s_in, s_out = _quantize_elements(xs, hashes, interpret, block_axis=0)
  out_refs[0][...], out_refs[1][...], out_refs[2][...] = jnp.transpose(codes, (1, 0, 2)), s_in.T, s_out[:, None]


def _quantizer_call(kernel, tiles: list[tuple[jax.Array, tuple[int, ...], object]], block_axis: int, signs_16, keys,
                    rows: int, k: int, *, block_rows: int, num_warps: int, interpret: bool, name: str,
                    operand: bool = False):
  """The quantizer grid over tiles of [block_rows canonical rows, 128] (tile (i, j): rows block i,
  outer block j; tiles: the inputs as (array, block shape, block index of (i, j)), and
  `_blocks_first` orders the grid):
  codes [rows, k/2] uint8, E4M3 inner scales [rows, k/16], FP32 outer scales [rows, k/128]. keys:
  None, uint32 [rows] or [2, rows] (`_pair_hashes`). The kernel writes two uint32 code words per
  inner block. operand (a kernel built with operand=True): (bf16 values q s_in [rows, k], outer
  scales) instead."""
  kb = k // OUTER_BLOCK
  if _blocks_first(block_axis):
    grid, tile_of = (kb, rows // block_rows), lambda index: lambda j, i: index(i, j)
  else:
    grid, tile_of = (rows // block_rows, kb), lambda index: index

  def spec(shape, index):
    return pl.BlockSpec(shape, tile_of(index))

  in_specs, args = [spec(shape, index) for _, shape, index in tiles], [view for view, _, _ in tiles]
  if signs_16 is not None:
    in_specs.append(spec((INNER_BLOCK,), lambda i, j: (0,)))
    args.append(signs_16)
  if keys is not None:
    in_specs.append(spec((block_rows,), lambda i, j: (i,)) if keys.ndim == 1
                    else spec((2, block_rows), lambda i, j: (0, i)))
    args.append(keys)
  s_out_spec = (jax.ShapeDtypeStruct((rows, kb), jnp.float32), spec((block_rows, 1), lambda i, j: (i, j)))
  if operand:
    outs = [(jax.ShapeDtypeStruct((rows, k // INNER_BLOCK, INNER_BLOCK), jnp.bfloat16),
             spec((block_rows, _BLOCKS, INNER_BLOCK), lambda i, j: (i, j, 0))), s_out_spec]
  else:
    outs = [(jax.ShapeDtypeStruct((rows, k // INNER_BLOCK, 2), jnp.uint32),
             spec((block_rows, _BLOCKS, 2), lambda i, j: (i, j, 0))),
            (jax.ShapeDtypeStruct((rows, k // INNER_BLOCK), jnp.float8_e4m3fn),
             spec((block_rows, _BLOCKS), lambda i, j: (i, j))), s_out_spec]
  results = pl.pallas_call(
      kernel, out_shape=tuple(shape for shape, _ in outs), grid=grid, in_specs=in_specs,
      out_specs=[out_spec for _, out_spec in outs],
      compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret, name=name + ("_operand" if operand else ""),
  )(*args)
  if operand:
    values, s_out = results
    return values.reshape(rows, k), s_out
  words, s_in, s_out = results
  codes = lax.bitcast_convert_type(words, jnp.uint8)  # [rows, k/16, 2, 4]: the packed bytes in order
  return codes.reshape(rows, k // 2), s_in, s_out


def _tensor(outs, shape: tuple[int, ...], axis: int) -> NVFP4Tensor | NVFP4Operand:
  if len(outs) == 2:
    return NVFP4Operand(values=outs[0], scale_outer=outs[1], shape=shape, axis=axis)
  codes, s_in, s_out = outs
  return NVFP4Tensor(codes=codes, scale_inner=s_in, scale_outer=s_out, shape=shape, axis=axis, scaling="block",
                     block_2d=False)


def _check_input(x, block_rows: int, name: str, axis: int = 1, *, flat_rows: bool = False) -> None:
  """ValueError, before anything is traced, for what the kernels cannot take (with flat_rows: x's
  shape for the flat view, then the flat view itself)."""
  if flat_rows:
    _flat_rows.check_flat_shape(jnp.shape(x), name)
    r, k = x.shape
    x = jax.ShapeDtypeStruct((_flat_rows.bucket_rows(r * k // OUTER_BLOCK), OUTER_BLOCK), x.dtype)
  if jnp.ndim(x) != 2:
    raise ValueError(f"{name}: expected a 2-D array, got shape {jnp.shape(x)}; reshape leading axes into rows.")
  if jnp.dtype(x.dtype) not in (jnp.bfloat16, jnp.float32):
    raise ValueError(f"{name}: dtype {x.dtype} not supported; pass bfloat16 or float32.")
  if block_rows < 1 or block_rows & (block_rows - 1):
    raise ValueError(f"{name}: block_rows={block_rows} must be a power of two.")
  rows, k = (x.shape[0], x.shape[1]) if axis == 1 else (x.shape[1], x.shape[0])
  if rows % block_rows or k == 0 or (axis == 1 and k % OUTER_BLOCK):
    what = "rows % {b} == 0 and cols a positive multiple of {o}" if axis == 1 else "cols % {b} == 0 and rows > 0"
    raise ValueError(f"{name}: shape {x.shape} along axis {axis} needs "
                     + what.format(b=block_rows, o=OUTER_BLOCK)
                     + "; pad (zeros change no scale) or use tetrajet_jax.numerics.quantize_nvfp4.")


def quantize_nvfp4_rtn_triton(x: jax.Array, *, block_rows: int = 32, num_warps: int = 4, flat_rows: bool = False,
                              interpret: bool = False) -> NVFP4Tensor:
  """RTN NVFP4 quantization of a 2-D array along its last axis (Pallas Triton kernel).

  Args:
    x: bf16 or f32 [R, K], R % block_rows == 0 (free with flat_rows), K % 128 == 0.
    block_rows: rows per program (a power of two); each program quantizes
      one [block_rows, 128] tile.
    num_warps: warps per program.
    flat_rows: quantize x as its row-major view of 128-wide rows, zero-padded
      to a power-of-two bucket (`_flat_rows`): the same result, and every
      small tensor of a bucket (a model's weights) runs one kernel instance.
    interpret: run the kernel body on the CPU (Pallas's interpreter).

  Returns:
    NVFP4Tensor bitwise equal to `numerics.quantize_nvfp4(x, axis=-1)`.
  """
  _check_input(x, block_rows, "quantize_nvfp4_rtn_triton", flat_rows=flat_rows)
  return _quantize(x, None, None, axis=1, flat_rows=flat_rows, block_rows=block_rows, num_warps=num_warps,
                   interpret=interpret)


def quantize_nvfp4_backward_triton(x: jax.Array, signs_16: jax.Array, seed: jax.Array | None, *, axis: int = -1,
                                   block_rows: int = 32, num_warps: int = 4, flat_rows: bool = False,
                                   operand: bool = False, interpret: bool = False) -> NVFP4Tensor | NVFP4Operand:
  """TetraJet-v2's backward quantizer (Q3..Q6) of a 2-D array in one pass: RHT-16, double-block
  scales, stochastic rounding (round to nearest even with seed=None), as a Pallas Triton kernel.

  Args:
    x: bf16 or f32 [R, C]. axis=-1: R % block_rows == 0 (free with flat_rows),
      C % 128 == 0. axis=0: C % block_rows == 0; R is zero-padded to a multiple
      of 128 (the layer pads tokens the same way).
    signs_16: float32 [16], the RHT signs (`numerics.hadamard_signs(key)`).
    seed: uint32 scalar of the SR generator (`counter_rng.sr_seed(key)`), or
      None for round to nearest even.
    axis: -1/1 (along the last axis) or 0 (along the first; the result is the
      canonical layout of x^T, and only the per-block results are transposed).
    flat_rows: (axis -1) quantize x as its row-major view of 128-wide rows,
      zero-padded to a power-of-two bucket (`_flat_rows`), each flat row with
      its original row's key and pair offset: the same result, and every small
      tensor of a bucket runs one kernel instance.
    operand: return the GEMM's bf16 operand (an NVFP4Operand, bitwise `nvfp4_bf16_operand` of
      the NVFP4Tensor) in place of codes and inner scales: no decode pass before the GEMM.
    block_rows, num_warps, interpret: as `quantize_nvfp4_rtn_triton`.

  Returns:
    NVFP4Tensor bitwise equal to `quantize_nvfp4(random_hadamard_16(x, rht_key, axis=axis),
    axis=axis, rounding="stochastic", key=sr_key)` for signs_16 = hadamard_signs(rht_key) and
    seed = sr_seed(sr_key): the transform runs the XLA path's operations in its order.
  """
  name = "quantize_nvfp4_backward_triton"
  if axis not in (-1, 0, 1):
    raise ValueError(f"{name}: axis={axis} must be -1/1 (last axis) or 0 (first axis).")
  axis %= 2
  if flat_rows and (axis != 1 or operand):
    raise ValueError(f"{name}: flat_rows quantizes along the last axis into codes; got axis={axis}, "
                     f"operand={operand}.")
  _check_input(x, block_rows, name, axis, flat_rows=flat_rows)
  signs_16, seed = _checked_signs_and_seed(signs_16, seed, name)
  return _quantize(x, signs_16, seed, axis=axis, flat_rows=flat_rows, block_rows=block_rows,
                   num_warps=num_warps, interpret=interpret, operand=operand)


def _checked_signs_and_seed(signs_16, seed, name: str):
  """The backward kernels' RHT signs as float32 [16] and SR seed (None, or a scalar; a Python int
  as uint32, which may not fit jit's int32); ValueError for other shapes."""
  if jnp.shape(signs_16) != (INNER_BLOCK,):
    raise ValueError(f"{name}: signs_16 must have shape (16,), got {jnp.shape(signs_16)}; "
                     "use tetrajet_jax.numerics.hadamard_signs(key).")
  if seed is not None and jnp.ndim(seed) != 0:
    raise ValueError(f"{name}: seed must be a scalar, got shape {jnp.shape(seed)}.")
  return jnp.asarray(signs_16, jnp.float32), np.uint32(seed) if isinstance(seed, int) else seed


def _quantize(x, signs_16, seed, *, axis: int, flat_rows: bool, **opts) -> NVFP4Tensor:
  """Either quantizer on checked input: RTN when signs_16 is None, else the backward one; the SR
  keys (`_pair_hashes`) of x's rows, or of the flat view's rows with their pair offsets."""
  if flat_rows:
    keys = None if seed is None else _flat_rows.row_keys_and_offsets(seed, x.shape)
    return _flat_rows.rejoin(_instance(_flat_rows.to_flat(x), signs_16, keys, axis=1, **opts), x.shape)
  keys = None if seed is None else row_keys(seed, x.shape[1 - axis])
  return _instance(x, signs_16, keys, axis=axis, **opts)


@functools.partial(jax.jit, static_argnames=("axis", "block_rows", "num_warps", "interpret", "operand"))
def _instance(x, signs_16, keys, *, axis: int, block_rows: int, num_warps: int, interpret: bool,
              operand: bool = False) -> NVFP4Tensor | NVFP4Operand:
  """One kernel instance: RTN (signs_16 None, along the last axis) or the backward quantizer."""
  shape = tuple(x.shape)
  rht = signs_16 is not None
  opts = dict(block_rows=block_rows, num_warps=num_warps, interpret=interpret, operand=operand,
              name="nvfp4_backward_triton" if rht else "nvfp4_rtn_triton")
  if axis == 1:
    rows, k = shape
    tiles = [(x.reshape(rows, k // INNER_BLOCK, INNER_BLOCK), (block_rows, _BLOCKS, INNER_BLOCK),
              lambda i, j: (i, j, 0))]
    kernel = functools.partial(_rows_kernel, rht=rht, stochastic=keys is not None, interpret=interpret,
                               operand=operand)
  else:
    x = pad_axis_to_multiple(x, 0, OUTER_BLOCK)
    k, rows = x.shape
    tiles = [(x.reshape(k // INNER_BLOCK, INNER_BLOCK, rows), (_BLOCKS, INNER_BLOCK, block_rows),
              lambda i, j: (j, 0, i))]
    kernel = functools.partial(_columns_kernel, stochastic=keys is not None, interpret=interpret, operand=operand)
  return _tensor(_quantizer_call(kernel, tiles, axis, signs_16, keys, rows, k, **opts), shape, axis)


def requantize_nvfp4_backward_triton(t: NVFP4Tensor, signs_16: jax.Array, seed: jax.Array | None, *, rows: int,
                                     block_rows: int = 32, num_warps: int = 4, operand: bool = False,
                                     interpret: bool = False) -> NVFP4Tensor | NVFP4Operand:
  """The backward quantizer along axis 0 of X_hat = dequantize_nvfp4_canonical(t)[:rows], reading
  t's codes and scales instead of X_hat (TetraJet-v2's Q6 re-quantizes the forward's Q1 this way).

  Args:
    t: a 2-D block-scaled NVFP4Tensor in its canonical layout [M, K'] (quantized along its last
      axis, 1x16 blocks), K' % block_rows == 0.
    signs_16, seed, block_rows, num_warps, operand, interpret: as `quantize_nvfp4_backward_triton`.
    rows: how many leading rows of X_hat to quantize, 0 < rows <= M; the kernel
      zero-pads them to whole 128-row blocks.

  Returns:
    NVFP4Tensor bitwise equal to quantize_nvfp4_backward_triton(dequantize_nvfp4_canonical(t)[:rows],
    signs_16, seed, axis=0).
  """
  name = "requantize_nvfp4_backward_triton"
  if not isinstance(t, NVFP4Tensor) or t.codes.ndim != 2 or t.block_2d or t.scaling != "block":
    raise ValueError(f"{name}: t must be a 2-D block-scaled NVFP4Tensor with 1x16 blocks; use "
                     "quantize_nvfp4_backward_triton on dequantize_nvfp4_canonical(t) otherwise.")
  m, k = t.codes.shape[0], 2 * t.codes.shape[1]
  if not 0 < rows <= m:
    raise ValueError(f"{name}: rows={rows} must be in (0, {m}], the rows of t's canonical layout.")
  _check_input(jax.ShapeDtypeStruct((rows, k), jnp.float32), block_rows, name, axis=0)
  if not INNER_BLOCK <= block_rows <= OUTER_BLOCK:  # a tile reads whole inner scales and one outer scale per row
    raise ValueError(f"{name}: block_rows={block_rows} must be between {INNER_BLOCK} and {OUTER_BLOCK}.")
  signs_16, seed = _checked_signs_and_seed(signs_16, seed, name)
  keys = None if seed is None else row_keys(seed, k)
  return _decoded_instance(t.codes, t.scale_inner, t.scale_outer, signs_16, keys, rows=rows, block_rows=block_rows,
                           num_warps=num_warps, operand=operand, interpret=interpret)


@functools.partial(jax.jit, static_argnames=("rows", "block_rows", "num_warps", "operand", "interpret"))
def _decoded_instance(codes, scale_inner, scale_outer, signs_16, keys, *, rows: int, block_rows: int, num_warps: int,
                      operand: bool, interpret: bool) -> NVFP4Tensor | NVFP4Operand:
  """One instance of the decoding backward kernel: rows of X_hat padded with zero codes (scales
  of 1) to whole 128-token blocks."""
  mp, k = -(-rows // OUTER_BLOCK) * OUTER_BLOCK, 2 * codes.shape[1]
  pad = lambda a, value: jnp.pad(a[:rows], ((0, mp - rows), (0, 0)), constant_values=value)
  codes, s_in, s_out = pad(codes, 0), pad(scale_inner.astype(jnp.float32), 1.0), pad(scale_outer, 1.0)
  view = lambda a: a.reshape(mp // INNER_BLOCK, INNER_BLOCK, a.shape[1])
  tiles = [(view(codes), (_BLOCKS, INNER_BLOCK, block_rows // 2), lambda i, j: (j, 0, i)),
           (view(s_in), (_BLOCKS, INNER_BLOCK, block_rows // INNER_BLOCK), lambda i, j: (j, 0, i)),
           (view(s_out), (_BLOCKS, INNER_BLOCK, 1), lambda i, j: (j, 0, i * block_rows // OUTER_BLOCK))]
  kernel = functools.partial(_columns_kernel, stochastic=keys is not None, interpret=interpret, decoded=True,
                             operand=operand)
  outs = _quantizer_call(kernel, tiles, 0, signs_16, keys, k, mp, block_rows=block_rows, num_warps=num_warps,
                         interpret=interpret, name="nvfp4_requantize_triton", operand=operand)
  return _tensor(outs, (rows, k), 0)


def can_use_triton_quantizer(shape: tuple[int, ...], dtype, *, axis: int = -1, block_rows: int = 32) -> bool:
  """True when these kernels run here (Hopper GPU) for a 2-D shape and dtype: the RTN kernel
  (axis -1) or the backward kernel along `axis` (axis 0 pads the rows itself)."""
  if not (hopper_available() and len(shape) == 2 and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float32)):
    return False
  rows, k = (shape[0], shape[1]) if axis in (-1, 1) else (shape[1], shape[0])
  return rows > 0 and rows % block_rows == 0 and k > 0 and (axis == 0 or k % OUTER_BLOCK == 0)
