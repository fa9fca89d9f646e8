"""Fused NVFP4 RTN quantizer (double-block scaling) along the last axis of a 2-D array.

Bitwise contract: codes, E4M3 inner scales and FP32 outer scales equal
`tetrajet_jax.numerics.quantize_nvfp4(x, axis=-1)` (the reference below), i.e.
docs/SPEC.md section 1 to the bit:
  s_out = amax_128 / 448 / 6 (two IEEE divisions; 0 -> 1; NaN if the block
          holds NaN/Inf),
  s_in  = round_to_e4m3(amax_16 / s_out / 6) (0 -> 2^-9),
  r     = 1 / (s_in * s_out), correctly rounded, once per 16-block,
  q     = rne_e2m1(x * r), saturating at 6.
The scales are the reference's own formulas (`numerics.nvfp4.block_outer_scale`,
`block_inner_scale`) with single correctly rounded PTX divisions
(`kernels._division`: Mosaic GPU's own f32 division is not correctly rounded),
and the element rounding is `e2m1.nearest_index` of the product; the
elements are only multiplied (one float32 product each, then compares).

Kernel: grid (row blocks, parts of K), each CTA walking its part of K in
blocks of 128 sequentially so TMA pipelines the loads. One [bm, 128] tile =
bm outer blocks: the eight [bm, 16] inner blocks are loaded from SMEM in the
wgmma register layout, where a row reduction is a 4-lane shuffle, and
quantized in one loop over the inner blocks (`quantize_tile`: lowering time
grows with the unrolled op count). Optional second output: the exact bf16
operand q * s_in that a block-scaled bf16 GEMM consumes.

Packing two codes per byte needs neighbouring elements in one thread: bf16
input is read as uint32 words holding an (even, odd) pair, so each thread
writes whole bytes ("pairs" packing); f32 input writes one code per byte and
XLA packs them ("xla" packing).
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np
from jax import lax

from tetrajet_jax.kernels import _flat_rows, _platform
from tetrajet_jax.kernels._division import div_rn, reciprocal_rn
from tetrajet_jax.numerics import NVFP4Tensor, pack_e2m1, quantize_nvfp4
from tetrajet_jax.numerics.e2m1 import flush_subnormal, nearest_index
from tetrajet_jax.numerics.e2m1 import grid_value as _index_magnitude  # E2M1 grid value of an index (exact)
from tetrajet_jax.numerics.nvfp4 import INNER_BLOCK, OUTER_BLOCK, block_inner_scale, block_outer_scale

OUTER = OUTER_BLOCK
INNER = INNER_BLOCK
_F32_MAX = float(np.finfo(np.float32).max)

Packing = Literal["pairs", "xla"]
# Timing-only knobs (the bench's attribution rows; results are NOT the reference's):
# "hardware" multiplies by the plain 1 / s instead of the correctly rounded
# reciprocal (s_in and s_out stay exact), "none" replaces all tile math by copying input bits
# (same loads and stores).
Division = Literal["exact", "hardware"]
Math = Literal["full", "none"]


def _kernel_division(interpret: bool):
  """`numerics.nvfp4`'s Division for kernel bodies: one correctly rounded PTX instruction."""
  return lambda x, y: div_rn(x, y, interpret=interpret)


def outer_scale(amax: jax.Array, interpret: bool) -> jax.Array:
  """s_out [bm] of one tile from its amax [bm] (the reference's formula, numerics.nvfp4), with
  a NaN scale for a block holding NaN/Inf."""
  s_out = block_outer_scale(amax, _kernel_division(interpret))
  return jnp.where(amax <= _F32_MAX, s_out, jnp.nan)  # single compare feeding a select (Mosaic GPU)


def inner_scale(amax_16: jax.Array, s_out: jax.Array, interpret: bool) -> jax.Array:
  """s_in [bm] of one inner block (the reference's formula, numerics.nvfp4)."""
  return block_inner_scale(amax_16, s_out, _kernel_division(interpret))


def _abs_max_elementwise(parts) -> jax.Array:
  """max(|part|) over the parts (f32 [bm, w]) of one inner block, element by element: no
  cross-lane work (NaN-propagating, like every max here)."""
  am = jnp.abs(parts[0])
  for p in parts[1:]:
    am = jnp.maximum(am, jnp.abs(p))
  return am


