"""Tiles in and out of the Pallas Triton quantizer kernels (`nvfp4_quantize_triton`): a tile
as sixteen tensors, one per element position j of the inner blocks, all in one layout, so that
every thread holds whole inner blocks; and back (`join_last`, for the kernels that write values)."""

from __future__ import annotations

import jax
import jax.experimental.pallas as pl
import jax.numpy as jnp
from jax import lax

from tetrajet_jax.numerics.e2m1 import decode_e2m1
from tetrajet_jax.numerics.nvfp4 import INNER_BLOCK


def split_last(x: jax.Array) -> list[jax.Array]:
  """x [..., w] (w a power of two) as w tensors [...], element e of the last axis in entry e, by
  size-2 splits only (what Triton's split takes), each tensor in the layout of x's leading axes."""
  if x.shape[-1] == 1:
    return [x.reshape(x.shape[:-1])]
  even, odd = lax.unstack(x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2), axis=x.ndim)
  return [t for pair in zip(split_last(even), split_last(odd)) for t in pair]


def join_last(xs: list[jax.Array]) -> jax.Array:
  """The inverse of `split_last`: w tensors [...] (w a power of two) as x [..., w] with entry e at
  element e of the last axis, by size-2 joins only (what Triton's join takes)."""
  if len(xs) == 1:
    return xs[0][..., None]
  pairs = lax.stack([join_last(xs[0::2]), join_last(xs[1::2])], axis=-1)  # [..., w/2, 2]
  return pairs.reshape(*pairs.shape[:-2], 2 * pairs.shape[-2])


def load_rows(x_ref, signs_ref=None) -> list[jax.Array]:
  """A tile of x [R, K] viewed [R, K/16, 16] (x_ref [bm, 8, 16]) as 16 float32 [bm, 8]: element j
  of every inner block, times signs_ref[j] where given.

  Each load x_ref[:, :, w q : w (q + 1)] is one 16-byte vector per (row, block) in one thread (w = 4
  float32 or 8 bfloat16 elements), and the loads get the same layout, so a block's 16 elements sit
  in one thread."""
  width = 16 // x_ref.dtype.itemsize
  xs = []
  for q in range(INNER_BLOCK // width):
    xs += split_last(x_ref[:, :, pl.ds(width * q, width)].astype(jnp.float32))  # width of [bm, 8]
  return xs if signs_ref is None else [x * signs_ref[j] for j, x in enumerate(xs)]


def load_columns(x_ref, signs_ref) -> list[jax.Array]:
  """A tile of x [T, C] viewed [T/16, 16, C] (x_ref [8, 16, bm]) as 16 float32 [8, bm]: element j
  of every inner block along T, times signs_ref[j]. Slice j is eight rows of bm contiguous columns
  (a coalesced load), and the 16 slices get one layout, so a block's 16 elements sit in one thread
  and the tile is never transposed."""
  return [x_ref[:, j, :].astype(jnp.float32) * signs_ref[j] for j in range(INNER_BLOCK)]


def load_decoded_columns(codes_ref, s_in_ref, s_out_ref, signs_ref) -> list[jax.Array]:
  """`load_columns` of X_hat = (q s_in) s_out, decoded from a tensor quantized along its last
  axis, as `dequantize_nvfp4_canonical` computes it: codes_ref [8, 16, bm/2] (the bytes of bm
  channels, channel 2p in the low nibble), s_in_ref [8, 16, bm/16] and s_out_ref [8, 16, 1]
  (float32). Reads half a byte per element where X_hat in float32 takes four, twice."""
  return _decode_columns([(codes_ref[:, j, :], s_in_ref[:, j, :], s_out_ref[:, j, 0], signs_ref[j])
                          for j in range(INNER_BLOCK)])


@jax.jit  # traced once per tile shape, as the kernels' other array steps (nvfp4_quantize_triton)
def _decode_columns(loaded: list[tuple[jax.Array, ...]]) -> list[jax.Array]:
  """`load_decoded_columns` of the loaded slices: per element j of the blocks, the packed codes
  [8, bm/2], inner scales [8, bm/16], outer scales [8] and the sign."""
  xs = []
  for pairs, s_in, s_out, sign in loaded:
    pairs = pairs.astype(jnp.uint32)
    codes = lax.stack([pairs & jnp.uint32(0xF), pairs >> 4], axis=-1)  # [8, bm/2, 2]
    codes = codes.reshape(pairs.shape[0], 2 * pairs.shape[1])
    s_in = lax.broadcast_in_dim(s_in, (*s_in.shape, INNER_BLOCK), (0, 1)).reshape(codes.shape)  # per 16 channels
    s_out = lax.broadcast_in_dim(s_out, codes.shape, (0,))
    xs.append(((decode_e2m1(codes) * s_in) * s_out) * sign)
  return xs
