"""The FP4 element format E2M1: the grid, round-to-nearest-even, stochastic
rounding, and packing two codes per byte.

Code layout (the E2M1 bit encoding): bit 3 = sign, bits 0-2 = magnitude index
into E2M1_GRID = {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Zero is always encoded as +0
(code 0), so quantize(dequantize(q)) == q holds bitwise.

Rounding is done with comparisons against the grid's decision thresholds, not
with a float4 cast: comparisons cannot be elided by XLA under jit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

E2M1_MAX = 6.0
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
# Midpoints between neighbours; at a tie RNE goes to the even code (even
# magnitude index): 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_ROUNDS_UP = (False, True, False, True, False, True, False)
_INV_GAP = np.array([2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 0.5, 0.0], np.float32)  # 1 / (grid[i+1] - grid[i])


def _grid_lookup(idx: jax.Array) -> jax.Array:
  return jnp.asarray(E2M1_GRID)[idx.astype(jnp.int32)]


def _with_sign(idx: jax.Array, negative: jax.Array) -> jax.Array:
  idx = idx.astype(jnp.uint8)
  return jnp.where(negative & (idx > 0), idx | 0x8, idx).astype(jnp.uint8)


def round_e2m1_nearest(v: jax.Array) -> jax.Array:
  """E2M1 codes (uint8, 0..15) of v, round to nearest, ties to even, saturating at +-6.

  NaN maps to code 0 (callers mark a block holding NaN via its scale).
  """
  v = jnp.asarray(v, jnp.float32)
  a = jnp.abs(v)
  idx = jnp.zeros(v.shape, jnp.int32)
  for mid, up in zip(_MIDPOINTS, _TIE_ROUNDS_UP):
    idx += (a >= mid) if up else (a > mid)
  return _with_sign(idx, v < 0)


def round_e2m1_stochastic(v: jax.Array, key: jax.Array) -> jax.Array:
  """E2M1 codes of v with unbiased stochastic rounding: E[decode(code)] = v for |v| <= 6.

  Picks the upper grid neighbour with probability (|v| - lo) / (hi - lo).
  Values beyond +-6 saturate to +-6.
  """
  v = jnp.asarray(v, jnp.float32)
  a = jnp.minimum(jnp.abs(v), E2M1_MAX)
  lo_idx = jnp.zeros(v.shape, jnp.int32)
  for g in E2M1_GRID[1:]:
    lo_idx += a >= g
  lo = _grid_lookup(lo_idx)
  # (a - lo) / gap, as a multiplication by the gap's inverse (a power of two,
  # so exact; division is not correctly rounded on every backend). At 6 the
  # inverse is 0: nothing above to round to.
  p_up = (a - lo) * jnp.asarray(_INV_GAP)[lo_idx]
  u = jax.random.uniform(key, v.shape, jnp.float32)
  idx = lo_idx + (u < p_up).astype(jnp.int32)
  return _with_sign(idx, v < 0)


def decode_e2m1(codes: jax.Array) -> jax.Array:
  """float32 values of E2M1 codes (uint8, 0..15)."""
  codes = codes.astype(jnp.int32)
  mag = _grid_lookup(codes & 0x7)
  return jnp.where((codes & 0x8) != 0, -mag, mag)


def pack_e2m1(codes: jax.Array) -> jax.Array:
  """Packs codes [..., 2n] into bytes [..., n]: element 2i in the low nibble."""
  if codes.shape[-1] % 2:
    raise ValueError(f"pack_e2m1 needs an even last dimension, got {codes.shape}")
  c = codes.astype(jnp.uint8).reshape(*codes.shape[:-1], -1, 2)
  return (c[..., 0] | (c[..., 1] << 4)).astype(jnp.uint8)


def unpack_e2m1(packed: jax.Array) -> jax.Array:
  """Inverse of pack_e2m1: bytes [..., n] -> codes [..., 2n]."""
  lo = packed & 0xF
  hi = packed >> 4
  return jnp.stack([lo, hi], axis=-1).reshape(*packed.shape[:-1], -1).astype(jnp.uint8)
