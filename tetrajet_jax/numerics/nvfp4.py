"""NVFP4 quantization: E2M1 elements with E4M3 inner scales, and either
double-block FP32 outer scales (TetraJet-v2) or one FP32 scale per tensor
(NVIDIA's recipe). Method: docs/SPEC.md sections 1 and 5.

Element rule: s = fp32(s_in * s_out), r = fp32(1 / s) correctly rounded once
per 16-block, q = round_E2M1(fp32(x * r)) saturating at +-6: elements are
multiplied by their block's reciprocal, never divided (see e2m1 for RTN and
stochastic rounding, counter_rng for the random bits).

Storage layout ("canonical"): the quantized axis is moved last and zero-padded
to a multiple of 128 (1-D blocks) so every block is complete; for 16x16 (2-D)
blocks the other axis is padded too. Dequantization crops the padding and
moves the axis back. Padding is zeros: it changes no amax and no dot product.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tetrajet_jax.numerics import checks, counter_rng
from tetrajet_jax.numerics.e2m1 import (E2M1_MAX, decode_e2m1, flush_subnormal, nearest_index, pack_e2m1,
                                        stochastic_index, unpack_e2m1, with_sign)
from tetrajet_jax.numerics.scales import (E4M3_MAX, E4M3_MIN_SUBNORMAL, div_by_constant, div_rn, reciprocal_rn,
                                          round_to_e4m3)

INNER_BLOCK = 16
OUTER_BLOCK = 128

Rounding = Literal["nearest", "stochastic"]
Scaling = Literal["block", "tensor"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NVFP4Tensor:
  """An NVFP4-quantized array.

  Invariant (canonical layout, quantized axis last, padded to Kp):
    values_KpxR = decode_e2m1(unpack(codes)) * f32(scale_inner) * scale_outer
  with each scale broadcast over its block, and
    dequantize(t) == moveaxis(crop(values), -1, axis)   (shape == t.shape).

  Fields:
    codes: uint8 [..., Kp/2], two E2M1 codes per byte (element 2i low nibble).
    scale_inner: float8_e4m3fn; [..., Kp/16] for 1x16 blocks, or
      [Rp/16, Kp/16] for 16x16 blocks (2-D input [R, K] in canonical layout).
    scale_outer: float32; [..., Kp/128] (block scaling, 1-D), [Rp/128, Kp/128]
      (block scaling, 2-D: 128x128 tiles) or [] (tensor scaling). NaN marks a
      block (or tensor) whose input held NaN/Inf.
    shape: logical shape, original axis order (static).
    axis: the quantized axis of `shape`, non-negative (static).
    scaling: "block" or "tensor" (static).
    block_2d: 16x16 inner blocks (static).
  """

  codes: jax.Array
  scale_inner: jax.Array
  scale_outer: jax.Array
  shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
  axis: int = dataclasses.field(metadata=dict(static=True))
  scaling: str = dataclasses.field(metadata=dict(static=True))
  block_2d: bool = dataclasses.field(metadata=dict(static=True))

  @property
  def ndim(self) -> int:
    return len(self.shape)

  @property
  def nbytes(self) -> int:
    """Storage bytes (codes + scales), padding included."""
    return sum(int(np.prod(a.shape)) * a.dtype.itemsize
               for a in (self.codes, self.scale_inner, self.scale_outer))

  def dequantize(self) -> jax.Array:
    return dequantize_nvfp4(self)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NVFP4Operand:
  """A 1x16 block-scaled NVFP4 tensor in the form its GEMM reads, as a quantizer kernel can write
  it in place of codes: values = q * s_in in bfloat16 (exact: at most 2 + 4 significant bits) and
  the FP32 outer scales, in the canonical layout. The same numbers as the NVFP4Tensor of those
  codes (`nvfp4_bf16_operand` of it); only a GEMM consumes it.

  Fields:
    values: bfloat16 [rows, Kp].
    scale_outer: float32 [rows, Kp/128].
    shape, axis: as NVFP4Tensor's (static).
  """

  values: jax.Array
  scale_outer: jax.Array
  shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
  axis: int = dataclasses.field(metadata=dict(static=True))

  @property
  def ndim(self) -> int:
    return len(self.shape)


def _canonical_shape(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
  return tuple(d for i, d in enumerate(shape) if i != axis) + (shape[axis],)


def _expand_scales(t: NVFP4Tensor) -> tuple[jax.Array, jax.Array]:
  """Broadcasts inner (f32) and outer scales to the padded canonical element shape."""
  s_in = t.scale_inner.astype(jnp.float32)
  s_out = t.scale_outer
  if t.block_2d:
    s_in = jnp.repeat(jnp.repeat(s_in, INNER_BLOCK, 0), INNER_BLOCK, 1)
    if t.scaling == "block":
      s_out = jnp.repeat(jnp.repeat(s_out, OUTER_BLOCK, 0), OUTER_BLOCK, 1)
  else:
    s_in = jnp.repeat(s_in, INNER_BLOCK, axis=-1)
    if t.scaling == "block":
      s_out = jnp.repeat(s_out, OUTER_BLOCK, axis=-1)
  return s_in, s_out


def dequantize_nvfp4_canonical(t: NVFP4Tensor | NVFP4Operand, dtype=jnp.float32) -> jax.Array:
  """Dequantized values in the padded canonical layout (quantized axis last).

  This is the operand a GEMM consumes: no crop, no transpose.
  """
  if isinstance(t, NVFP4Operand):
    return (t.values.astype(jnp.float32) * jnp.repeat(t.scale_outer, OUTER_BLOCK, axis=-1)).astype(dtype)
  q = decode_e2m1(unpack_e2m1(t.codes))
  s_in, s_out = _expand_scales(t)
  return ((q * s_in) * s_out).astype(dtype)


@jax.jit
def dequantize_nvfp4(t: NVFP4Tensor) -> jax.Array:
  """float32 array of t's logical shape and axis order."""
  x = dequantize_nvfp4_canonical(t)
  canon = _canonical_shape(t.shape, t.axis)
  x = x[tuple(slice(0, d) for d in canon)]
  return jnp.moveaxis(x, -1, t.axis)


