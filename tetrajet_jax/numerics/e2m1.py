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
from typing import Callable, Literal, NamedTuple

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


def nearest_index(a: jax.Array) -> jax.Array:
  """Magnitude index (int32, 0..7) of a = |v| under E2M1 RNE, saturating (NaN -> 0).

  Compares and selects only (no boolean arithmetic), so Mosaic GPU kernels
  call it too."""
  idx = jnp.zeros(a.shape, jnp.int32)
  for i, (mid, up) in enumerate(zip(_MIDPOINTS, _TIE_ROUNDS_UP)):
    idx = jnp.where(a >= mid if up else a > mid, i + 1, idx)  # monotone in i: later selects override
  return idx


def round_e2m1_nearest(v: jax.Array) -> jax.Array:
  """E2M1 codes (uint8, 0..15) of v, round to nearest, ties to even, saturating at +-6.

  NaN maps to code 0 (callers mark a block holding NaN via its scale).
  """
  v = jnp.asarray(v, jnp.float32)
  return with_sign(nearest_index(jnp.abs(v)), v < 0)


class QuotientThresholds(NamedTuple):
  """Per-scale constants that test the float32 quotient fl(|x| / s) against
  fixed points without dividing (see quotient_thresholds); every array field
  has s's shape."""
  p: jax.Array  # 2^k with s' = s 2^k in [1, 2)
  s1: jax.Array  # s'
  hi: tuple  # per point t: t s'_hi (exact: 3 x 21 significant bits)
  lo: tuple  # per point t: t s'_lo (exact: 3 x 3 bits)
  bound: tuple  # per point t: the test's bound on D = |x| 2^k - t s' (exact)
  inclusive: tuple  # per point t: the test is D >= bound (else D > bound)


_F32_MIN_NORMAL = 2.0**-126


def quotient_thresholds(s: jax.Array, points: Literal["midpoints", "grid"] = "midpoints") -> QuotientThresholds:
  """The constants of the division-free tests on y = |x| / s, s positive normal (NaN s: every test fails).

  points="midpoints": the seven RNE tests of round_e2m1_nearest on fl(y),
  "fl(y) >= t" where a tie rounds up, else "fl(y) > t". points="grid": the
  tests "fl(y) >= g" for the grid values g = 0.5 .. 6 (stochastic rounding's
  lower neighbour).

  Why exact: a point t has a short significand (<= 3 bits), so its float32
  neighbours are t - 2^(e_t - 23) (or 2^(e_t - 24) below a power of two) and
  t + 2^(e_t - 23), e_t = floor(log2 t), and a real y exactly halfway rounds
  to t (the even one). So "fl(y) >= t" is "y >= t - half gap below" and
  "fl(y) > t" is "y > t + 2^(e_t - 24)", on the real quotient. Multiplied
  out: D = |x| - t s against -+(half gap) s. With s' = s 2^k in [1, 2) split
  by bit mask into s'_hi (21 significant bits) + s'_lo (3), both products
  with t are exact, and D = (|x| 2^k - t s'_hi) - t s'_lo is exact wherever
  it is near its bound (Sterbenz, then a short difference); far from it both
  roundings keep its side. So no division and no rounding decides a test.
  """
  s = jnp.asarray(s, jnp.float32)
  bits = lax.bitcast_convert_type(s, jnp.uint32)
  e = ((bits >> 23) & jnp.uint32(0xFF)).astype(jnp.int32)  # biased exponent of s, 1..254
  p = lax.bitcast_convert_type(((254 - e) << 23).astype(jnp.uint32), jnp.float32)  # 2^(127 - e)
  s1 = s * p  # in [1, 2), exact (NaN stays NaN)
  s_hi = lax.bitcast_convert_type(lax.bitcast_convert_type(s1, jnp.uint32) & jnp.uint32(0xFFFFFFF8), jnp.float32)
  s_lo = s1 - s_hi  # exact: the low 3 significand bits
  if points == "midpoints":
    tests = [(t, -1 if up else 1, up) for t, up in zip(_MIDPOINTS, _TIE_ROUNDS_UP)]
  elif points == "grid":
    tests = [(float(g), -1, True) for g in E2M1_GRID[1:]]
  else:
    raise ValueError(f"quotient_thresholds: unknown points {points!r}; use 'midpoints' or 'grid'.")
  hi, lo, bound, inclusive = [], [], [], []
  for t, side, incl in tests:
    e_t = math.floor(math.log2(t))
    below_pow2 = side < 0 and t == 2.0**e_t  # the gap below a power of two is half the gap above
    half_gap = 2.0**(e_t - (25 if below_pow2 else 24))
    hi.append(t * s_hi)
    lo.append(t * s_lo)
    bound.append(s1 * (side * half_gap))  # exact: times a power of two
    inclusive.append(incl)
  return QuotientThresholds(p, s1, tuple(hi), tuple(lo), tuple(bound), tuple(inclusive))


