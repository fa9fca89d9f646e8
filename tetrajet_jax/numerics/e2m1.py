"""The FP4 element format E2M1: the grid, round-to-nearest-even, stochastic
rounding, and packing two codes per byte.

Code layout (the E2M1 bit encoding): bit 3 = sign, bits 0-2 = magnitude index
into E2M1_GRID = {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Zero is always encoded as +0
(code 0), so quantize(dequantize(q)) == q holds bitwise.

Rounding is done with integer arithmetic on the float32 bits and comparisons
against the grid's decision thresholds, not with a float4 cast: neither can be
elided by XLA under jit. The NVFP4
quantizers (XLA and Pallas) apply these functions to v = fp32(|x| r), r the
block's correctly rounded reciprocal scale; stochastic rounding takes its 16
random bits per element from counter_rng.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tetrajet_jax.numerics import counter_rng

E2M1_MAX = 6.0
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)


def _index_from_one_up(t: jax.Array) -> jax.Array:
  """Magnitude index (int32) of the grid value at or below the float32 with bits t, a value >= 1:
  from 1 up the grid keeps one mantissa bit, so t >> 22 is 254 at 1.0 and one more per grid step
  (259 at 6.0); capped at index 7, so larger values and Inf saturate."""
  return lax.bitcast_convert_type(jnp.minimum(t >> 22, jnp.uint32(259)) - jnp.uint32(252), jnp.int32)


def with_sign(idx: jax.Array, negative: jax.Array) -> jax.Array:
  """E2M1 codes (uint8) of magnitude indices and signs; zero stays +0."""
  idx = idx.astype(jnp.uint8)
  return jnp.where(negative & (idx > 0), idx | 0x8, idx).astype(jnp.uint8)


def nearest_index(a: jax.Array) -> jax.Array:
  """Magnitude index (int32, 0..7) of a = |v| under E2M1 RNE, saturating (NaN -> 0).

  From a's float32 bits t, not a compare per grid value (this runs once per
  element in every quantizer): for a >= 1 the grid keeps one mantissa bit, so
  rounding t half to even at bit 22 (add 2^21 - 1 plus the kept bit) and
  shifting gives the grid value's bits >> 22, whose index is that minus 252
  (1.0 -> 2), capped at 7 (6.0; Inf too). Below 1 the grid is {0, 0.5, 1}:
  two compares, ties 0.25 -> 0 and 0.75 -> 1.0. NaN fails every compare: 0.
  Integer ops and selects only (no boolean arithmetic), so Mosaic GPU kernels
  call it too."""
  t = lax.bitcast_convert_type(a, jnp.uint32)
  rounded = t + (jnp.uint32(0x1FFFFF) + ((t >> 22) & jnp.uint32(1)))
  idx_big = _index_from_one_up(rounded)
  idx_small = jnp.where(a >= 0.75, 2, jnp.where(a > 0.25, 1, 0))
  return jnp.where(a >= 1.0, idx_big, idx_small)


def round_e2m1_nearest(v: jax.Array) -> jax.Array:
  """E2M1 codes (uint8, 0..15) of v, round to nearest, ties to even, saturating at +-6.

  NaN maps to code 0 (callers mark a block holding NaN via its scale).
  """
  v = jnp.asarray(v, jnp.float32)
  return with_sign(nearest_index(jnp.abs(v)), v < 0)


F32_MIN_NORMAL = 2.0**-126


def flush_subnormal(a: jax.Array) -> jax.Array:
  """Magnitudes a >= 0 with subnormals (and NaN) replaced by 0.

  XLA's CPU flushes subnormal operands to zero and the GPU does not; flushing
  them explicitly makes every backend compute the same element products.
  (A NaN element lies in a block whose scale is NaN: its code is 0 anyway.)
  """
  return jnp.where(a >= F32_MIN_NORMAL, a, 0.0)


def stochastic_index(v: jax.Array, bits: jax.Array) -> jax.Array:
  """Magnitude index (int32, 0..7) of v = |x r| >= 0 by stochastic rounding with 16 random bits.

  With lo <= v < hi the neighbouring grid values and p = (v - lo) / (hi - lo),
  the index steps up iff (bits + 1/2) 2^-16 < p, so P(up) is p rounded to a
  multiple of 2^-16 (bias at most 2^-17 of the gap; a value on the grid, or
  within 2^-17 of the gap above it, is kept). Saturates at 6 (v >= 6 ->
  index 7); NaN -> 0. bits: uint32 in [0, 2^16) (counter_rng).

  Exact on every backend, with no rounding a fused multiply-add could change
  (this runs once per element in the backward kernel, so it is written in
  few instructions):
  - v >= 1: the grid keeps one mantissa bit, so p = f / 2^22 with f the 22
    float bits below it, and the test f > 64 bits + 32 is a carry into the
    kept bit: add 2^22 - 33 - 64 bits to v's bits and read the index off the
    sum as nearest_index does ((bits >> 22) - 252, capped at 7).
  - v < 1: the grid is {0, 0.5, 1}, so up iff v > lo + u / 2 with lo = 0 or
    0.5 and u = (bits + 1/2) 2^-16: one compare against a threshold of at
    most 18 significant bits (exact however it is computed).
  Selects and integer ops only (no boolean arithmetic), so Mosaic GPU
  kernels call it too.
  """
  t = lax.bitcast_convert_type(v, jnp.uint32)
  drop = 22 - counter_rng.SR_BITS  # the bits' place among the 22 mantissa bits below the kept one
  carry = jnp.uint32((1 << 22) - (1 << (drop - 1)) - 1) - (bits << drop)  # >= 31: no uint32 wrap
  idx_big = _index_from_one_up(t + carry)
  half = v >= 0.5
  # lo + u / 2 from 1 + bits 2^-16 (no int-to-float conversion): 0.5 (1 + u) or u / 2.
  one_plus = lax.bitcast_convert_type((bits << (23 - counter_rng.SR_BITS)) | jnp.uint32(0x3F800000), jnp.float32)
  quarter_cell = 2.0 ** -(counter_rng.SR_BITS + 2)  # the midpoint's half cell, 2^-17, times the gap 1/2
  threshold = one_plus * 0.5 + jnp.where(half, quarter_cell, -(0.5 - quarter_cell))
  idx_small = jnp.where(v > threshold, jnp.where(half, 2, 1), jnp.where(half, 1, 0))
  return jnp.where(v >= 1.0, idx_big, idx_small)  # NaN fails both compares: 0


def grid_value(idx: jax.Array) -> jax.Array:
  """E2M1 grid value of a magnitude index, by selects (no gather: Mosaic GPU has none)."""
  half = idx.astype(jnp.float32) * 0.5  # 0, .5, 1, 1.5, 2 for idx <= 4
  return jnp.where(idx <= 4, half, jnp.where(idx == 5, 3.0, jnp.where(idx == 6, 4.0, 6.0)))


def round_e2m1_stochastic(v: jax.Array, key: jax.Array) -> jax.Array:
  """E2M1 codes of v with unbiased stochastic rounding: E[decode(code)] = v for |v| <= 6
  (to within 2^-17 of the grid gap).

  The random bits are those of the counter-based generator (counter_rng)
  seeded with sr_seed(key), v read as a canonical array (last axis = columns,
  leading axes flattened into rows; an odd last axis gets one padding
  column). Values beyond +-6 saturate to +-6.
  """
  v = jnp.asarray(v, jnp.float32)
  if v.ndim == 0:
    return round_e2m1_stochastic(v[None], key)[0]
  k = v.shape[-1]
  bits = counter_rng.element_bits(counter_rng.sr_seed(key), (*v.shape[:-1], k + k % 2))[..., :k]
  return with_sign(stochastic_index(flush_subnormal(jnp.abs(v)), bits), v < 0)


def decode_e2m1(codes: jax.Array) -> jax.Array:
  """float32 values of E2M1 codes (uint8, 0..15), assembled from bits.

  Magnitude index i = 2e + m: i >= 2 is 2^(e-1) (1 + m/2), i = 1 is 0.5, i = 0 is 0; bit 3 is
  the sign (code 8 is -0). No lookup table: a table is an array constant that every decode
  in a graph shares, and XLA's GPU sibling fusion may merge consumers of a shared operand
  that have equal element counts into one loop, which then writes one of them transposed
  (the H100 profile of af63cf4 shows such decode pairs, [M, N] with [N, M], at about a tenth
  of memory speed); scalar constants are never shared operands.
  """
  codes = codes.astype(jnp.uint32)
  idx = codes & jnp.uint32(0x7)
  normal = (((idx >> 1) + jnp.uint32(126)) << 23) | ((idx & jnp.uint32(1)) << 22)
  mag = jnp.where(idx >= 2, normal, jnp.where(idx == 1, jnp.uint32(126 << 23), jnp.uint32(0)))
  return lax.bitcast_convert_type(mag | ((codes & jnp.uint32(0x8)) << 28), jnp.float32)


def pack_e2m1(codes: jax.Array) -> jax.Array:
  """Packs codes [..., 2n] into bytes [..., n]: element 2i in the low nibble."""
  if codes.shape[-1] % 2:
    raise ValueError(f"pack_e2m1 needs an even last dimension, got {codes.shape}")
  c = codes.astype(jnp.uint8).reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)  # no -1: empty arrays
  return (c[..., 0] | (c[..., 1] << 4)).astype(jnp.uint8)


def unpack_e2m1(packed: jax.Array) -> jax.Array:
  """Inverse of pack_e2m1: bytes [..., n] -> codes [..., 2n].

  Written as "code j = nibble j % 2 of byte j // 2" (each byte broadcast to
  a pair, shifted by 0 or 4), not as a stack of the two nibble arrays: XLA
  fuses the broadcast into whatever consumes the codes as index arithmetic,
  while a stack becomes a concatenation along a minor axis of 2, whose fused
  GPU kernel writes with stride 2 (the decode pass in front of every FP4 GEMM
  ran at a third of memory speed that way). The shifts come from an iota, not
  an array constant, for the reason `decode_e2m1` gives.
  """
  packed = jnp.asarray(packed, jnp.uint8)
  pairs = jnp.broadcast_to(packed[..., None], (*packed.shape, 2))
  shifts = lax.broadcasted_iota(jnp.uint8, pairs.shape, pairs.ndim - 1) * jnp.uint8(4)
  codes = (pairs >> shifts) & jnp.uint8(0xF)
  return codes.reshape(*packed.shape[:-1], 2 * packed.shape[-1])