# A correctly rounded float32 division x / y (y an array of positive scales or a Python float
# constant): the XLA quantizer's `scales.div_rn`, or the Pallas kernels' single PTX instruction.
Division = Callable[[jax.Array, Any], jax.Array]


def block_outer_scale(amax: jax.Array, div: Division) -> jax.Array:
  """The 1x128 FP32 scale of a block from its amax: amax / 448 / 6, in this order (docs/SPEC.md
  section 1), 0 -> 1. Non-finite amaxes are the caller's to mark."""
  s = div(div(amax, E4M3_MAX), E2M1_MAX)
  return jnp.where(s == 0, 1.0, s)


def block_inner_scale(amax_16: jax.Array, s_out: jax.Array, div: Division) -> jax.Array:
  """The E4M3 scale of a 1x16 block, float32-valued: e4m3(amax_16 / s_out / 6), 0 -> 2^-9."""
  s_in = round_to_e4m3(div(div(amax_16, s_out), E2M1_MAX))
  return jnp.where(s_in == 0, E4M3_MIN_SUBNORMAL, s_in)


def _xla_division(x: jax.Array, y) -> jax.Array:
  return div_by_constant(x, y) if isinstance(y, float) else div_rn(x, y, positive_divisor=True)


def _inner_scales(amax_in: jax.Array, s_out: jax.Array) -> jax.Array:
  return lax.optimization_barrier(block_inner_scale(amax_in, s_out, _xla_division))


def tensor_outer_scale(amax: jax.Array) -> jax.Array:
  """NVIDIA's per-tensor FP32 scale from the tensor's amax (docs/SPEC.md section 5): amax / (448 * 6)
  in one division by the constant, 0 -> 1, NaN when amax is not finite (the tensor held NaN/Inf;
  max propagates NaN). The XLA quantizer and the kernels' tensor-scaled mode share it."""
  s = div_by_constant(amax, E4M3_MAX * E2M1_MAX)
  return jnp.where(jnp.isfinite(amax), jnp.where(s == 0, 1.0, s), jnp.nan)


