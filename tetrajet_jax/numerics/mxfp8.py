"""MXFP8 (OCP microscaling FP8): E4M3 elements with one E8M0 (power of two)
scale per 1x32 block. Used for OutControl's retained outlier channels (docs/SPEC.md section 4).

Scale: 2^ceil(log2(amax / 448)), so every scaled element fits E4M3 without
saturating; elements are rounded to E4M3 with ties to even.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from tetrajet_jax.numerics import checks
from tetrajet_jax.numerics.scales import E4M3_MAX, E8M0_BIAS, E8M0_NAN, e8m0_exponent, exp2_int, round_to_e4m3

MX_BLOCK = 32


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MXFP8Tensor:
  """An MXFP8-quantized array.

  Invariant (canonical layout, quantized axis last, padded to a multiple of 32):
    values = f32(data) * 2^(scale_e8m0 - 127), scale broadcast over 32 elements
  (scale code 0xFF = NaN: the block held NaN/Inf), and
    dequantize(t) == moveaxis(crop(values), -1, axis).

  Fields:
    data: float8_e4m3fn [..., Kp].
    scale_e8m0: uint8 [..., Kp/32], biased exponent.
    shape: logical shape, original axis order (static).
    axis: quantized axis of `shape`, non-negative (static).
  """

  data: jax.Array
  scale_e8m0: jax.Array
  shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
  axis: int = dataclasses.field(metadata=dict(static=True))

  def dequantize(self) -> jax.Array:
    return dequantize_mxfp8(self)


def quantize_mxfp8(x: jax.typing.ArrayLike, *, axis: int = -1) -> MXFP8Tensor:
  """Quantizes x to MXFP8 along `axis` (1x32 blocks; lengths padded to 32).

  Args:
    x: floating-point array.
    axis: the axis the 1x32 blocks run along (the GEMM's reduction axis).

  Returns:
    MXFP8Tensor.
  """
  x = checks.as_float_input(x, "quantize_mxfp8")
  axis = checks.normalize_axis(axis, x.ndim, "quantize_mxfp8")
  check = checks.numerics_checking_enabled()
  if check:
    checks.check_concrete_input(x, "quantize_mxfp8")
  return _quantize_mxfp8(x, axis=axis, check=check)


@functools.partial(jax.jit, static_argnames=("axis", "check"))
def _quantize_mxfp8(x: jax.Array, *, axis: int, check: bool) -> MXFP8Tensor:
  if check:
    checks.emit_finite_check(x, "quantize_mxfp8")
  shape = tuple(x.shape)
  xc = checks.pad_axis_to_multiple(jnp.moveaxis(x, axis, -1), -1, MX_BLOCK)
  lead, k = xc.shape[:-1], xc.shape[-1]
  xb = xc.reshape(*lead, k // MX_BLOCK, MX_BLOCK)
  amax = jnp.abs(xb).max(axis=-1)
  finite = jnp.isfinite(xb).all(axis=-1)
  e = e8m0_exponent(amax, E4M3_MAX)  # [..., K/32]
  # Multiply by 2^-e in two exact power-of-two steps (2^-e alone may leave
  # the normal range); multiplications, since division is not correctly
  # rounded on every backend.
  e1 = e // 2
  e2 = e - e1
  scaled = xb * exp2_int(-e1)[..., None] * exp2_int(-e2)[..., None]
  data = round_to_e4m3(scaled).reshape(*lead, k)
  code = jnp.where(finite, e + E8M0_BIAS, E8M0_NAN).astype(jnp.uint8)
  return MXFP8Tensor(data=data.astype(jnp.float8_e4m3fn), scale_e8m0=code, shape=shape, axis=axis)


def mxfp8_scales_f32(t: MXFP8Tensor) -> jax.Array:
  """Per-block scales as float32 (NaN where the code is 0xFF)."""
  e = t.scale_e8m0.astype(jnp.int32) - E8M0_BIAS
  e1 = e // 2
  s = exp2_int(e1) * exp2_int(e - e1)
  return jnp.where(t.scale_e8m0 == E8M0_NAN, jnp.nan, s)


def dequantize_mxfp8_canonical(t: MXFP8Tensor, dtype=jnp.float32) -> jax.Array:
  """Dequantized values in the padded canonical layout (quantized axis last)."""
  s = jnp.repeat(mxfp8_scales_f32(t), MX_BLOCK, axis=-1)
  return (t.data.astype(jnp.float32) * s).astype(dtype)


@jax.jit
def dequantize_mxfp8(t: MXFP8Tensor) -> jax.Array:
  x = dequantize_mxfp8_canonical(t)
  canon = tuple(d for i, d in enumerate(t.shape) if i != t.axis) + (t.shape[t.axis],)
  x = x[tuple(slice(0, d) for d in canon)]
  return jnp.moveaxis(x, -1, t.axis)
