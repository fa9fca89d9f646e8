"""The FP4 element format E2M1: the grid, round-to-nearest-even, stochastic
rounding, and packing two codes per byte.

Code layout (the E2M1 bit encoding): bit 3 = sign, bits 0-2 = magnitude index
into E2M1_GRID = {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Zero is always encoded as +0
(code 0), so quantize(dequantize(q)) == q holds bitwise.

Rounding is done with comparisons against the grid's decision thresholds, not
with a float4 cast: comparisons cannot be elided by XLA under jit.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

E2M1_MAX = 6.0
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
# Midpoints between neighbours; at a tie RNE goes to the even code (even
# magnitude index): 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_ROUNDS_UP = (False, True, False, True, False, True, False)
_INV_GAP = np.array([2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 0.5, 0.0], np.float32)  # 1 / (grid[i+1] - grid[i])


def _grid_lookup(idx: jax.Array) -> jax.Array:
  return jnp.asarray(E2M1_GRID)[idx.astype(jnp.int32)]


def with_sign(idx: jax.Array, negative: jax.Array) -> jax.Array:
  """E2M1 codes (uint8) of magnitude indices and signs; zero stays +0."""
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
  return with_sign(idx, v < 0)


class QuotientThresholds(NamedTuple):
  """Per-scale constants that decide round_e2m1_nearest(fl(|x| / s)) by exact
  comparisons (see nearest_index_of_quotient); every field has s's shape."""
  p: jax.Array  # 2^k with s' = s 2^k in [1, 2)
  hi: tuple  # per midpoint t: t s'_hi (exact: 3 x 21 significant bits)
  lo: tuple  # per midpoint t: t s'_lo (exact: 3 x 3 bits)
  bound: tuple  # per midpoint t: -2^(e_t - 24) s' (tie rounds up) or +2^(e_t - 24) s'


_F32_MIN_NORMAL = 2.0**-126


def quotient_thresholds(s: jax.Array) -> QuotientThresholds:
  """The constants of nearest_index_of_quotient for positive normal scales s (NaN s: index 0).

  The threshold test "fl(y) >= t" (tie up) or "fl(y) > t" (tie down) of RNE
  on the float32 quotient y = |x| / s is, with float32 rounding fl made
  explicit, "y >= t - 2^(e_t - 24)" or "y > t + 2^(e_t - 24)" on the real
  quotient (e_t = floor(log2 t); a midpoint t has a short significand, so
  its float32 neighbours are t -+ 2^(e_t - 23), and a real y halfway between
  rounds to t, the even one). Multiplied out: D = |x| - t s against
  -+2^(e_t - 24) s. With s' = s 2^k in [1, 2) split by bit mask into s'_hi
  (21 significant bits) + s'_lo (3), both products with t are exact, and
  D = (|x| 2^k - t s'_hi) - t s'_lo is exact wherever it is near the bound
  (Sterbenz, then a short difference); far from it both roundings keep its
  sign. So no division and no rounding decides anything.
  """
  s = jnp.asarray(s, jnp.float32)
  bits = lax.bitcast_convert_type(s, jnp.uint32)
  e = ((bits >> 23) & jnp.uint32(0xFF)).astype(jnp.int32)  # biased exponent of s, 1..254
  p = lax.bitcast_convert_type(((254 - e) << 23).astype(jnp.uint32), jnp.float32)  # 2^(127 - e)
  s1 = s * p  # in [1, 2), exact (NaN stays NaN)
  s_hi = lax.bitcast_convert_type(lax.bitcast_convert_type(s1, jnp.uint32) & jnp.uint32(0xFFFFFFF8), jnp.float32)
  s_lo = s1 - s_hi  # exact: the low 3 significand bits
  hi, lo, bound = [], [], []
  for t, up in zip(_MIDPOINTS, _TIE_ROUNDS_UP):
    half_gap = 2.0**(math.floor(math.log2(t)) - 24)
    hi.append(t * s_hi)
    lo.append(t * s_lo)
    bound.append(s1 * (-half_gap if up else half_gap))  # exact: times a power of two
  return QuotientThresholds(p, tuple(hi), tuple(lo), tuple(bound))


def nearest_index_of_quotient(ax: jax.Array, th: QuotientThresholds,
                              expand: Callable[[jax.Array], jax.Array] = lambda v: v) -> jax.Array:
  """Magnitude index (int32, 0..7) of round_e2m1_nearest(fl(ax / s)), bitwise
  the index of the correctly rounded float32 quotient (subnormal ax and
  subnormal quotients flushed to 0, as scales.div_rn), without dividing.

  ax = |x| (float32, >= 0 or NaN -> 0); th = quotient_thresholds(s); expand
  broadcasts a per-scale field to ax's shape (e.g. a row vector inside a
  kernel). About 30 operations per element, against ~60 for div_rn and the
  threshold compares; on XLA nothing here can be simplified away (compares
  and selects of exact values).
  """
  x1 = jnp.where(ax >= _F32_MIN_NORMAL, ax * expand(th.p), 0.0)  # |x| 2^k: exact (overflow -> inf -> 7)
  idx = jnp.zeros(ax.shape, jnp.int32)
  for i, (hi, lo, bound, up) in enumerate(zip(th.hi, th.lo, th.bound, _TIE_ROUNDS_UP)):
    d = (x1 - expand(hi)) - expand(lo)
    # The tests are monotone in i (each midpoint above the last), so later selects override.
    idx = jnp.where(d >= expand(bound) if up else d > expand(bound), i + 1, idx)
  return idx


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
  return with_sign(idx, v < 0)


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
