"""MXFP8 (OCP microscaling FP8): E4M3 elements with one E8M0 (power of two)
scale per 1x32 block. Used for OutControl's retained outlier channels (docs/SPEC.md section 4).

Scale: 2^ceil(log2(amax / 448)), so every scaled element fits E4M3 without
saturating; elements are rounded to E4M3 with ties to even.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax import lax
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
  data, e, finite = _round_blocks(xc.reshape(*lead, k // MX_BLOCK, MX_BLOCK), -1)
  code = jnp.where(finite, e + E8M0_BIAS, E8M0_NAN).astype(jnp.uint8)[..., 0]
  return MXFP8Tensor(data=data.reshape(*lead, k).astype(jnp.float8_e4m3fn), scale_e8m0=code, shape=shape,
                     axis=axis)


def _round_blocks(xb: jax.Array, block_axis: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The MXFP8 rule on blocks of 32 along `block_axis` of xb: (E4M3-rounded scaled
  values as float32, the scale exponent e, whether the block is finite); e and
  finite keep the block axis with length 1."""
  if block_axis in (-1, xb.ndim - 1):
    amax = jnp.abs(xb).max(axis=block_axis, keepdims=True)
    finite = jnp.isfinite(xb).all(axis=block_axis, keepdims=True)
  else:
    # Blocks across rows (e.g. along tokens of a row-major [M, N]): a chain of elementwise
    # maxima over the block's 32 slices, which XLA emits as one coalesced loop; its
    # reduction over a short middle axis ran at a tenth of memory speed on an H100.
    # The maximum propagates NaN, and |Inf| = Inf: the block is finite iff its amax is.
    slices = [lax.slice_in_dim(xb, i, i + 1, axis=block_axis) for i in range(MX_BLOCK)]
    amax = functools.reduce(jnp.maximum, map(jnp.abs, slices))
    finite = jnp.isfinite(amax)
  e = e8m0_exponent(amax, E4M3_MAX)
  # Multiply by 2^-e in two exact power-of-two steps (2^-e alone may leave
  # the normal range); multiplications, since division is not correctly
  # rounded on every backend.
  e1 = e // 2
  return round_to_e4m3(xb * exp2_int(-e1) * exp2_int(-(e - e1))), e, finite


def _scale_f32(e: jax.Array, finite: jax.Array) -> jax.Array:
  """2^e as float32 (exact, also below the normal range), NaN where the block is not finite."""
  e1 = e // 2
  return jnp.where(finite, exp2_int(e1) * exp2_int(e - e1), jnp.nan)


def mxfp8_scales_f32(t: MXFP8Tensor) -> jax.Array:
  """Per-block scales as float32 (NaN where the code is 0xFF)."""
  return _scale_f32(t.scale_e8m0.astype(jnp.int32) - E8M0_BIAS, t.scale_e8m0 != E8M0_NAN)


@functools.partial(jax.jit, static_argnames=("axis",))
def mxfp8_values(x: jax.Array, *, axis: int) -> jax.Array:
  """dequantize_mxfp8(quantize_mxfp8(x, axis=axis)), bitwise, as float32 in x's own layout.

  For an operand the caller only multiplies (OutControl's outlier weight gradient): the
  blocks run along `axis` where it lies, so nothing is transposed and no codes are stored:
  one pass over x for the block amax, one for the values.
  """
  axis = checks.normalize_axis(axis, x.ndim, "mxfp8_values")
  n = x.shape[axis]
  xp = checks.pad_axis_to_multiple(x.astype(jnp.float32), axis, MX_BLOCK)
  blocked = (*xp.shape[:axis], xp.shape[axis] // MX_BLOCK, MX_BLOCK, *xp.shape[axis + 1:])
  data, e, finite = _round_blocks(xp.reshape(blocked), axis + 1)
  v = (data * _scale_f32(e, finite)).reshape(xp.shape)
  return lax.slice_in_dim(v, 0, n, axis=axis)


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
