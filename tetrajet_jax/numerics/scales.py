"""Scale formats: E4M3 (RNE, saturating) and E8M0 (power of two, round up).

Both roundings are written with exact integer/power-of-two arithmetic instead
of `x.astype(float8).astype(float32)`: inside `jax.jit` on GPU, XLA may elide
such a narrow round trip (excess precision), and then the "quantized" value
silently keeps its FP32 bits. Arithmetic rounding cannot be elided.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

E4M3_MAX = 448.0
E4M3_MIN_NORMAL_EXP = -6
E4M3_MANTISSA_BITS = 3
E4M3_MIN_SUBNORMAL = 2.0**-9
E8M0_BIAS = 127
E8M0_NAN = 0xFF


def div_by_constant(x: jax.Array, c: float) -> jax.Array:
  """x / c as one IEEE division, never merged with a neighbouring one.

  XLA's algebraic simplifier rewrites `x / broadcast(c)` as
  `x * broadcast(1 / c)` and `(x / a) / b` as `x / (a * b)`; both can differ
  in the last bit from the spec's "divide by 448, then by 6". Numerator and a
  full-shape divisor go through one optimization barrier, so the division
  stays as written on every backend. (Only used on scale-sized arrays.)
  """
  x = jnp.asarray(x, jnp.float32)
  x, c = lax.optimization_barrier((x, jnp.full(x.shape, c, jnp.float32)))
  return x / c


def exp2_int(e: jax.Array) -> jax.Array:
  """2**e as float32 for integer e in [-126, 127], built from the exponent bits (exact)."""
  e = jnp.asarray(e, jnp.int32)
  return lax.bitcast_convert_type(((e + 127) << 23).astype(jnp.uint32), jnp.float32)


def floor_log2(ax: jax.Array) -> jax.Array:
  """floor(log2(ax)) for positive normal float32 ax, read off the exponent bits (exact).

  Zero, subnormals give -127; inf/NaN give 128. Callers clamp as they need.
  """
  bits = lax.bitcast_convert_type(ax.astype(jnp.float32), jnp.uint32)
  return ((bits >> 23) & 0xFF).astype(jnp.int32) - 127


def round_to_e4m3(x: jax.Array) -> jax.Array:
  """Rounds float32 to the nearest E4M3 (fn) value, ties to even, saturating at +-448.

  Returns float32 values that are exactly representable in float8_e4m3fn.
  Inf saturates to +-448 ("satfinite"); NaN stays NaN.
  """
  x = jnp.asarray(x, jnp.float32)
  ax = jnp.abs(x)
  # Spacing of E4M3 values around ax: 2^(e-3) for normals, 2^-9 for subnormals.
  e = jnp.clip(floor_log2(ax), E4M3_MIN_NORMAL_EXP, 127)
  quantum = exp2_int(e - E4M3_MANTISSA_BITS)
  r = jnp.round(ax / quantum) * quantum  # divide/multiply by 2^k: exact; round: ties to even
  r = jnp.minimum(r, E4M3_MAX)  # NaN propagates through minimum
  return jnp.where(x < 0, -r, r)


def e8m0_exponent(amax: jax.Array, elem_max: float) -> jax.Array:
  """Smallest integer e with elem_max * 2^e >= amax, i.e. ceil(log2(amax / elem_max)).

  Computed exactly (no rounding of amax / elem_max decides it). amax == 0 gives
  e = 0; the result is clamped to E8M0's range [-127, 127]. Non-finite amax
  gives an arbitrary value (callers mark such blocks NaN).
  """
  amax = jnp.asarray(amax, jnp.float32)
  e = floor_log2(amax) - math.floor(math.log2(elem_max))  # first guess, within 1
  e = jnp.clip(e, -126, 127)
  # Fix the guess with exact comparisons: elem_max * 2^e is exact in f32.
  e = jnp.where(amax > elem_max * exp2_int(e), e + 1, e)
  e_lo = jnp.clip(e - 1, -126, 127)
  e = jnp.where((e > -126) & (amax <= elem_max * exp2_int(e_lo)), e - 1, e)
  e = jnp.where(amax == 0, 0, e)
  return jnp.clip(e, -127, 127)
