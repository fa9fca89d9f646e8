"""A Pallas (Mosaic GPU) TMA copy: the memory roofline the quantizer kernels are measured against.

An XLA elementwise op reads and writes the same bytes but reaches only about
half of the H200's copy bandwidth, so it flatters every kernel timed against
it; this copy moves the bytes with the same engine the kernels use.

Each CTA streams its rows through shared memory: TMA loads, pipelined
``max_concurrent_steps`` deep, and TMA stores straight from the loaded
buffer (no register pass), so the copy moves bytes at the rate the memory
system allows and nothing else.
"""

from __future__ import annotations

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
from jax import lax

from tetrajet_jax.kernels import hopper_available

TILE_BYTES = 32 * 1024


def tma_copy(x: jax.Array, *, block_rows: int = 128, block_cols: int = 128, max_concurrent_steps: int = 4,
             col_splits: int = 1, staged: bool = False, interpret: bool = False) -> jax.Array:
  """Returns a copy of the 2-D array ``x`` made by TMA loads and stores.

  Args:
    x: [R, C] with R % block_rows == 0 and C % (block_cols * col_splits) == 0.
    block_rows, block_cols: the tile one pipeline step moves.
    max_concurrent_steps: TMA loads in flight per CTA.
    col_splits: CTAs per row block (each streams its share of the columns),
      so short, wide arrays still fill every SM.
    staged: store from a second, pipelined shared-memory buffer (a register
      pass copies the tile) instead of straight from the loaded buffer, so no
      step waits for its store before the next load.
    interpret: run in Mosaic GPU's CPU interpreter.

  Raises:
    ValueError: x is not 2-D or its shape is not a multiple of the block.
  """
  if x.ndim != 2:
    raise ValueError(f"tma_copy: expected a 2-D array, got shape {x.shape}.")
  r, c = x.shape
  if r % block_rows or c % (block_cols * col_splits):
    raise ValueError(f"tma_copy: shape {x.shape} must be a multiple of ({block_rows}, "
                     f"{block_cols} x col_splits={col_splits}).")
  steps = c // block_cols // col_splits

  def kernel(x_gmem, o_gmem):
    rows = pl.ds(lax.axis_index("rows") * block_rows, block_rows)
    j0 = lax.axis_index("cols") * steps

    def step(idx, x_smem):
      (j,) = idx
      plgpu.copy_smem_to_gmem(x_smem, o_gmem.at[rows, pl.ds((j0 + j) * block_cols, block_cols)])
      plgpu.commit_smem()
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the slot may be refilled once the store has read it

    cols = pl.ds(j0 * block_cols, steps * block_cols)
    spec = plgpu.BlockSpec((block_rows, block_cols), lambda j: (0, j))
    if staged:
      def staged_step(idx, x_smem, o_smem):
        del idx
        o_smem[...] = x_smem[...]

      plgpu.emit_pipeline(staged_step, grid=(steps,), in_specs=[spec], out_specs=[spec],
                          max_concurrent_steps=max_concurrent_steps)(x_gmem.at[rows, cols], o_gmem.at[rows, cols])
      return
    plgpu.emit_pipeline(step, grid=(steps,), in_specs=[spec],
                        max_concurrent_steps=max_concurrent_steps)(x_gmem.at[rows, cols])
    plgpu.wait_smem_to_gmem(0)

  call = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(r // block_rows, col_splits),
                      grid_names=("rows", "cols"))
  if interpret:
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
      return call(x)
  return call(x)


def copy_fns(x: jax.Array) -> list[tuple[str, object]]:
  """The roofline copies for ``x``, as (name, fn): on a Hopper GPU, when the
  shape tiles, the TMA copy straight from the loaded buffer and the staged
  one (enough CTAs to fill the chip; the bench takes the faster as the
  roofline); elsewhere XLA's elementwise negate (same bytes read and written)."""
  rows, cols = x.shape if x.ndim == 2 else (0, 0)
  block_cols = TILE_BYTES // (128 * x.dtype.itemsize)  # 32 KiB tiles: four in flight fit in shared memory
  if hopper_available() and rows % 128 == 0 and cols % block_cols == 0 and rows and cols:
    steps = cols // block_cols
    splits = max(1, min(steps, 264 // max(rows // 128, 1)))  # about two CTAs per SM
    while steps % splits:
      splits -= 1
    return [(f"tma{'-staged' if staged else ''}",
             lambda v, staged=staged: tma_copy(v, block_cols=block_cols, col_splits=splits, staged=staged,
                                               max_concurrent_steps=3 if staged else 4))  # shared memory
            for staged in (False, True)]
  return [("xla", lambda v: -v)]
