"""Counter-based random bits for stochastic rounding (one generator for every backend).

The XLA quantizer and the fused Pallas backward kernel draw their stochastic
rounding bits from this generator, so for the same seed and the same scaled
values they produce the same codes bitwise. It is stateless: the bits of an
element are a function of (seed, canonical row, canonical column) only, so
any tiling or K split of a kernel gives the same bits.

For element (row r, column k) of a quantized tensor in canonical layout
(quantized axis last, flattened leading axes = rows):
  row_key = fmix32(fmix32(seed ^ 0x9E3779B9) + fmix32(r ^ 0x7F4A7C15))
  h       = fmix32(fmix32(row_key ^ ((k >> 1) * 0x9E3779B9)) + row_key)
  bits    = h & 0xFFFF (k even) or h >> 16 (k odd)
with fmix32 MurmurHash3's 32-bit finalizer (a bijection of uint32). One hash
serves the two elements of a packed byte; each gets 16 random bits. For a
fixed row, the pair index -> h map is a bijection, so no two pairs of a row
share bits; rows differ through row_key.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

SR_BITS = 16  # random bits per element
_GOLDEN = 0x9E3779B9
_ROW_SALT = 0x7F4A7C15


def _u32(v: int) -> jax.Array:
  return jnp.uint32(v & 0xFFFFFFFF)


def fmix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finalizer (a bijection of uint32), in uint32 arithmetic."""
  h = h ^ (h >> 16)
  h = h * _u32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * _u32(0xC2B2AE35)
  return h ^ (h >> 16)


def sr_seed(key: jax.Array) -> jax.Array:
  """The generator's uint32 seed drawn from a JAX PRNG key (typed or raw)."""
  return jax.random.bits(key, (), jnp.uint32)


@functools.partial(jax.jit, static_argnames="rows")  # traced once per row count
def row_keys(seed: jax.typing.ArrayLike, rows: int) -> jax.Array:
  """uint32 [rows]: the per-row keys of the generator (module docstring)."""
  seed = jnp.asarray(seed).astype(jnp.uint32)
  r = jnp.arange(rows, dtype=jnp.uint32)
  return fmix32(fmix32(seed ^ _u32(_GOLDEN)) + fmix32(r ^ _u32(_ROW_SALT)))


def pair_hash(row_key: jax.Array, pair: jax.Array) -> jax.Array:
  """uint32 hash of element pair `pair` (columns 2 pair, 2 pair + 1) of a row; uint32 inputs."""
  return fmix32(fmix32(row_key ^ (pair * _u32(_GOLDEN))) + row_key)


def low_bits(h: jax.Array) -> jax.Array:
  """The even element's 16 bits of a pair hash (uint32 in [0, 2^16))."""
  return h & _u32(0xFFFF)


def high_bits(h: jax.Array) -> jax.Array:
  """The odd element's 16 bits of a pair hash (uint32 in [0, 2^16))."""
  return h >> 16


def element_bits(seed: jax.typing.ArrayLike, shape: tuple[int, ...]) -> jax.Array:
  """uint32 [*shape], values in [0, 2^16): the random bits of every element of a
  canonical array of `shape` (last axis = quantized axis, even length)."""
  *lead, k = shape
  if k % 2:
    raise ValueError(f"element_bits: the last axis must have even length (packed pairs), got shape {shape}.")
  rows = int(np.prod(lead, dtype=np.int64))
  keys = row_keys(seed, rows).reshape(*lead, 1)  # [..., 1]
  h = pair_hash(keys, jnp.arange(k // 2, dtype=jnp.uint32))  # [..., K/2]
  return jnp.stack([low_bits(h), high_bits(h)], axis=-1).reshape(shape)  # element 2i low, 2i + 1 high


__all__ = ["SR_BITS", "fmix32", "sr_seed", "row_keys", "pair_hash", "low_bits", "high_bits", "element_bits"]
