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


def div_rn(x: jax.Array, y: jax.Array) -> jax.Array:
  """x / y in float32, correctly rounded (IEEE round-to-nearest-even), on every backend.

  Why not `x / y`: XLA on NVIDIA GPUs lowers f32 division to `div.full.f32`
  (up to 2 ulp; about a quarter of quotients are 1 ulp off, even a / a != 1),
  and XLA's simplifier rewrites `x / c` as `x * (1 / c)`. The spec's scales
  and element rounding are defined with IEEE division. So the quotient is
  computed in float64 (whose division XLA emits correctly rounded, div.rn.f64
  on GPU) and rounded to float32: for float32 operands this double rounding is
  innocuous (53 >= 2*24 + 2 bits), the result is the IEEE float32 quotient
  bit for bit. Optimization barriers on both sides of the float64 division:
  on the result, else XLA removes the f64 -> f32 -> f64 convert pair between
  two chained divisions (amax / 448 / 6) and the intermediate rounding
  silently vanishes; on the widened operands, else XLA's GPU pipeline narrows
  convert(f64 / f64) of widened f32 operands back to an f32 (div.full) divide.
  """
  with jax.enable_x64(True):
    x64, y64 = lax.optimization_barrier((jnp.asarray(x, jnp.float32).astype(jnp.float64),
                                         jnp.asarray(y, jnp.float32).astype(jnp.float64)))
    return lax.optimization_barrier((x64 / y64).astype(jnp.float32))


def div_by_constant(x: jax.Array, c: float) -> jax.Array:
  """x / c, correctly rounded (see div_rn): the spec's "divide by 448, then by 6"."""
  return div_rn(x, jnp.float32(c))


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
  # Scale by 2^(3-e) and back: exact multiplications (no division, which is
  # not correctly rounded on every backend); round: ties to even.
  r = jnp.round(ax * exp2_int(E4M3_MANTISSA_BITS - e)) * exp2_int(e - E4M3_MANTISSA_BITS)
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
