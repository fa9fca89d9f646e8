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
import numpy as np
from jax import lax

E4M3_MAX = 448.0
E4M3_MIN_NORMAL_EXP = -6
E4M3_MANTISSA_BITS = 3
E4M3_MIN_SUBNORMAL = 2.0**-9
E8M0_BIAS = 127
E8M0_NAN = 0xFF


def div_rn(x: jax.Array, y, *, positive_divisor: bool = False, integer: bool = False) -> jax.Array:
  """x / y in float32, correctly rounded (IEEE round-to-nearest-even), on every
  on every backend; subnormal operands and results flush to 0.

  Why not a bare `x / y`: XLA on NVIDIA GPUs lowers f32 division to
  `div.full.f32` (up to 2 ulp; about a quarter of quotients are 1 ulp off, even
  a / a != 1), and
  XLA's simplifier rewrites `x / c` as `x * (1 / c)` and merges chained
  divisions. The spec's per-block scale arithmetic (amax / 448 / 6,
  amax_16 / s_out / 6, and the reciprocal 1 / s the elements are multiplied
  by) is IEEE division. A float64 quotient is no way out either: XLA's GPU
  pipeline narrows convert(f64 divide) of widened f32 operands back to an f32
  divide under jit.

  So, per platform (`lax.platform_dependent`: only the branch of the platform
  being compiled for is lowered):
  - CPU: the hardware quotient, which is IEEE there (and flushes subnormals),
    behind an optimization barrier so that the simplifier's rewrites cannot
    apply. This keeps the CPU graph a third of the size (compile time).
  - anything else: the hardware quotient is only an estimate, and the rounding
    is decided in exact integer arithmetic (`div_rn_from_estimate`), which no
    compiler rewrites. The flush of subnormals is explicit, as on the CPU.
  integer=True: the integer-decided quotient on every platform (how the CPU
  tests check the path the GPU runs). The Pallas kernels have their own
  single-instruction division (`kernels._division`).

  `y` may be a Python float (a constant divisor: its fields are computed at
  trace time). `positive_divisor=True` promises a positive normal finite y
  (the quantizers' scales; a NaN scale still gives NaN) and skips the other
  special cases of y.

  No optimization barrier in the integer path: the quantizer (nvfp4.py) puts
  one on each scale and on the element indices, which is what XLA's CPU
  compiler needs to finish compiling the fused quantize -> dequantize -> bf16
  GEMM (without them: minutes, then killed), with fewer fusion boundaries than
  one barrier per division.
  """
  x = jnp.asarray(x, jnp.float32)
  if not isinstance(y, float):
    y = jnp.asarray(y, jnp.float32)
  integer_decided = lambda x, y_arr: div_rn_from_estimate(
      x, y if isinstance(y, float) else y_arr, x / y_arr, positive_divisor=positive_divisor)
  if integer:
    return integer_decided(x, y)
  y_arr = jnp.full(x.shape, y, jnp.float32) if isinstance(y, float) else y
  return lax.platform_dependent(x, y_arr, cpu=_cpu_quotient, default=integer_decided)


def _cpu_quotient(x: jax.Array, y: jax.Array) -> jax.Array:
  """XLA's CPU division (IEEE, subnormals flushed) with the operands hidden from the simplifier.
  Broadcast first: XLA rewrites a division by a broadcast scalar as a multiplication by its
  reciprocal, so the divisor must reach the division already at full shape. The select on x's
  data makes y as batched as x under vmap too (a shape-only broadcast would not): an unbatched
  divisor passes the barrier unbatched and is broadcast after it, where the rewrite applies."""
  x, y = jnp.broadcast_arrays(x, y)
  x, y = lax.optimization_barrier((x, jnp.where(x == x, y, y)))
  return x / y


_SIGN = 0x80000000
_HIDDEN = 0x800000
_FRAC = 0x7FFFFF


def _u32(v: int) -> jax.Array:
  return jnp.uint32(v)