def _scaled_magnitude(ax, th: QuotientThresholds, expand):
  """|x| 2^k (exact; subnormal |x| flushed to 0; overflow -> inf, which passes every test)."""
  return jnp.where(ax >= _F32_MIN_NORMAL, ax * expand(th.p), 0.0)


def _tests_of_quotient(x1, th: QuotientThresholds, expand):
  """Yields (D_i, passed_i) for the thresholds' points in increasing order, x1 = _scaled_magnitude."""
  for hi, lo, bound, incl in zip(th.hi, th.lo, th.bound, th.inclusive):
    d = (x1 - expand(hi)) - expand(lo)
    yield d, (d >= expand(bound)) if incl else (d > expand(bound))


def nearest_index_of_quotient(ax: jax.Array, th: QuotientThresholds,
                              expand: Callable[[jax.Array], jax.Array] = lambda v: v) -> jax.Array:
  """Magnitude index (int32, 0..7) of round_e2m1_nearest(fl(ax / s)), bitwise
  the index of the correctly rounded float32 quotient (subnormal ax and
  subnormal quotients flushed to 0, as scales.div_rn), without dividing.

  ax = |x| (float32, >= 0; NaN -> 0); th = quotient_thresholds(s); expand
  broadcasts a per-scale field to ax's shape (e.g. a row vector inside a
  kernel). About 30 operations per element, against ~60 for div_rn and the
  threshold compares; on XLA nothing here can be simplified away (compares
  and selects of exact values).
  """
  idx = jnp.zeros(ax.shape, jnp.int32)
  for i, (_, passed) in enumerate(_tests_of_quotient(_scaled_magnitude(ax, th, expand), th, expand)):
    idx = jnp.where(passed, i + 1, idx)  # monotone in i (increasing points): later selects override
  return idx


def stochastic_index_of_quotient(ax: jax.Array, u: jax.Array, th: QuotientThresholds,
                                 expand: Callable[[jax.Array], jax.Array] = lambda v: v) -> jax.Array:
  """Magnitude index (int32, 0..7) of y = ax / s rounded stochastically with uniform u in [0, 1), no division.

  th = quotient_thresholds(s, "grid"). The lower neighbour lo is the grid
  value at or below fl(y), exactly as round_e2m1_stochastic picks it; the
  index rounds up iff u (gap s) < ax - lo s, the real distance, computed
  exactly near 0 (so a quotient on the grid stays put) and to 2^-24 relative
  elsewhere: P(up) = (y - lo) / gap to within 2^-22. Saturates at 6.
  """
  x1 = _scaled_magnitude(ax, th, expand)
  idx = jnp.zeros(ax.shape, jnp.int32)
  dist = x1  # lo = 0: the distance is |x| 2^k itself
  for i, (d, passed) in enumerate(_tests_of_quotient(x1, th, expand)):
    idx = jnp.where(passed, i + 1, idx)
    dist = jnp.where(passed, d, dist)
  s1 = expand(th.s1)
  gap_s = jnp.where(idx >= 6, 2.0 * s1, jnp.where(idx >= 4, s1, 0.5 * s1))  # exact
  return jnp.minimum(idx + jnp.where(u * gap_s < dist, 1, 0), 7)


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
