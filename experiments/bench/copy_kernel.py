"""A Pallas (Mosaic GPU) TMA copy: the memory roofline the quantizer kernels are measured against.

An XLA elementwise op reads and writes the same bytes but reaches only about
half of the H200's copy bandwidth, so it flatters every kernel timed against
it; this copy moves the bytes with the same engine the kernels use. XLA's
plain buffer copy (what a framework's clone of the tensor runs) is timed
beside it, and the fastest of them is the roofline.

Each CTA streams its rows through shared memory: TMA loads, pipelined
``max_concurrent_steps`` deep, and TMA stores straight from the loaded
buffer (no register pass), so the copy moves bytes at the rate the memory
system allows and nothing else. ``store_delay`` lets that many stores stay
in flight: a slot is refilled only once the store that read it is done
(the pipeline releases an input slot ``store_delay`` steps late).
"""

from __future__ import annotations

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

from tetrajet_jax.kernels import hopper_available

# The roofline variants (name, tile bytes, pipeline depth, stores in flight, CTAs to aim for):
# shared memory per CTA is tile x depth (<= 227 KiB on Hopper). The bench times each and takes
# the fastest as the copy. A sweep of 12 shapes on the H200 (docs/notes/kernels.md) put
# 32 KiB tiles, depth 4, two stores in flight and ~8 CTAs per SM first.
COPY_VARIANTS = (("tma", 32 * 1024, 4, 0, 264), ("tma-d2", 32 * 1024, 4, 2, 1056),
                 ("tma-16k-d4", 16 * 1024, 8, 4, 1056))


def tma_copy(x: jax.Array, *, block_rows: int = 128, block_cols: int = 128, max_concurrent_steps: int = 4,
             col_splits: int = 1, store_delay: int = 0, interpret: bool = False) -> jax.Array:
  """Returns a copy of the 2-D array ``x`` made by TMA loads and stores.

  Args:
    x: [R, C] with R % block_rows == 0 and C % (block_cols * col_splits) == 0.
    block_rows, block_cols: the tile one pipeline step moves.
    max_concurrent_steps: TMA loads in flight per CTA.
    col_splits: CTAs per row block (each streams its share of the columns),
      so short, wide arrays still fill every SM.
    store_delay: stores left in flight after each step (< max_concurrent_steps);
      0: each step waits until its store has read the slot.
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
  if not 0 <= store_delay < max_concurrent_steps:
    raise ValueError(f"tma_copy: store_delay={store_delay} must be in [0, max_concurrent_steps="
                     f"{max_concurrent_steps}).")
  steps = c // block_cols // col_splits
  depth = min(max_concurrent_steps, steps)  # the pipeline never runs deeper than its steps
  store_delay = min(store_delay, depth - 1)

  def kernel(x_gmem, o_gmem):
    rows = pl.ds(lax.axis_index("rows") * block_rows, block_rows)
    j0 = lax.axis_index("cols") * steps

    def step(idx, x_smem):
      (j,) = idx
      plgpu.copy_smem_to_gmem(x_smem, o_gmem.at[rows, pl.ds((j0 + j) * block_cols, block_cols)])
      plgpu.commit_smem()
      # The slot the pipeline refills next was read by the store store_delay steps ago.
      plgpu.wait_smem_to_gmem(store_delay, wait_read_only=True)

    cols = pl.ds(j0 * block_cols, steps * block_cols)
    spec = plgpu.BlockSpec((block_rows, block_cols), lambda j: (0, j), delay_release=store_delay)
    plgpu.emit_pipeline(step, grid=(steps,), in_specs=[spec], max_concurrent_steps=depth)(x_gmem.at[rows, cols])
    plgpu.wait_smem_to_gmem(0)

  call = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(r // block_rows, col_splits),
                      grid_names=("rows", "cols"))
  if interpret:
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
      return call(x)
  return call(x)


def copy_fns(x: jax.Array) -> list[tuple[str, object]]:
  """The roofline copies for ``x``, as (name, fn): on a Hopper GPU, XLA's copy
  of the buffer (a device-to-device copy, what a framework's clone runs) and,
  when the shape tiles, each of `COPY_VARIANTS` (enough CTAs to fill the chip);
  the bench takes the fastest as the roofline. Elsewhere XLA's elementwise
  negate (same bytes read and written)."""
  rows, cols = x.shape if x.ndim == 2 else (0, 0)
  if not (hopper_available() and rows and rows % 128 == 0):
    return [("xla", lambda v: -v)]
  fns = [("xla-copy", jnp.copy)]
  for name, tile_bytes, depth, delay, ctas in COPY_VARIANTS:
    block_cols = tile_bytes // (128 * x.dtype.itemsize)
    if cols % block_cols:
      continue
    steps = cols // block_cols
    splits = max(1, min(steps, ctas // max(rows // 128, 1)))
    while steps % splits:
      splits -= 1
    fns.append((name, lambda v, bc=block_cols, sp=splits, d=depth, sd=delay: tma_copy(
        v, block_cols=bc, col_splits=sp, max_concurrent_steps=d, store_delay=sd)))
  return fns
