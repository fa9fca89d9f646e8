"""One kernel instance for many small tensors: [R, K] quantized as flat 128-wide rows.

Every 128-block along the quantized axis is quantized on its own (its scales
depend on its 128 values only), so an [R, K] array quantized along K is the
same as its row-major view [R K / 128, 128] quantized along the last axis:
same codes, same scales, in the same bytes. Padding that view with zero rows
up to a bucket (a power of two, at least MIN_BUCKET_ROWS) makes every tensor
of a bucket the same kernel instance. A model's weights (Q2, Q4) then share
one RTN and one RHT + SR module instead of one per weight shape, which cuts
the Mosaic modules a train step lowers and compiles; the extra work is on
small tensors (a 20m model's largest weight is 6144 such rows).

Stochastic rounding stays bitwise the unflattened kernel's: its random bits
are a function of (canonical row, pair index) (`numerics.counter_rng`), so the
flat row of block j of row r gets row r's key and pair offset 64 j
(`row_keys_and_offsets`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tetrajet_jax.numerics import NVFP4Tensor
from tetrajet_jax.numerics.counter_rng import row_keys
from tetrajet_jax.numerics.nvfp4 import OUTER_BLOCK

# Smallest bucket: 2^13 rows of 128 (1 Mi elements) hold every weight of the 20m and 70m models.
MIN_BUCKET_ROWS = 8192


def bucket_rows(flat_rows: int) -> int:
  """Rows of the padded flat view: the next power of two, at least MIN_BUCKET_ROWS."""
  return max(MIN_BUCKET_ROWS, 1 << max(flat_rows - 1, 0).bit_length())


def check_flat_shape(shape: tuple[int, ...], name: str) -> None:
  """Raises ValueError unless `shape` is 2-D with a last axis that is a multiple of 128."""
  if len(shape) != 2 or shape[1] % OUTER_BLOCK:
    raise ValueError(f"{name}: flat_rows needs a 2-D array quantized along its last axis, a multiple of "
                     f"{OUTER_BLOCK}; got shape {tuple(shape)} (pad K first, as the linear layer does).")


def to_flat(x: jax.Array) -> jax.Array:
  """x [R, K] as [bucket_rows(R K / 128), 128]: the row-major view, zero rows appended
  (zeros change no scale of any real block)."""
  flat = x.reshape(-1, OUTER_BLOCK)
  return jnp.pad(flat, ((0, bucket_rows(flat.shape[0]) - flat.shape[0]), (0, 0)))


def row_keys_and_offsets(seed: jax.Array, shape: tuple[int, int]) -> jax.Array:
  """uint32 [2, bucket rows]: for flat row i = r K/128 + j, row r's counter_rng key and the pair
  index of its first element, 64 j, so the kernel draws the bits of the unflattened tensor."""
  r, k = shape
  per_row = k // OUTER_BLOCK
  keys = jnp.repeat(row_keys(seed, r), per_row)
  offsets = jnp.tile(jnp.arange(per_row, dtype=jnp.uint32) * (OUTER_BLOCK // 2), r)
  pad = bucket_rows(r * per_row) - r * per_row
  return jnp.pad(jnp.stack([keys, offsets]), ((0, 0), (0, pad)))


def rejoin(out, shape: tuple[int, int]):
  """A kernel's result on the flat view (an NVFP4Tensor, or one followed by per-element extras
  such as the bf16 operand) as its result on the [R, K] array."""
  t, *extra = out if isinstance(out, tuple) else (out,)
  t = from_flat(t, shape)
  return (t, *(rows_from_flat(e, shape) for e in extra)) if extra else t


def from_flat(t: NVFP4Tensor, shape: tuple[int, int]) -> NVFP4Tensor:
  """The quantized flat view (canonical [bucket rows, 128]) as the quantization of the
  [R, K] array along its last axis: padding rows dropped, rows rejoined."""
  r, k = shape
  n = r * k // OUTER_BLOCK
  rejoin = lambda a: a[:n].reshape(r, -1)
  outer = t.scale_outer if t.scaling == "tensor" else rejoin(t.scale_outer)
  return NVFP4Tensor(codes=rejoin(t.codes), scale_inner=rejoin(t.scale_inner), scale_outer=outer, shape=(r, k),
                     axis=1, scaling=t.scaling, block_2d=False)


def rows_from_flat(a: jax.Array, shape: tuple[int, int]) -> jax.Array:
  """An extra per-element output of the flat view ([bucket rows, 128 c]) as [R, K c]."""
  r, k = shape
  return a[:r * k // OUTER_BLOCK].reshape(r, -1)