def _abs_max(parts) -> jax.Array:
  """Row amax [bm] over the parts (f32 [bm, w]) of one inner block: the parts are combined in
  each lane first, so the row reduction (a 4-lane shuffle tree) runs once, not once per part."""
  return jnp.max(_abs_max_elementwise(parts), axis=1)


def tile_abs_max(load_sub, unrolled: bool = False) -> jax.Array:
  """Row amax [bm] of one [bm, 128] tile (`quantize_tile`'s load_sub and unrolled): each lane
  keeps a running max of its own elements over the eight inner blocks, and the row reduction
  across lanes runs once at the end."""
  if unrolled:
    lane_max = _abs_max_elementwise(load_sub(0))
    for c in range(1, OUTER // INNER):
      lane_max = jnp.maximum(lane_max, _abs_max_elementwise(load_sub(c)))
  else:
    @pl.loop(1, OUTER // INNER, init_carry=_abs_max_elementwise(load_sub(0)))
    def lane_max(c, running):
      return jnp.maximum(running, _abs_max_elementwise(load_sub(c)))
  return jnp.max(lane_max, axis=1)


def quantize_tile(load_sub, round_parts, store_sub, s_in_ref, s_out_ref, *, interpret: bool,
                  with_operand: bool, division: Division = "exact", unrolled: bool = False,
                  tensor_s_out: jax.Array | None = None) -> None:
  """Quantizes one [bm, 128] tile (one outer block per row) and writes it; shared by the RTN and
  the backward kernel.

  The eight inner blocks are loops, not eight unrolled copies: Mosaic GPU's
  module emission and layout inference take time per op, and that lowering
  time is what a train step waits on before XLA compiles. s_out needs every
  inner block's amax, so a first loop carries the running amax; the second
  reloads its block from SMEM and recomputes that block's amax rather than
  indexing registers by the loop counter, which a kernel cannot do.

  Args:
    load_sub: c -> tuple of float32 [bm, w] arrays holding together the 16
      values of inner block c (c a traced loop index; a Python int for block
      0 and when unrolled).
    round_parts: (c, scaled) -> int32 E2M1 magnitude indices, one per part,
      of the parts' |x| r (RNE for RTN; SR for the backward kernel).
    store_sub: (c, codes, qs) -> None: writes block c's int32 codes per part
      (sign in bit 3) and, with_operand, float32 q * s_in per part (else None).
    s_in_ref, s_out_ref: SMEM [8, bm] and [1, bm] float32 scale outputs.
    interpret: the body runs in the interpreter (kernels._division).
    with_operand: also compute q * s_in.
    division: "exact" (the reference's rule: r = reciprocal_rn(s) per inner
      block, then rounding of |x| r) or "hardware" (the plain 1 / s: timing
      only, not bitwise).
    unrolled: eight unrolled copies with c a Python int, for `load_sub`s that
      slice a register array (which a loop counter cannot index).
    tensor_s_out: float32 [bm], the per-tensor scale broadcast over the rows
      (tensor scaling: no 1x128 amax pass; it is also what s_out_ref receives).
  """
  s_out = tensor_s_out if tensor_s_out is not None else outer_scale(tile_abs_max(load_sub, unrolled), interpret)
  s_out_ref[0, :] = s_out

  def inner_block(c):
    parts = load_sub(c)
    s_in = inner_scale(_abs_max(parts), s_out, interpret)
    s_in_ref[c, :] = s_in
    s = s_in * s_out
    r = reciprocal_rn(s, interpret=interpret) if division == "exact" else 1.0 / s  # per row, shared by the parts
    idxs = round_parts(c, [flush_subnormal(jnp.abs(x)) * lax.broadcast_in_dim(r, x.shape, [0]) for x in parts])
    codes, qs = [], []
    for x, idx in zip(parts, idxs):
      neg = (x < 0.0) & (idx > 0)
      codes.append(jnp.where(neg, idx | 8, idx))
      if with_operand:
        mag = _index_magnitude(idx) * lax.broadcast_in_dim(s_in, x.shape, [0])
        qs.append(jnp.where(neg, -mag, mag))
    store_sub(c, codes, qs if with_operand else None)

  if unrolled:
    for c in range(OUTER // INNER):
      inner_block(c)
  else:
    pl.loop(0, OUTER // INNER)(inner_block)


def packed_store(codes_ref, qs_ref=None):
  """store_sub of `quantize_tile` for even/odd element pairs: packed codes (element 2i in the
  low nibble) and optionally the exact bf16 q * s_in as uint32 words holding two bf16."""
  def store(c, codes, qs):
    sub = (slice(None), pl.ds(c * (INNER // 2), INNER // 2))
    ce, co = codes
    codes_ref[sub] = (ce | (co << 4)).astype(jnp.uint8)
    if qs is not None:
      lo = lax.bitcast_convert_type(qs[0], jnp.uint32) >> 16  # exact bf16 values: low bits are 0
      hi = lax.bitcast_convert_type(qs[1], jnp.uint32) & jnp.uint32(0xFFFF0000)
      qs_ref[sub] = lo | hi
  return store


def store_trivial_tile(raws, bm: int, codes_ref, s_in_ref, s_out_ref, qs_ref=None) -> None:
  """The memory ceiling's stores: the same bytes as a real tile, from raws[c]
  (uint32 [bm, w] per inner block) with no math: codes = low bits, constant
  scales, operand = the words themselves (w = 8: packed layout)."""
  one = plgpu.layout_cast(jnp.full((bm,), 1.0, jnp.float32), plgpu.Layout.WGMMA.reduce(1))  # a splat won't store
  s_out_ref[0, :] = one
  w = raws[0].shape[1]
  for c, r in enumerate(raws):
    s_in_ref[c, :] = one
    sub = (slice(None), pl.ds(c * w, w))
    codes_ref[sub] = r.astype(jnp.uint8)
    if qs_ref is not None:
      qs_ref[sub] = r if qs_ref.dtype == jnp.uint32 else lax.bitcast_convert_type(
          (r >> 16).astype(jnp.uint16), jnp.bfloat16)


def rtn_rounding(c, scaled):
  """round_parts of `quantize_tile` for RTN: E2M1 round to nearest even of each part."""
  del c
  return [nearest_index(y) for y in scaled]


def _quantize_kernel(x_ref, codes_ref, s_in_ref, s_out_ref, *qs_refs, packing: Packing, division: Division,
                     math: Math, interpret: bool, tensor_s_out: jax.Array | None):
  """x_ref: [bm, 128] (f32/bf16; "xla") or uint32 [bm, 64] (bf16 pairs; "pairs")."""
  bm = x_ref.shape[0]
  if packing == "pairs":
    # Word j of a row holds elements 2j (low half) and 2j+1 (high half); a
    # bf16's bits in the high half of a float32 are its exact value.
    # optimized=False on the tile loads: Mosaic finds no bank-conflict-free transfer plan once
    # the column offset is the loop index (quantize_tile); the plain transfer is no slower here.
    def load_words(c):
      return plgpu.load(x_ref.at[:, pl.ds(c * INNER // 2, INNER // 2)], layout=plgpu.Layout.WGMMA,
                        optimized=False)
    if math == "none":
      words = [load_words(c) for c in range(OUTER // INNER)]
      store_trivial_tile(words, bm, codes_ref, s_in_ref, s_out_ref, qs_refs[0] if qs_refs else None)
      return

    def load_pair(c):
      w = load_words(c)
      return (lax.bitcast_convert_type(w << 16, jnp.float32),
              lax.bitcast_convert_type(w & jnp.uint32(0xFFFF0000), jnp.float32))
    quantize_tile(load_pair, rtn_rounding, packed_store(codes_ref, qs_refs[0] if qs_refs else None),
                  s_in_ref, s_out_ref, interpret=interpret, with_operand=bool(qs_refs), division=division,
                  tensor_s_out=tensor_s_out)
  else:
    def load_sub(c):
      return (plgpu.load(x_ref.at[:, pl.ds(c * INNER, INNER)], layout=plgpu.Layout.WGMMA,
                         optimized=False).astype(jnp.float32),)
    if math == "none":
      raws = [lax.bitcast_convert_type(load_sub(c)[0], jnp.uint32) for c in range(OUTER // INNER)]
      store_trivial_tile(raws, bm, codes_ref, s_in_ref, s_out_ref, qs_refs[0] if qs_refs else None)
      return

    def store_sub(c, codes, qs):
      sub = (slice(None), pl.ds(c * INNER, INNER))
      codes_ref[sub] = codes[0].astype(jnp.uint8)
      if qs is not None:
        qs_refs[0][sub] = qs[0].astype(jnp.bfloat16)
    quantize_tile(load_sub, rtn_rounding, store_sub, s_in_ref, s_out_ref, interpret=interpret,
                  with_operand=bool(qs_refs), division=division, tensor_s_out=tensor_s_out)


def _check_rtn_args(x, tensor_scale, block_rows: int, packing: Packing | None, division: Division,
                    math: Math, semantics: _platform.Semantics) -> Packing:
  """`quantize_nvfp4_rtn`'s argument checks, before any compute; returns the packing to use."""
  _check_input(x, block_rows, "quantize_nvfp4_rtn")
  check_tensor_scale(tensor_scale, "quantize_nvfp4_rtn")
  if division not in ("exact", "hardware") or math not in ("full", "none"):
    raise ValueError(f"quantize_nvfp4_rtn: unknown _division={division!r} / _math={math!r}.")
  _platform.quantizer_params(semantics)  # an unknown name raises
  if packing is None:
    packing = "pairs" if x.dtype == jnp.bfloat16 else "xla"
  if packing == "pairs" and x.dtype != jnp.bfloat16:
    raise ValueError(f"quantize_nvfp4_rtn: packing='pairs' needs bfloat16 input, got {x.dtype}; use 'xla'.")
  if packing not in ("pairs", "xla"):
    raise ValueError(f"quantize_nvfp4_rtn: unknown packing {packing!r}; use 'pairs' or 'xla'.")
  return packing


def quantize_nvfp4_rtn(x: jax.Array, tensor_scale: jax.Array | None = None, *, block_rows: int = 64,
                       max_concurrent_steps: int = 2, packing: Packing | None = None, emit_operand: bool = False,
                       k_splits: int | None = None, flat_rows: bool = False, interpret: bool = False,
                       _division: Division = "exact", _math: Math = "full",
                       _semantics: _platform.Semantics = _platform.DEFAULT_SEMANTICS):
  """Pallas RTN NVFP4 quantization of a 2-D array along its last axis.

  Args:
    x: bf16 or f32 [R, K] with R % block_rows == 0 and K % 128 == 0.
    tensor_scale: None for double-block scaling (1x16 E4M3 in 1x128 FP32);
      a float32 scalar for tensor scaling (NVIDIA's recipe): the tensor's
      FP32 scale, `numerics.tensor_outer_scale` of the tensor's amax, which
      the caller computes (one reduction over x) because no CTA sees the
      whole tensor. The 1x16 scales are then taken under it.
    block_rows: rows per tile (multiple of 64).
    max_concurrent_steps: TMA pipeline depth along K.
    packing: "pairs" (bf16 only: the kernel reads element pairs as uint32
      words and writes packed bytes) or "xla" (the kernel writes one code per
      byte, XLA packs; any dtype). Default: "pairs" for bf16, else "xla".
    emit_operand: also return the exact bf16 operand q * s_in [R, K].
    k_splits: CTAs per row block along K (a divisor of K / 128; default: enough
      for four CTAs per SM, `_platform.k_splits`). Results do not depend on it.
    flat_rows: quantize x as its row-major view of 128-wide rows, zero-padded
      to a power-of-two bucket (`_flat_rows`): the same result, and every
      small tensor of a bucket runs one kernel instance (R is then free).
    interpret: run on the CPU in Mosaic GPU's interpreter.
    _division, _math: timing only (experiments.bench's attribution rows),
      results NOT bitwise the reference's: _division="hardware" divides each
      element by its scale with the plain x / s (scales stay exact);
      _math="none" keeps grid, pipeline, loads and stores but writes input
      bits and constant scales (the kernel's memory ceiling).
    _semantics: Mosaic GPU's lowering semantics, "warpgroup" or "lane"
      (`_platform.quantizer_params`): the same kernel, lowered faster by lane.

  Returns:
    NVFP4Tensor bitwise equal to quantize_nvfp4(x, axis=-1) (with
    tensor_scale: quantize_nvfp4(x, axis=-1, scaling="tensor")); with
    emit_operand, (tensor, qs_bf16).
  """
  opts = dict(tensor_scale=tensor_scale, block_rows=block_rows, max_concurrent_steps=max_concurrent_steps,
              packing=packing, emit_operand=emit_operand, k_splits=k_splits, interpret=interpret,
              _division=_division, _math=_math, _semantics=_semantics)
  if not flat_rows:
    return _rtn_instance(x, **opts)
  _flat_rows.check_flat_shape(jnp.shape(x), "quantize_nvfp4_rtn")
  return _flat_rows.rejoin(_rtn_instance(_flat_rows.to_flat(x), **opts), x.shape)


@_platform.one_lowering_per_instance("block_rows", "max_concurrent_steps", "packing", "emit_operand", "k_splits",
                                     "interpret", "_division", "_math", "_semantics")
def _rtn_instance(x, tensor_scale, *, block_rows: int, max_concurrent_steps: int, packing: Packing | None,
                  emit_operand: bool, k_splits: int | None, interpret: bool, _division: Division, _math: Math,
                  _semantics: _platform.Semantics):
  """The kernel instance behind `quantize_nvfp4_rtn`."""
  packing = _check_rtn_args(x, tensor_scale, block_rows, packing, _division, _math, _semantics)
  r, k = x.shape
  kb = k // OUTER
  pairs = packing == "pairs"
  if pairs:
    x = lax.bitcast_convert_type(x.reshape(r, k // 2, 2), jnp.uint32)  # free: same bytes
  cw = OUTER // 2 if pairs else OUTER  # code bytes per block row
  out_shape = [
      jax.ShapeDtypeStruct((r, k // 2 if pairs else k), jnp.uint8),
      jax.ShapeDtypeStruct((k // INNER, r), jnp.float32),  # s_in^T: one TMA row per inner block
      jax.ShapeDtypeStruct((kb, r), jnp.float32),  # s_out^T
  ]
  out_blocks = [(block_rows, cw), (OUTER // INNER, block_rows), (1, block_rows)]
  if emit_operand:
    out_shape.append(jax.ShapeDtypeStruct((r, k // 2), jnp.uint32) if pairs
                     else jax.ShapeDtypeStruct((r, k), jnp.bfloat16))
    out_blocks.append((block_rows, cw))
  tensor = tensor_scale is not None
  splits = _platform.k_splits(r // block_rows, kb, interpret, k_splits)
  kb_part = kb // splits  # K blocks per CTA

  def kernel(x_gmem, *refs):
    n_out = len(out_blocks)
    if tensor:
      scale_gmem, *refs = refs
    outs_gmem, outs_smem = refs[:n_out], refs[n_out:2 * n_out]
    body = functools.partial(_quantize_kernel, packing=packing, division=_division, math=_math, interpret=interpret,
                             tensor_s_out=load_row_vector(scale_gmem, *refs[2 * n_out:]) if tensor else None)
    rows = pl.ds(lax.axis_index("rows") * block_rows, block_rows)
    j0 = lax.axis_index("k") * kb_part  # this CTA's first K block

    def step(idx, x_smem):
      (jl,) = idx
      slot = lax.rem(jl, 2)
      j = j0 + jl
      plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this slot's previous copy has read SMEM
      body(x_smem, *(o.at[slot] for o in outs_smem))
      plgpu.commit_smem()
      cols = (pl.ds(j * cw, cw), pl.ds(j * (OUTER // INNER), OUTER // INNER), pl.ds(j, 1))
      dsts = (outs_gmem[0].at[rows, cols[0]], outs_gmem[1].at[cols[1], rows], outs_gmem[2].at[cols[2], rows])
      if emit_operand:
        dsts += (outs_gmem[3].at[rows, cols[0]],)
      for src, dst in zip(outs_smem, dsts):
        plgpu.copy_smem_to_gmem(src.at[slot], dst)

    plgpu.emit_pipeline(
        step, grid=(kb_part,), in_specs=[plgpu.BlockSpec((block_rows, cw), lambda j: (0, j))],
        max_concurrent_steps=max_concurrent_steps,
    )(x_gmem.at[rows, pl.ds(j0 * cw, kb_part * cw)])
    plgpu.wait_smem_to_gmem(0)

  scratch = [plgpu.SMEM((2, *blk), o.dtype) for blk, o in zip(out_blocks, out_shape)]
  args = (x,)
  if tensor:
    scratch += row_vector_scratch(block_rows)
    args += (jnp.broadcast_to(tensor_scale.astype(jnp.float32), (1, block_rows)),)
  call = plgpu.kernel(kernel, out_type=tuple(out_shape), grid=(r // block_rows, splits), grid_names=("rows", "k"),
                      scratch_types=scratch, compiler_params=_platform.quantizer_params(_semantics))
  with _platform.interpret_context(interpret):
    outs = call(*args)
  codes, s_in_t, s_out_t = outs[:3]
  if not pairs:
    codes = pack_e2m1(codes)
  t = NVFP4Tensor(codes=codes, scale_inner=s_in_t.T.astype(jnp.float8_e4m3fn),
                  scale_outer=tensor_scale.astype(jnp.float32) if tensor else s_out_t.T,
                  shape=(r, k), axis=1, scaling="tensor" if tensor else "block", block_2d=False)
  if not emit_operand:
    return t
  qs = outs[3]
  if pairs:
    qs = lax.bitcast_convert_type(qs, jnp.bfloat16).reshape(r, k)
  return t, qs


def row_vector_scratch(bm: int) -> list:
  """SMEM scratch of `load_row_vector`: the [1, bm] buffer and its barrier."""
  return [plgpu.SMEM((1, bm), jnp.float32), plgpu.Barrier()]


def load_row_vector(vec_gmem, vec_smem, barrier) -> jax.Array:
  """[bm] in the row layout of a wgmma tile (one value per row) from a [1, bm] GMEM array: how
  the tensor-scaled kernels receive the per-tensor scale (broadcast by XLA)."""
  return load_row_vectors(vec_gmem, vec_smem, barrier)[0]


def load_row_vectors(vec_gmem, vec_smem, barrier) -> list[jax.Array]:
  """Each row of an [n, bm] GMEM array as a [bm] vector in the row layout of a wgmma tile (one
  TMA copy for all n): the backward kernel's row keys (and, in the flat view, pair offsets)."""
  plgpu.copy_gmem_to_smem(vec_gmem, vec_smem, barrier)
  plgpu.barrier_wait(barrier)
  return [plgpu.load(vec_smem.at[i], layout=plgpu.Layout.WGMMA.reduce(1)) for i in range(vec_smem.shape[0])]


def check_tensor_scale(tensor_scale, name: str) -> None:
  if tensor_scale is not None and (jnp.ndim(tensor_scale) != 0 or jnp.dtype(tensor_scale.dtype) != jnp.float32):
    raise ValueError(f"{name}: tensor_scale must be a float32 scalar (numerics.tensor_outer_scale of the tensor's "
                     f"amax), got {jnp.dtype(tensor_scale.dtype)}{jnp.shape(tensor_scale)}.")


def _check_input(x, block_rows: int, name: str):
  if x.ndim != 2:
    raise ValueError(f"{name}: expected a 2-D array [R, K], got shape {x.shape}; reshape leading axes into R.")
  if x.dtype not in (jnp.bfloat16, jnp.float32):
    raise ValueError(f"{name}: dtype {x.dtype} not supported; pass bfloat16 or float32.")
  if block_rows % 64:
    raise ValueError(f"{name}: block_rows={block_rows} must be a multiple of 64 (wgmma register layout).")
  r, k = x.shape
  if r % block_rows or k % OUTER:
    raise ValueError(f"{name}: shape {x.shape} needs R % {block_rows} == 0 and K % {OUTER} == 0; "
                     "pad (zeros change no scale) or use tetrajet_jax.numerics.quantize_nvfp4.")


def can_use_pallas_quantizer(shape: tuple[int, ...], dtype, *, block_rows: int = 64) -> bool:
  """True when quantize_nvfp4_rtn runs here (Hopper GPU) for this 2-D shape and dtype."""
  return (_platform.hopper_available() and len(shape) == 2 and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float32)
          and shape[0] % block_rows == 0 and shape[1] % OUTER == 0 and shape[1] > 0)


def quantize_nvfp4_rtn_reference(x: jax.Array) -> NVFP4Tensor:
  """The XLA quantizer the kernel must match bitwise."""
  return quantize_nvfp4(x, axis=-1)
