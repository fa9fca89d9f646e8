"""Arguments and results of the backward quantizer kernel (`nvfp4_quantize_backward`): the
checks that turn bad input into a ValueError before anything is traced, the outputs' shapes
and SMEM blocks, and the kernel's raw outputs assembled into an NVFP4Tensor."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from tetrajet_jax.kernels import _platform
from tetrajet_jax.kernels.nvfp4_quantize import INNER, OUTER, check_tensor_scale
from tetrajet_jax.numerics import NVFP4Tensor
from tetrajet_jax.numerics.checks import pad_axis_to_multiple


def check_seed(seed, rounding, name: str) -> None:
  if rounding not in ("stochastic", "nearest"):
    raise ValueError(f"{name}: rounding must be 'stochastic' or 'nearest', got {rounding!r}.")
  if (seed is None) != (rounding == "nearest"):
    raise ValueError(f"{name}: rounding={rounding!r} " + ("needs a seed (counter_rng.sr_seed(key))."
                     if seed is None else "takes no seed; pass seed=None."))
  if seed is not None and jnp.ndim(seed) != 0:
    raise ValueError(f"{name}: seed must be a scalar, got shape {jnp.shape(seed)}.")


def checked_input(x, signs_16, *, axis, block, emit_transformed, _division, _math, _tile_source,
                   tensor_scale=None, _semantics=_platform.DEFAULT_SEMANTICS, name="quantize_nvfp4_backward"):
  """Validates `quantize_nvfp4_backward`'s arguments (ValueError says what to change) and returns
  (x in canonical orientation, axis 0/1, canonical rows r, quantized length k); axis 0 pads the
  tokens to a multiple of 128."""
  x = jnp.asarray(x)
  if x.ndim != 2:
    raise ValueError(f"{name}: expected a 2-D array, got shape {x.shape}; reshape leading axes into rows.")
  if axis not in (-1, 0, 1):
    raise ValueError(f"{name}: axis={axis} must be -1/1 (last axis) or 0 (first axis).")
  axis = axis % 2
  if x.dtype not in (jnp.bfloat16, jnp.float32):
    raise ValueError(f"{name}: dtype {x.dtype} not supported; pass bfloat16 or float32.")
  if block % 64 or block <= 0:
    raise ValueError(f"{name}: block={block} must be a positive multiple of 64 (wgmma M granularity).")
  if signs_16 is not None and jnp.shape(signs_16) != (INNER,):
    raise ValueError(f"{name}: signs_16 must have shape (16,), got {jnp.shape(signs_16)}; "
                     "use tetrajet_jax.numerics.hadamard_signs(key), or None for no RHT.")
  check_tensor_scale(tensor_scale, name)
  if (_division not in ("exact", "hardware") or _math not in ("full", "none")
      or _tile_source not in ("smem", "registers", "blocks")):
    raise ValueError(f"{name}: unknown _division={_division!r} / _math={_math!r} / _tile_source={_tile_source!r}.")
  _platform.quantizer_params(_semantics)  # an unknown name raises
  if _math == "none" and emit_transformed:
    raise ValueError(f"{name}: _math='none' computes no transform to emit.")
  shape = tuple(x.shape)
  if axis == 1:
    r, k = shape
    if r % block or k % OUTER:
      raise ValueError(f"{name}: shape {shape} with axis=-1 needs rows % {block} == 0 and cols % {OUTER} == 0; "
                       "pad (zeros change no scale) or use the XLA path (can_use_pallas_backward_quantizer).")
  else:
    if shape[1] % block:
      raise ValueError(f"{name}: shape {shape} with axis=0 needs cols % {block} == 0; "
                       "pad or use the XLA path (can_use_pallas_backward_quantizer).")
    x = pad_axis_to_multiple(x, 0, OUTER)
    k, r = x.shape  # canonical: r = output rows (x's columns), k = quantized length
  return x, axis, r, k


def output_specs(r: int, k: int, block: int, *, emit_operand: bool, emit_transformed: bool, amax_only: bool):
  """(out shapes, their SMEM blocks, the count of pipelined outputs): codes, s_in^T, s_out^T,
  [operand], [transformed values]; or, amax_only, the row amax of every 128-block, [Kp/128, rows]."""
  kb = k // OUTER
  if amax_only:
    return [jax.ShapeDtypeStruct((kb, r), jnp.float32)], [(1, block)], 1
  out_shape = [
      jax.ShapeDtypeStruct((r, k // 2), jnp.uint8),
      jax.ShapeDtypeStruct((k // INNER, r), jnp.float32),  # s_in^T: one TMA row per inner block
      jax.ShapeDtypeStruct((kb, r), jnp.float32),  # s_out^T
  ]
  out_blocks = [(block, OUTER // 2), (OUTER // INNER, block), (1, block)]
  if emit_operand:
    out_shape.append(jax.ShapeDtypeStruct((r, k // 2), jnp.uint32))
    out_blocks.append((block, OUTER // 2))
  n_out = len(out_shape)
  if emit_transformed:  # copied straight from y_smem (one slot: debug output, keeps SMEM in budget)
    out_shape.append(jax.ShapeDtypeStruct((r, k), jnp.float32))
  return out_shape, out_blocks, n_out


def assemble(outs, n_out: int, shape: tuple[int, ...], axis: int, tensor_scale, *, emit_operand: bool,
              emit_transformed: bool):
  """The kernel's outputs as an NVFP4Tensor (scales transposed back), then the optional extras."""
  r, k = (shape[0], shape[1]) if axis == 1 else (shape[1], -(-shape[0] // OUTER) * OUTER)
  kb = k // OUTER
  codes, s_in_t, s_out_t = outs[:3]
  tensor = tensor_scale is not None
  t = NVFP4Tensor(codes=codes, scale_inner=s_in_t.T.astype(jnp.float8_e4m3fn),
                  scale_outer=tensor_scale.astype(jnp.float32) if tensor else s_out_t.T,
                  shape=shape, axis=axis, scaling="tensor" if tensor else "block", block_2d=False)
  extra = []
  if emit_operand:
    extra.append(lax.bitcast_convert_type(outs[3], jnp.bfloat16).reshape(r, k))
  if emit_transformed:
    y = outs[n_out].reshape(r, kb, 2, OUTER // 2)  # [.., even/odd, i] -> element 2i + parity
    extra.append(jnp.swapaxes(y, 2, 3).reshape(r, k))
  return (t, *extra) if extra else t