def _outer_scale(amax: jax.Array, finite: jax.Array, scaling: str) -> jax.Array:
  if scaling == "block":
    s = jnp.where(finite, block_outer_scale(amax, _xla_division), jnp.nan)
  else:
    s = tensor_outer_scale(amax)
  return lax.optimization_barrier(s)


def quantize_nvfp4(
    x: jax.typing.ArrayLike,
    *,
    axis: int = -1,
    rounding: Rounding = "nearest",
    key: jax.Array | None = None,
    scaling: Scaling = "block",
    block_2d: bool = False,
) -> NVFP4Tensor:
  """Quantizes x to NVFP4 along `axis` (the GEMM's reduction axis).

  Args:
    x: floating-point array (any float dtype; computed in float32).
    axis: the axis the 1x16 / 1x128 groups run along. Lengths that are not a
      multiple of 128 are zero-padded internally and cropped on dequantize.
    rounding: "nearest" (ties to even) or "stochastic" (unbiased; needs key).
    key: JAX PRNG key for stochastic rounding: it seeds the counter-based
      generator (counter_rng.sr_seed), 16 random bits per element.
    scaling: "block" = TetraJet-v2 double-block (1x16 E4M3 inside 1x128 FP32);
      "tensor" = NVIDIA's recipe (1x16 E4M3 under one FP32 scale per tensor).
    block_2d: 16x16 inner blocks (weights in NVIDIA's recipe, so W and W^T
      quantize identically). Needs a 2-D x; with scaling="block" the outer
      scales are 128x128 tiles so the transposition symmetry is kept.

  Returns:
    NVFP4Tensor; `dequantize(t)` gives the float32 values it stands for.

  Example:
    >>> t = quantize_nvfp4(jnp.ones((4, 256)))
    >>> dequantize(t).shape
    (4, 256)
  """
  x = checks.as_float_input(x, "quantize_nvfp4")
  axis = checks.normalize_axis(axis, x.ndim, "quantize_nvfp4")
  if rounding not in ("nearest", "stochastic"):
    raise ValueError(f"quantize_nvfp4: unknown rounding {rounding!r}; use 'nearest' or 'stochastic'.")
  if scaling not in ("block", "tensor"):
    raise ValueError(f"quantize_nvfp4: unknown scaling {scaling!r}; use 'block' or 'tensor'.")
  if rounding == "stochastic" and key is None:
    raise ValueError("quantize_nvfp4: rounding='stochastic' needs a PRNG key (key=jax.random.key(...)).")
  if block_2d and x.ndim != 2:
    raise ValueError(f"quantize_nvfp4: block_2d=True needs a 2-D array, got shape {x.shape}.")
  check = checks.numerics_checking_enabled()
  if check:
    checks.check_concrete_input(x, "quantize_nvfp4")
  return _quantize_nvfp4(x, key, axis=axis, rounding=rounding, scaling=scaling, block_2d=block_2d, check=check)


