"""Fused backward NVFP4 quantizer: RHT-16, double-block scales, stochastic rounding.

Computes, in one read of the input, the operands Q3..Q6 of the TetraJet-v2
backward (docs/SPEC.md section 2): y = (1/4) H16 diag(signs) x on every 16-chunk along
the quantized axis, then the double-block scales of y exactly as
`tetrajet_jax.numerics.quantize_nvfp4` computes them (docs/SPEC.md section 1, same
formulas and divisions as `nvfp4_quantize.py`), then unbiased stochastic
rounding with the counter-based random bits the XLA quantizer uses.

Axis: `axis=-1` quantizes along the last axis (dY along N, W_hat^T along N);
`axis=0` quantizes along the first axis (dY^T and X_hat^T along tokens M) and
writes the canonical layout of the transposed array, [cols, rows/2] codes, with
no transposed copy in HBM: the transposition happens inside wgmma, which reads
its A operand MN-major from shared memory.

The transform runs on the tensor cores. One 128-wide block of a row is
multiplied by the constant [128, 128] matrix blockdiag((1/4) H16 D)^T, whose
entries (+-1/4, 0) are exact in bf16, with FP32 accumulation. bf16 inputs are
exact bf16 wgmma operands; float32 inputs are split into three bf16 parts by
bit masks, x = hi + mid + lo exactly (8 + 8 + 8 significand bits; no rounding
anywhere in the split), and three wgmmas accumulate into one FP32 accumulator.
So every product is exact and only the FP32 accumulation rounds: the result
equals the butterfly of `random_hadamard_16` up to FP32 accumulation order
(a few ulps of the chunk's magnitude; bitwise wherever the sums are exact).
The matrix's output columns are permuted (even elements first, then odd), so
the two elements of a packed byte land in the same thread at the same register
position and are packed without shuffles.

Random bits: the counter-based generator of `tetrajet_jax.numerics.counter_rng`
(the one the XLA quantizer uses): row keys computed by XLA, one 32-bit hash
per element pair in the kernel, 16 bits per element. With r = 1 / s the
block's correctly rounded reciprocal and v = |y| r (one float32 product), the
element steps from its lower E2M1 neighbour lo up iff v > lo + (bits + 1/2)
2^-16 gap (`numerics.e2m1.stochastic_index`: one exact compare), so
P(up) = (v - lo) / gap to within 2^-17 and a value on the grid is kept. For
the same seed and the same transformed values y, the codes equal
`quantize_nvfp4(y, rounding="stochastic")`'s bitwise (seed =
counter_rng.sr_seed(key)).

Scale layout and NaN/Inf: as the RTN kernel (a block holding NaN/Inf gets NaN
scales and zero codes, like the reference; note the dense 128-wide transform
spreads a non-finite input over its whole 128-block, which the reference
marks NaN anyway).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np
from jax import lax

from tetrajet_jax.kernels import _backward_io, _flat_rows, _platform
from tetrajet_jax.kernels._rht_operands import split3, transform_block, transform_matrix
from tetrajet_jax.kernels.nvfp4_quantize import (INNER, OUTER, Division, Math, load_row_vector, load_row_vectors,
                                                 packed_store,
                                                 quantize_tile, row_vector_scratch, rtn_rounding, store_trivial_tile,
                                                 tile_abs_max)
from tetrajet_jax.numerics import NVFP4Tensor, quantize_nvfp4, random_hadamard_16
from tetrajet_jax.numerics.checks import pad_axis_to_multiple
from tetrajet_jax.numerics.counter_rng import high_bits, low_bits, pair_hash, row_keys
from tetrajet_jax.numerics.e2m1 import stochastic_index

# Where the quantizer reads the transformed tile (`quantize_nvfp4_backward`'s _tile_source).
TileSource = Literal["smem", "registers", "blocks"]
Rounding = Literal["stochastic", "nearest"]


def _sr_rounding(key_rows, col0, pair_rows=None):
  """round_parts of `quantize_tile` for stochastic rounding of one [bm, 128] block per row whose
  parts are the even and odd elements of inner block c: one hash per (even, odd) pair, its low
  16 bits for the even element and its high 16 for the odd (counter_rng; pair index = column // 2,
  plus the row's pair offset where given: the flat view of `_flat_rows`)."""
  def round_parts(c, scaled):
    ev, od = scaled
    bm = ev.shape[0]
    i = plgpu.layout_cast(lax.broadcasted_iota(jnp.int32, (bm, INNER // 2), 1), plgpu.Layout.WGMMA)
    keys = lax.broadcast_in_dim(key_rows, (bm, INNER // 2), [0])
    pair = (i + (col0 + c * INNER) // 2).astype(jnp.uint32)
    if pair_rows is not None:
      pair = pair + lax.broadcast_in_dim(pair_rows, (bm, INNER // 2), [0])
    h = pair_hash(keys, pair)
    return [stochastic_index(ev, low_bits(h)), stochastic_index(od, high_bits(h))]
  return round_parts


def _block_transform(x_smem, split_smem, b_op, a_op, *, axis: int, block: int, f32_in: bool,
                     optimized_f32_load: bool):
  """pairs(c) of `quantize_tile` for the "blocks" tile source: inner block c transformed by its
  own wgmma (M = block, N = K = 16) against the one [16, 16] block of the transform, read from
  that wgmma's accumulator (its first 8 columns are the block's even outputs, the last 8 its odd
  ones). The dense [128, 128] transform multiplies each output by 112 zeros too; here each
  output's 16 products are summed by one K = 16 step, as the dense wgmma's only nonzero step
  sums them, and the FP32 accumulator starts from zero in both: the same values.

  float32 input is split into its three bf16 parts once per tile (all three kept in split_smem,
  since the quantizer reads each block twice: amax, then rounding); they accumulate hi, mid, lo
  in that order, as in the dense path."""
  if f32_in:
    xf = plgpu.load(x_smem, layout=plgpu.Layout.WGMMA, optimized=optimized_f32_load)
    for p, part in enumerate(split3(xf)):
      split_smem[p] = part.astype(jnp.bfloat16)
    plgpu.commit_smem()
    sources = [split_smem.at[p] for p in range(3)]
  else:
    sources = [x_smem]

  def block_of(ref, c):
    start = c * INNER if isinstance(c, int) else pl.multiple_of(c * INNER, INNER)
    return ref.at[:, pl.ds(start, INNER)] if axis == 1 else ref.at[pl.ds(start, INNER), :]

  def pairs(c):
    def mma(acc_ref):
      for src in sources:
        plgpu.wgmma(acc_ref, a_op(block_of(src, c)), b_op)
      return acc_ref[...]
    y = pl.run_scoped(mma, plgpu.ACC((block, INNER), jnp.float32))
    return y[:, :INNER // 2], y[:, INNER // 2:]
  return pairs


def quantize_nvfp4_backward(x: jax.Array, signs_16: jax.Array | None, seed: jax.Array | None, *, axis: int = -1,
                            rounding: Rounding = "stochastic", tensor_scale: jax.Array | None = None,
                            block: int = 64, max_concurrent_steps: int = 2, emit_operand: bool = False,
                            emit_transformed: bool = False, k_splits: int | None = None, flat_rows: bool = False,
                            interpret: bool = False, _division: Division = "exact", _math: Math = "full",
                            _tile_source: TileSource = "blocks",
                            _semantics: _platform.Semantics = _platform.DEFAULT_SEMANTICS):
  """The backward quantizer of a 2-D array in one pass: RHT-16 (or none), NVFP4 scales
  (double-block, or under a given per-tensor scale), stochastic rounding (or RTN).

  TetraJet-v2's Q3..Q6 are RHT + double-block + SR (the defaults); NVIDIA's
  recipe uses tensor scaling with SR and no RHT (dY along N), SR + RHT (dY^T)
  and RTN + RHT (X^T).

  Args:
    x: bf16 or f32 [R, C]. axis=-1: R % block == 0, C % 128 == 0. axis=0:
      C % block == 0; R is zero-padded to a multiple of 128 (a copy only when
      R % 128 != 0), as the linear layer pads tokens.
    signs_16: the 16 RHT signs (+-1), e.g. `hadamard_signs(key)`; None: no
      transform (y = x exactly).
    seed: integer scalar (uint32 range) selecting the SR random bits
      (counter_rng; `counter_rng.sr_seed(key)` derives it from a PRNG key);
      None with rounding="nearest".
    axis: -1/1 (quantize along columns) or 0 (along rows; output is the
      canonical layout of x^T).
    rounding: "stochastic" (needs seed) or "nearest".
    tensor_scale: None for double-block scaling; a float32 scalar for tensor
      scaling: `numerics.tensor_outer_scale` of the amax of the transformed
      values (`transformed_amax` with the same signs and axis).
    block: canonical output rows per CTA (multiple of 64).
    max_concurrent_steps: TMA pipeline depth along the quantized axis.
    emit_operand: also return the exact bf16 operand q * s_in [rows, Kp].
    emit_transformed: also return the transformed values y (f32, canonical
      [rows, Kp]) the scales were computed from (for tests and debugging).
    k_splits: CTAs per block of output rows along the quantized axis (a
      divisor of Kp / 128; default: enough for four CTAs per SM,
      `_platform.k_splits`). Results do not depend on it: the random bits
      are a function of the canonical element position.
    flat_rows: (axis=-1) quantize x as its row-major view of 128-wide rows,
      zero-padded to a power-of-two bucket (`_flat_rows`), each flat row
      drawing its original row's random bits: the same result, and every
      small tensor of a bucket runs one kernel instance.
    interpret: run on the CPU in Mosaic GPU's interpreter.
    _division, _math: timing only (experiments.bench's attribution rows),
      results NOT the reference's: _division="hardware" divides each element
      by its scale with the plain x / s (scales stay exact); _math="none"
      keeps grid, TMA pipeline and stores but skips the transform and all
      tile math (codes and scales from the row keys: the memory ceiling).
    _tile_source: where the quantizer reads the transformed tile (docs/KERNELS.md):
      "blocks" (default: one K=16 wgmma per inner block, `_block_transform`),
      "smem" (the dense [128, 128] transform's tile written back to SMEM) or
      "registers" (sliced from the dense accumulator). Same results bitwise;
      `python -m experiments.bench kernels --only bwdquant` times all three.
    _semantics: Mosaic GPU's lowering semantics, "warpgroup" or "lane"
      (`_platform.quantizer_params`): the same kernel, lowered faster by lane.

  Returns:
    NVFP4Tensor equal to `quantize_nvfp4(y, axis=-1, rounding=rounding,
    key=sr_key, scaling=...)` (canonical layout) bitwise for y the kernel's
    transformed values and seed = counter_rng.sr_seed(sr_key): same scales,
    same random bits, same codes. y equals random_hadamard_16(x, key,
    axis=axis) up to FP32 accumulation order (x itself without signs). Then
    (if asked) the bf16 operand, then y.
  """
  if isinstance(seed, int):  # a Python int may not fit jit's int32 for it
    seed = np.uint32(seed)
  _backward_io.check_seed(seed, rounding, "quantize_nvfp4_backward")
  opts = dict(axis=axis, rounding=rounding, amax_only=False, block=block, max_concurrent_steps=max_concurrent_steps,
              emit_operand=emit_operand, emit_transformed=emit_transformed, k_splits=k_splits, interpret=interpret,
              _division=_division, _math=_math, _tile_source=_tile_source, _semantics=_semantics)
  if flat_rows:
    return _flat_view(x, signs_16, seed, tensor_scale, opts)
  keys = None
  if seed is not None and jnp.ndim(x) == 2:  # other ranks: the instance raises before reading keys
    keys = row_keys(seed, jnp.shape(x)[1] if axis == 0 else jnp.shape(x)[0]).reshape(1, -1)
  return _backward_instance(x, signs_16, keys, tensor_scale, **opts)


def _flat_view(x, signs_16, seed, tensor_scale, opts: dict):
  """`quantize_nvfp4_backward` with flat_rows: the instance on `_flat_rows.to_flat(x)`, each
  flat row with its original row's key and pair offset, and the results rejoined."""
  shape = tuple(jnp.shape(x))
  _flat_rows.check_flat_shape(shape, "quantize_nvfp4_backward")
  if opts["axis"] not in (-1, 1):
    raise ValueError(f"quantize_nvfp4_backward: flat_rows quantizes along the last axis; got axis={opts['axis']}.")
  keys = None if seed is None else _flat_rows.row_keys_and_offsets(seed, shape)
  out = _backward_instance(_flat_rows.to_flat(x), signs_16, keys, tensor_scale, **opts)
  return _flat_rows.rejoin(out, shape)


def transformed_amax(x: jax.Array, signs_16: jax.Array | None, *, axis: int = -1, block: int = 64,
                     max_concurrent_steps: int = 2, k_splits: int | None = None, interpret: bool = False) -> jax.Array:
  """max |y| over the whole tensor (float32 scalar; NaN/Inf propagate) for y the transform
  `quantize_nvfp4_backward` applies with the same signs and axis: the amax a tensor-scaled
  quantization of y needs before any block can be quantized. One read of x; the kernel writes
  one amax per 128-block row and XLA reduces those."""
  amax = _backward_instance(x, signs_16, None, None, axis=axis, rounding="nearest", amax_only=True, block=block,
                            max_concurrent_steps=max_concurrent_steps, emit_operand=False, emit_transformed=False,
                            k_splits=k_splits, interpret=interpret, _division="exact", _math="full",
                            _tile_source="registers", _semantics=_platform.DEFAULT_SEMANTICS)
  return jnp.max(amax)


@_platform.one_lowering_per_instance("axis", "rounding", "amax_only", "block", "max_concurrent_steps", "emit_operand",
                                     "emit_transformed", "k_splits", "interpret", "_division", "_math", "_tile_source",
                                     "_semantics")
def _backward_instance(x, signs_16, keys, tensor_scale, *, axis: int, rounding: Rounding, amax_only: bool,
                       block: int, max_concurrent_steps: int, emit_operand: bool, emit_transformed: bool,
                       k_splits: int | None, interpret: bool, _division: Division, _math: Math,
                       _tile_source: TileSource, _semantics: _platform.Semantics):
  """The kernel instance behind `quantize_nvfp4_backward` and `transformed_amax` (amax_only).
  keys: uint32 [1, rows] row keys of the canonical rows (stochastic rounding; `row_keys`), or
  [2, rows] row keys and pair offsets (the flat view); None for RTN."""
  shape = tuple(jnp.shape(x))  # the logical shape (before axis 0's token padding)
  x, axis, r, k = _backward_io.checked_input(x, signs_16, axis=axis, block=block, emit_transformed=emit_transformed,
                                 _division=_division, _math=_math, _tile_source=_tile_source,
                                 tensor_scale=tensor_scale, _semantics=_semantics,
                                 name="transformed_amax" if amax_only else "quantize_nvfp4_backward")
  sr = rounding == "stochastic"
  tensor = tensor_scale is not None
  blocks = _tile_source == "blocks"
  y_in_smem = not amax_only and (_tile_source == "smem" or emit_transformed)
  kb = k // OUTER
  dtype = x.dtype
  f32_in = dtype == jnp.float32
  inputs = [x, transform_block(signs_16) if blocks else transform_matrix(signs_16)]
  if sr:
    inputs.append(keys)
  if tensor:
    inputs.append(jnp.broadcast_to(tensor_scale.astype(jnp.float32), (1, block)))

  out_shape, out_blocks, n_out = _backward_io.output_specs(r, k, block, emit_operand=emit_operand,
                                               emit_transformed=emit_transformed, amax_only=amax_only)
  # Input tile in SMEM: [block, 128] (axis=-1) or [128, block] (axis=0, read MN-major by wgmma).
  in_block = (block, OUTER) if axis == 1 else (OUTER, block)
  # The wgmma A operand's SMEM layout. The per-block transform's B operand is [16, 16] (32-byte
  # rows), and wgmma needs A's swizzle to match B's: 16-wide tiles, 32-byte swizzle (which also
  # lets it slice A every 16 elements along the minor axis for axis=-1).
  a_transforms = _platform.swizzled(jnp.bfloat16, INNER if blocks else in_block[1])
  x_transforms = () if f32_in else a_transforms
  splits = _platform.k_splits(r // block, kb, interpret, k_splits)
  kb_part = kb // splits  # 128-blocks per CTA

  def kernel(x_gmem, bt_gmem, *refs):
    refs = list(refs)
    keys_gmem = refs.pop(0) if sr else None
    scale_gmem = refs.pop(0) if tensor else None
    outs_gmem = refs[:n_out]
    y_gmem = refs[n_out] if emit_transformed else None
    refs = refs[n_out + int(emit_transformed):]
    outs_smem = refs[:n_out]
    bt_smem, bar_bt, *extra = refs[n_out:]
    keys_smem, bar_keys = (extra.pop(0), extra.pop(0)) if sr else (None, None)
    scale_refs = (extra.pop(0), extra.pop(0)) if tensor else None
    y_smem = extra.pop(0) if y_in_smem else None
    split_smem = extra.pop(0) if f32_in else None  # blocks: [3, *in_block], all three parts at once
    rows = pl.ds(lax.axis_index("rows") * block, block)
    j0 = lax.axis_index("k") * kb_part  # this CTA's first 128-block
    plgpu.copy_gmem_to_smem(bt_gmem, bt_smem, bar_bt)
    key_rows = pair_rows = None
    if sr:  # uint32 [block] each: the rows' keys and (flat view) pair offsets
      key_rows, *pair_rows = load_row_vectors(keys_gmem.at[:, rows], keys_smem, bar_keys)
      pair_rows = pair_rows[0] if pair_rows else None
    s_tensor = load_row_vector(scale_gmem, *scale_refs) if tensor else None  # float32 [block]
    plgpu.barrier_wait(bar_bt)
    b_op = bt_smem.transpose((1, 0))  # [K=128 in, N=128 out]

    def copy_out(j, slot):
      if amax_only:
        dsts = [outs_gmem[0].at[pl.ds(j, 1), rows]]
      else:
        dsts = [outs_gmem[0].at[rows, pl.ds(j * (OUTER // 2), OUTER // 2)],
                outs_gmem[1].at[pl.ds(j * (OUTER // INNER), OUTER // INNER), rows],
                outs_gmem[2].at[pl.ds(j, 1), rows]]
        if emit_operand:
          dsts.append(outs_gmem[3].at[rows, pl.ds(j * (OUTER // 2), OUTER // 2)])
      for src, dst in zip(outs_smem, dsts):
        plgpu.copy_smem_to_gmem(src.at[slot], dst)

    def step(idx, x_smem):
      (jl,) = idx
      slot = lax.rem(jl, 2)
      j = j0 + jl
      if _math == "none":  # the input still arrives in SMEM by TMA; registers get only the row keys
        plgpu.wait_smem_to_gmem(1, wait_read_only=True)
        raw = plgpu.layout_cast(lax.broadcasted_iota(jnp.uint32, (block, INNER // 2), 1), plgpu.Layout.WGMMA)
        if sr:
          raw = raw + lax.broadcast_in_dim(key_rows, (block, INNER // 2), [0])
        store_trivial_tile([raw] * (OUTER // INNER), block, *(o.at[slot] for o in outs_smem))
        plgpu.commit_smem()
        copy_out(j, slot)
        return

      def a_op(ref):
        return ref if axis == 1 else ref.transpose((1, 0))

      if blocks:
        pairs = _block_transform(x_smem, split_smem, b_op, a_op, axis=axis, block=block, f32_in=f32_in,
                                 optimized_f32_load=_semantics == "warpgroup")
        if emit_transformed:  # y_smem in the dense layout (even outputs of the 128-block first)
          plgpu.wait_smem_to_gmem(0, wait_read_only=True)
          for c in range(OUTER // INNER):
            ev, od = pairs(c)
            y_smem[:, pl.ds(c * (INNER // 2), INNER // 2)] = ev
            y_smem[:, pl.ds(OUTER // 2 + c * (INNER // 2), INNER // 2)] = od
          plgpu.commit_smem()
        _quantize_and_store(pairs, slot, j)
        return

      def mma(acc_ref):
        if f32_in:
          # Lane semantics finds no bank-conflict-free transfer plan for this f32 tile.
          xf = plgpu.load(x_smem, layout=plgpu.Layout.WGMMA, optimized=_semantics == "warpgroup")
          for part in split3(xf):
            split_smem[...] = part.astype(jnp.bfloat16)
            plgpu.commit_smem()
            plgpu.wgmma(acc_ref, a_op(split_smem), b_op)
            plgpu.wgmma_wait(0)  # split_smem is rewritten next
        else:
          plgpu.wgmma(acc_ref, a_op(x_smem), b_op)
        return acc_ref[...]

      y = pl.run_scoped(mma, plgpu.ACC((block, OUTER), jnp.float32))
      half, w = OUTER // 2, INNER // 2
      if y_in_smem:
        if emit_transformed:
          plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous step's copy of y_smem is done
        y_smem[...] = y
        plgpu.commit_smem()
      if amax_only or _tile_source == "registers":  # inner block c: columns [8c, 8c+8) and [64+8c, 64+8c+8)
        pairs = lambda c: (y[:, c * w:(c + 1) * w], y[:, half + c * w:half + (c + 1) * w])
      else:  # read back in [block, 8] slices (the RTN kernel's load pattern)
        # optimized=False: no bank-conflict-free plan with a loop-indexed offset (nvfp4_quantize).
        load = lambda col: plgpu.load(y_smem.at[:, pl.ds(col, w)], layout=plgpu.Layout.WGMMA, optimized=False)
        pairs = lambda c: (load(c * w), load(half + c * w))
      _quantize_and_store(pairs, slot, j)

    def _quantize_and_store(pairs, slot, j):
      """Quantizes the transformed tile (pairs(c): inner block c's even and odd outputs) into
      this step's output slot and copies it out."""
      plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this slot's previous copy has read SMEM
      if amax_only:
        outs_smem[0].at[slot][0, :] = tile_abs_max(pairs, unrolled=not blocks)
      else:
        codes_s, s_in_s, s_out_s = outs_smem[0].at[slot], outs_smem[1].at[slot], outs_smem[2].at[slot]
        quantize_tile(pairs, _sr_rounding(key_rows, j * OUTER, pair_rows) if sr else rtn_rounding,
                      packed_store(codes_s, outs_smem[3].at[slot] if emit_operand else None), s_in_s, s_out_s,
                      interpret=interpret, with_operand=emit_operand, division=_division,
                      unrolled=_tile_source == "registers", tensor_s_out=s_tensor)
      plgpu.commit_smem()
      copy_out(j, slot)
      if emit_transformed:
        plgpu.copy_smem_to_gmem(y_smem, y_gmem.at[rows, pl.ds(j * OUTER, OUTER)])

    if axis == 1:
      spec = plgpu.BlockSpec(in_block, lambda j: (0, j), transforms=x_transforms)
      src = x_gmem.at[rows, pl.ds(j0 * OUTER, kb_part * OUTER)]
    else:
      spec = plgpu.BlockSpec(in_block, lambda j: (j, 0), transforms=x_transforms)
      src = x_gmem.at[pl.ds(j0 * OUTER, kb_part * OUTER), rows]
    plgpu.emit_pipeline(step, grid=(kb_part,), in_specs=[spec], max_concurrent_steps=max_concurrent_steps)(src)
    plgpu.wait_smem_to_gmem(0)

  scratch = [plgpu.SMEM((2, *blk), o.dtype) for blk, o in zip(out_blocks, out_shape)]
  t_side = INNER if blocks else OUTER  # the transform: one inner block's [16, 16], or the dense [128, 128]
  scratch += [plgpu.SMEM((t_side, t_side), jnp.bfloat16, transforms=_platform.swizzled(jnp.bfloat16, t_side)), plgpu.Barrier()]
  if sr:
    scratch += [plgpu.SMEM((keys.shape[0], block), jnp.uint32), plgpu.Barrier()]
  if tensor:
    scratch += row_vector_scratch(block)
  if y_in_smem:  # the transformed tile, for the SMEM tile source or the emitted y
    scratch.append(plgpu.SMEM((block, OUTER), jnp.float32))
  if f32_in:  # one bf16 part of the hi/mid/lo split at a time (blocks: all three)
    scratch.append(plgpu.SMEM((3, *in_block) if blocks else in_block, jnp.bfloat16, transforms=a_transforms))
  call = plgpu.kernel(kernel, out_type=tuple(out_shape), grid=(r // block, splits), grid_names=("rows", "k"),
                      scratch_types=scratch, compiler_params=_platform.quantizer_params(_semantics))
  with _platform.interpret_context(interpret):
    outs = call(*inputs)
  if amax_only:
    return outs[0]
  return _backward_io.assemble(outs, n_out, shape, axis, tensor_scale, emit_operand=emit_operand,
                   emit_transformed=emit_transformed)


def can_use_pallas_backward_quantizer(shape: tuple[int, ...], dtype, *, axis: int = -1, block: int = 64) -> bool:
  """True when quantize_nvfp4_backward runs here (Hopper GPU) for this 2-D shape, dtype and axis."""
  if not (_platform.hopper_available() and len(shape) == 2 and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float32)):
    return False
  if axis in (-1, 1):
    return shape[0] % block == 0 and shape[1] % OUTER == 0 and shape[1] > 0 and shape[0] > 0
  if axis == 0:
    return shape[1] % block == 0 and shape[1] > 0 and shape[0] > 0
  return False


def quantize_nvfp4_backward_reference(x: jax.Array, rht_key: jax.Array, sr_key: jax.Array, *,
                                    axis: int = -1) -> NVFP4Tensor:
  """The XLA path the kernel replaces (RHT with hadamard_signs(rht_key); SR bits from
  counter_rng seeded with sr_seed(sr_key), the kernel's generator: with
  seed = counter_rng.sr_seed(sr_key) the kernel draws the same bits)."""
  if axis == 0:
    x = pad_axis_to_multiple(jnp.asarray(x), 0, OUTER)
  return quantize_nvfp4(random_hadamard_16(x, rht_key, axis=axis), axis=axis, rounding="stochastic", key=sr_key)


__all__ = ["quantize_nvfp4_backward", "transformed_amax", "can_use_pallas_backward_quantizer",
           "quantize_nvfp4_backward_reference"]