def div_rn_from_estimate(x: jax.Array, y, q0: jax.Array, *, positive_divisor: bool = False) -> jax.Array:
  """The IEEE float32 quotient x / y (ties to even; subnormals flushed to 0),
  given any estimate q0 within a few ulps of it.

  With 24-bit significands mx, my and unbiased exponents ex, ey, the true
  quotient lies in the binade of 2^e, e = ex - ey - [mx < my], where in units
  of that binade's ulp it is t = mx * 2^(23 + [mx < my]) / my. The estimate
  gives an integer mq near t; then D = 2 my (t - mq) = mx << (24 + [mx < my])
  - 2 mq my is a small integer (|D| << 2^31), so uint32 arithmetic modulo
  2^32 computes it exactly, and n = round-half-even(t) = mq + k follows from
  comparing D - k 2my with +-my. The result n * ulp is assembled from bits
  (n = 2^24 carries into the exponent by itself). Only integer operations,
  compares and selects decide the rounding. y may be a Python float (fields
  folded at trace time); positive_divisor=True promises y > 0 normal finite.
  """
  x = jnp.asarray(x, jnp.float32)
  xb = lax.bitcast_convert_type(x, jnp.uint32)
  qb = lax.bitcast_convert_type(jnp.asarray(q0, jnp.float32), jnp.uint32)
  ex = ((xb >> 23) & _u32(0xFF)).astype(jnp.int32)
  mx = (xb & _u32(_FRAC)) | _u32(_HIDDEN)
  if isinstance(y, float):
    yb_const = int(np.float32(y).view(np.uint32))
    ey, my = (yb_const >> 23) & 0xFF, (yb_const & _FRAC) | _HIDDEN
    if not (y > 0 and 0 < ey < 255):
      raise ValueError(f"div_rn: constant divisor {y} must be a positive normal float32.")
    positive_divisor = True
    sign = xb & _u32(_SIGN)
    lt = mx < _u32(my)
    m = my
  else:
    y = jnp.asarray(y, jnp.float32)
    yb = lax.bitcast_convert_type(y, jnp.uint32)
    ey = ((yb >> 23) & _u32(0xFF)).astype(jnp.int32)
    my = (yb & _u32(_FRAC)) | _u32(_HIDDEN)
    sign = xb & _u32(_SIGN) if positive_divisor else (xb ^ yb) & _u32(_SIGN)
    lt = mx < my
    m = my.astype(jnp.int32)
  e_b = ex - ey + jnp.where(lt, 126, 127)  # biased exponent of the result's binade
  # The estimate's significand, expressed in that binade's ulps (the estimate
  # may sit one binade off near a power of two).
  shift = ((qb >> 23) & _u32(0xFF)).astype(jnp.int32) - e_b
  mq0 = (qb & _u32(_FRAC)) | _u32(_HIDDEN)
  mq = jnp.where(shift > 0, mq0 << 1, jnp.where(shift < 0, mq0 >> 1, mq0))
  two_d = jnp.where(lt, mx << 25, mx << 24) - ((mq * my) << 1)  # = D mod 2^32
  d = lax.bitcast_convert_type(two_d, jnp.int32)
  k = jnp.round(d.astype(jnp.float32) * (0.5 / m if isinstance(m, int) else 0.5 / m.astype(jnp.float32)))
  k = k.astype(jnp.int32)  # within 1 of round(D / 2m): corrected exactly below
  r = d - k * (2 * m)  # exact: t - (mq + k) = r / 2m
  n = mq.astype(jnp.int32) + k
  n = jnp.where(r > m, n + 1, jnp.where(r < -m, n - 1, n))
  r = jnp.where(r > m, r - 2 * m, jnp.where(r < -m, r + 2 * m, r))
  n = jnp.where(r == m, n + (n & 1), n)  # tie between n and n + 1: the even one
  n = jnp.where(r == -m, n - (n & 1), n)  # tie between n - 1 and n
  bits = (e_b << 23) + (n - _HIDDEN)
  finite = lax.bitcast_convert_type(bits.astype(jnp.uint32) | sign, jnp.float32)
  # Results out of the normal range, then special operands. Written as single
  # comparisons feeding selects (Mosaic GPU has no registers for boolean
  # arithmetic); later selects override earlier ones.
  signed_zero = lax.bitcast_convert_type(sign, jnp.float32)
  signed_inf = lax.bitcast_convert_type(sign | _u32(0x7F800000), jnp.float32)
  out = jnp.where(bits < (1 << 23), signed_zero, finite)  # flush (also e_b < 0)
  out = jnp.where(e_b < 0, signed_zero, out)
  out = jnp.where(bits >= (255 << 23), signed_inf, out)  # incl. the carry of n = 2^24 at e_b = 254
  out = jnp.where(e_b >= 255, signed_inf, out)  # before `bits` (which wraps there)
  out = jnp.where(ex == 0, signed_zero, out)  # 0 (or subnormal) / y
  if positive_divisor:
    out = jnp.where(ex == 255, x, out)  # inf / y = inf, NaN / y = NaN
    return out if isinstance(y, float) else jnp.where(ey == 255, jnp.float32(jnp.nan), out)  # a NaN scale
  out = jnp.where(ey == 255, signed_zero, out)  # x / inf
  out = jnp.where(ey == 0, signed_inf, out)  # x / 0
  out = jnp.where(ex == 255, signed_inf, out)  # inf / y
  nan = jnp.float32(jnp.nan)
  out = jnp.where(jnp.where(ex == 255, xb & _u32(_FRAC), _u32(0)) != 0, nan, out)  # NaN / y
  out = jnp.where(jnp.where(ey == 255, yb & _u32(_FRAC), _u32(0)) != 0, nan, out)  # x / NaN
  out = jnp.where(jnp.where(ex == 0, ey, 1) == 0, nan, out)  # 0 / 0
  return jnp.where(jnp.where(ex == 255, ey, 0) == 255, nan, out)  # inf / inf


def reciprocal_rn(s: jax.Array) -> jax.Array:
  """fp32(1 / s), correctly rounded, for scales s > 0 (once per block: the
  elements are then multiplied by it, never divided).

  A scale below the float32 normal range (possible only in blocks whose amax
  is below about 1e-32) counts as 0, as every subnormal does in the scale
  arithmetic, and gives +inf; a reciprocal below the normal range (s > 2^126,
  beyond any scale of a finite input) flushes to 0; NaN gives NaN.
  """
  s = jnp.asarray(s, jnp.float32)
  r = div_rn(jnp.ones(s.shape, jnp.float32), s, positive_divisor=True)
  return jnp.where(s < 2.0**-126, jnp.inf, r)  # single compare feeding a select (Mosaic GPU)


def div_by_constant(x: jax.Array, c: float) -> jax.Array:
  """x / c, correctly rounded (see div_rn): the spec's "divide by 448, then by 6"."""
  return div_rn(x, float(c))


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