# Jitted so eager callers get one compiled kernel instead of op-by-op
# dispatch; `check` is static because the checking flag is read at trace time.
@functools.partial(jax.jit, static_argnames=("axis", "rounding", "scaling", "block_2d", "check"))
def _quantize_nvfp4(x, key, *, axis, rounding, scaling, block_2d, check) -> NVFP4Tensor:
  if check:
    checks.emit_finite_check(x, "quantize_nvfp4")
  shape = tuple(x.shape)
  xc = jnp.moveaxis(x, axis, -1)  # canonical: quantized axis last
  k_multiple = OUTER_BLOCK if scaling == "block" else INNER_BLOCK
  xc = checks.pad_axis_to_multiple(xc, -1, k_multiple)
  if block_2d:
    xc = checks.pad_axis_to_multiple(xc, 0, OUTER_BLOCK if scaling == "block" else INNER_BLOCK)
  ax = jnp.abs(xc)
  finite = jnp.isfinite(xc)

  if block_2d:
    r, k = xc.shape
    # Inner amax over 16x16 tiles: [R/16, K/16].
    amax_in = ax.reshape(r // 16, 16, k // 16, 16).max(axis=(1, 3))
    if scaling == "block":
      amax_out = ax.reshape(r // 128, 128, k // 128, 128).max(axis=(1, 3))
      fin_out = finite.reshape(r // 128, 128, k // 128, 128).all(axis=(1, 3))
      s_out = _outer_scale(amax_out, fin_out, "block")  # [R/128, K/128]
      s_out_in = jnp.repeat(jnp.repeat(s_out, 8, 0), 8, 1)  # per inner tile
    else:
      s_out = _outer_scale(ax.max(initial=0.0), None, "tensor")  # initial: empty inputs
      s_out_in = s_out
    s_in = _inner_scales(amax_in, s_out_in)  # [R/16, K/16]
    per_element = lambda v: jnp.repeat(jnp.repeat(v, 16, 0), 16, 1)  # [R/16, K/16] -> [R, K]
  else:
    lead, k = xc.shape[:-1], xc.shape[-1]
    amax_in = ax.reshape(*lead, k // 16, 16).max(axis=-1)  # [..., K/16]
    if scaling == "block":
      amax_out = amax_in.reshape(*lead, k // 128, 8).max(axis=-1)  # [..., K/128]
      fin_out = finite.reshape(*lead, k // 128, 128).all(axis=-1)
      s_out = _outer_scale(amax_out, fin_out, "block")
      s_out_in = jnp.repeat(s_out, 8, axis=-1)  # [..., K/16]
    else:
      s_out = _outer_scale(ax.max(initial=0.0), None, "tensor")  # initial: empty inputs
      s_out_in = s_out
    s_in = _inner_scales(amax_in, s_out_in)  # [..., K/16]
    per_element = lambda v: jnp.repeat(v, 16, axis=-1)  # [..., K/16] -> [..., K]

  # The element rule: one correctly rounded reciprocal per 16-block, then a
  # multiplication per element (no division). The barriers keep XLA's CPU
  # compile time bounded (see scales.div_rn).
  recip = lax.optimization_barrier(reciprocal_rn(s_in * s_out_in))  # r = fp32(1 / s) per inner block
  v = flush_subnormal(ax) * per_element(recip)  # |x| r in float32
  if rounding == "nearest":
    idx = nearest_index(v)
  else:
    idx = stochastic_index(v, counter_rng.element_bits(counter_rng.sr_seed(key), xc.shape))
  codes = with_sign(lax.optimization_barrier(idx), xc < 0)
  return NVFP4Tensor(
      codes=pack_e2m1(codes),
      scale_inner=s_in.astype(jnp.float8_e4m3fn),
      scale_outer=jnp.asarray(s_out, jnp.float32),
      shape=shape, axis=axis, scaling=scaling, block_2d=block_2d)


def nvfp4_bf16_operand(t: NVFP4Tensor | NVFP4Operand) -> tuple[jax.Array, jax.Array]:
  """Splits t into an exact bf16 operand and its FP32 outer scales.

  q * s_in has at most 2 + 4 significant bits and an E4M3-sized exponent, so
  it is exact in bfloat16. An exact NVFP4 GEMM multiplies these bf16 operands
  with FP32 accumulation and applies scale_outer once per 128-wide K chunk.
  Only for 1-D block scaling or tensor scaling.

  Returns:
    (qs_bf16 [..., Kp] in canonical layout, scale_outer); an NVFP4Operand's own fields.
  """
  if isinstance(t, NVFP4Operand):
    return t.values, t.scale_outer
  if t.block_2d and t.scaling == "block":
    raise ValueError("nvfp4_bf16_operand: 2-D block-scaled tensors have 128x128 outer tiles; "
                     "dequantize them instead.")
  return _bf16_operand(t)


@jax.jit  # traced once per operand shape: a train step decodes the same shapes in several layers
def _bf16_operand(t: NVFP4Tensor) -> tuple[jax.Array, jax.Array]:
  q = decode_e2m1(unpack_e2m1(t.codes))
  s_in, _ = _expand_scales(t)
  return (q * s_in).astype(jnp.bfloat16), t.scale_outer
