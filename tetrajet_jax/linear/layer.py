"""The quantized linear layer: y = x @ kernel with NVFP4 forward and backward.

Notation follows docs/SPEC.md section 2 with Flax's layout: x [M, K], kernel [K, N] (= W^T),
y [M, N]. The three GEMMs and their quantizers:

  forward  Y  = Q1(X) . Q2(W)                 both along K
  dgrad    dX = Q3(H dY) . Q4(H W_hat^T)      both along N, H = RHT-16 (key_dx)
  wgrad    dW = Q6(H X_hat^T) . Q5(H dY^T)    both along M (tokens), H from key_dw

With `aligned_backward`, Q4/Q6 re-quantize the forward's dequantized operands
W_hat = deq(Q2(W)) and X_hat = deq(Q1(X)), so with stochastic rounding the
gradient estimates are unbiased for the computation the forward really did:
E[dX] = dY W_hat, E[dW] = X_hat^T dY. The same RHT on both operands of a GEMM
cancels in the product (H^T H = I).

OutControl (docs/SPEC.md section 4): `outlier_idx` names input channels that run in MXFP8 in
the forward and in the weight gradient (no RHT, no SR there); the input
gradient stays all-FP4 from the assembled W_hat. The FP4 part gathers the
other channels in the order `fp4_idx` gives (QuantLinear: descending
calibration norm, so FP4 blocks group channels of similar magnitude) and is
zero-padded along K to a multiple of 128 (zeros change no amax and no dot
product), so any channel count works. `fp4_weight_values` is the forward's
own weight quantization (Q2 of the gathered FP4 rows), shared with OsciReset.

The forward saves X in quantized form (packed codes + scales), not a bf16
copy; W is re-quantized from the master weight in the backward.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from tetrajet_jax.linear import recipes as recipes_lib
from tetrajet_jax.linear import gemm as gemm_lib
from tetrajet_jax.linear.gemm import backward_quantize, gemm_nt, rtn_quantize
from tetrajet_jax.numerics import (MXFP8Tensor, NVFP4Operand, NVFP4Tensor, dequantize_mxfp8_canonical,
                                   dequantize_nvfp4_canonical, mxfp8_values, quantize_mxfp8, quantize_nvfp4,
                                   random_hadamard_16)
from tetrajet_jax.numerics.checks import pad_axis_to_multiple
from tetrajet_jax.numerics.nvfp4 import OUTER_BLOCK

Recipe = recipes_lib.Recipe
# NVIDIA's recipe uses one fixed RHT sign vector for the whole run.
_FIXED_RHT_SEED = 0x7E7A


class _Keys(NamedTuple):
  rht_dx: jax.Array
  rht_dw: jax.Array
  q: tuple[jax.Array, ...]  # q[i] for quantizer Q(i+1)


def _split_keys(key: jax.Array, recipe: Recipe) -> _Keys:
  """Independent keys per transform and per quantizer (never shared by the two
  operands of one GEMM, which would correlate their rounding)."""
  ks = jax.random.split(key, 8)
  if recipe.rht_fixed_signs:
    fixed = jax.random.key(_FIXED_RHT_SEED)
    return _Keys(fixed, fixed, tuple(ks[2:]))
  return _Keys(ks[0], ks[1], tuple(ks[2:]))


def _quantize(x: jax.Array, i: int, recipe: Recipe, keys: _Keys, *, axis: int, weight: bool = False,
              backend: gemm_lib.Backend = "xla") -> NVFP4Tensor | jax.Array:
  """Applies quantizer Q(i) along `axis`; a disabled quantizer returns x (float32)."""
  cfg = recipe.quantizers[i - 1]
  if not cfg.enabled:
    return jnp.moveaxis(x.astype(jnp.float32), axis, -1)  # same canonical layout
  if cfg.rounding == "nearest" and _kernel_layout(x, recipe, weight):
    fused = rtn_quantize(x if axis in (-1, 1) else x.T, backend, scaling=recipe.scaling, flat_rows=weight)
    if fused is not None:
      return fused  # bitwise equal to quantize_nvfp4(x, axis=axis, scaling=...) in canonical layout
  return quantize_nvfp4(
      x, axis=axis, rounding=cfg.rounding, key=keys.q[i - 1] if cfg.rounding == "stochastic" else None,
      scaling=recipe.scaling, block_2d=weight and recipe.weight_block_2d)


def _quantize_rht(x: jax.Array, i: int, recipe: Recipe, keys: _Keys, rht_key: jax.Array, rht: bool, *,
                  axis: int, weight: bool = False, backend: gemm_lib.Backend = "xla",
                  operand: bool = False) -> NVFP4Tensor | NVFP4Operand | jax.Array:
  """Q(i)(RHT(x)) along `axis` (RHT only if `rht`): where the backend runs
  it, the fused kernel does transform, scales and rounding in one pass (RTN
  without RHT goes to the RTN kernel); elsewhere the XLA transform then
  quantize_nvfp4. operand: the Triton kernel's bf16 GEMM operand where it runs."""
  cfg = recipe.quantizers[i - 1]
  if cfg.enabled and (rht or cfg.rounding == "stochastic") and _kernel_layout(x, recipe, weight):
    fused = backward_quantize(x, rht_key if rht else None, keys.q[i - 1], axis=axis, rounding=cfg.rounding,
                              scaling=recipe.scaling, backend=backend, flat_rows=weight, operand=operand)
    if fused is not None:
      return fused
  return _quantize(_rht(x.astype(jnp.float32), rht_key, rht, axis), i, recipe, keys, axis=axis, weight=weight,
                   backend=backend)


def _kernel_layout(x: jax.Array, recipe: Recipe, weight: bool) -> bool:
  """Whether the quantizer kernels can take this operand's blocks: 2-D, 1x16 inner blocks
  (not NVIDIA's 16x16 weight blocks)."""
  return x.ndim == 2 and not (weight and recipe.weight_block_2d)


def _values(op: NVFP4Tensor | jax.Array) -> jax.Array:
  """Canonical-layout float32 values of an operand (dequantized if quantized)."""
  if isinstance(op, NVFP4Tensor):
    return dequantize_nvfp4_canonical(op)
  return op


def _rht(x: jax.Array, key: jax.Array, enabled: bool, axis: int) -> jax.Array:
  return random_hadamard_16(x, key, axis=axis) if enabled else x


def _complement(outlier_idx: jax.Array, k: int) -> jax.Array:
  """Ascending indices of the channels not in outlier_idx (static count): the
  FP4 order when the caller gives outlier channels but no FP4 order."""
  mask = jnp.zeros((k,), jnp.bool_).at[outlier_idx].set(True)
  return jnp.nonzero(~mask, size=k - outlier_idx.shape[0])[0].astype(jnp.int32)


class ChannelSplit(NamedTuple):
  """OutControl's split of a layer's K input channels.

  Attributes:
    outlier: int32 [n], the channels that run in MXFP8.
    fp4: int32 [K - n], the other channels in the order the FP4 part gathers
      them (its 16- and 128-blocks follow this order).
  """

  outlier: jax.Array
  fp4: jax.Array


def channel_split(outlier_idx: jax.typing.ArrayLike, k: int,
                  fp4_idx: jax.typing.ArrayLike | None = None) -> ChannelSplit:
  """A ChannelSplit from outlier channels and, optionally, the FP4 order
  (default: the remaining channels ascending). Checks the indices when they
  are concrete (`validate_channel_split`)."""
  outlier_idx = jnp.asarray(outlier_idx)
  if outlier_idx.ndim != 1 or not jnp.issubdtype(outlier_idx.dtype, jnp.integer):
    raise ValueError(f"outlier_idx must be a 1-D integer array, got {outlier_idx.dtype}{outlier_idx.shape}.")
  outlier_idx = outlier_idx.astype(jnp.int32)
  if fp4_idx is None:
    validate_channel_split(outlier_idx, None, k)
    return ChannelSplit(outlier_idx, _complement(outlier_idx, k))
  fp4_idx = jnp.asarray(fp4_idx)
  if fp4_idx.ndim != 1 or not jnp.issubdtype(fp4_idx.dtype, jnp.integer):
    raise ValueError(f"fp4_idx must be a 1-D integer array, got {fp4_idx.dtype}{fp4_idx.shape}.")
  validate_channel_split(outlier_idx, fp4_idx, k)
  return ChannelSplit(outlier_idx, fp4_idx.astype(jnp.int32))


def validate_channel_split(outlier_idx, fp4_idx, k: int) -> None:
  """Raises ValueError unless the outlier channels are distinct, in [0, K) and
  fewer than K, and `fp4_idx` (if given) holds exactly the other channels.

  Shapes are always checked; values only when concrete (under jit they are
  checked where they are set: `QuantLinear`'s calibration freeze).
  """
  n = outlier_idx.shape[0]
  if n >= k:
    raise ValueError(f"{n} outlier channels for K={k} input channels; the count must be less than K "
                     "(use outlier_count(K, p)).")
  if fp4_idx is not None and fp4_idx.shape[0] != k - n:
    raise ValueError(f"fp4_idx has {fp4_idx.shape[0]} channels; with {n} outlier channels and K={k} it "
                     f"must list the other {k - n}.")
  if isinstance(outlier_idx, jax.core.Tracer) or isinstance(fp4_idx, jax.core.Tracer):
    return
  out = np.asarray(outlier_idx)
  if out.size and (out.min() < 0 or out.max() >= k):
    bad = out[(out < 0) | (out >= k)]
    raise ValueError(f"outlier channel indices {bad[:8].tolist()} are outside [0, K={k}).")
  if np.unique(out).size != out.size:
    vals, counts = np.unique(out, return_counts=True)
    raise ValueError(f"outlier channel indices repeat: {vals[counts > 1][:8].tolist()}; each channel at most once.")
  if fp4_idx is not None:
    seen = np.zeros(k, np.int64)
    rest = np.asarray(fp4_idx)
    if rest.size and (rest.min() < 0 or rest.max() >= k):
      raise ValueError(f"fp4_idx holds indices outside [0, K={k}).")
    np.add.at(seen, out, 1)
    np.add.at(seen, rest, 1)
    if not (seen == 1).all():
      raise ValueError(f"outlier_idx and fp4_idx must together list every channel of K={k} exactly once; "
                       f"channels {np.nonzero(seen != 1)[0][:8].tolist()} are missing or repeated.")


def fp4_weight_values(kernel: jax.typing.ArrayLike, fp4_idx: jax.typing.ArrayLike | None = None, *,
                      recipe: str | Recipe = "tetrajet_v2") -> jax.Array:
  """The forward's dequantized FP4 weight Q2(W), float32 in kernel layout [K, N].

  Q2 quantizes the FP4 rows `kernel[fp4_idx]` (all rows if None) in that
  order along K, exactly as the layer's forward does (same 16- and
  128-blocks, zero padding to 128), and the values go back to their rows;
  rows not in `fp4_idx` (the MXFP8 outlier channels) hold 0.
  """
  recipe = recipes_lib.get(recipe)
  if recipe.quantizers[1].rounding != "nearest":
    raise ValueError(f"fp4_weight_values: recipe {recipe.name!r} rounds Q2 stochastically; its weight grid "
                     "is not a function of W.")
  kernel = jnp.asarray(kernel)
  keys = _split_keys(jax.random.key(0), recipe)  # unused by RTN
  if fp4_idx is None:
    return _values(_fp4_weight(kernel, None, recipe, keys))[:, :kernel.shape[0]].T
  fp4_idx = jnp.asarray(fp4_idx, jnp.int32)
  vals = _values(_fp4_weight(kernel, fp4_idx, recipe, keys))[:, :fp4_idx.shape[0]].T
  return jnp.zeros(kernel.shape, jnp.float32).at[fp4_idx].set(vals)


def _fp4_weight(kernel: jax.Array, fp4_idx, recipe: Recipe, keys: _Keys):
  """Q2 of the FP4 rows kernel[fp4_idx] (all rows if None) along K: the one
  weight quantization of the forward, W_hat and OsciReset."""
  w = kernel if fp4_idx is None else kernel[fp4_idx]
  return _quantize(w, 2, recipe, keys, axis=0, weight=True, backend=recipe.backend)


class _Residuals(NamedTuple):
  x_fwd: Any  # Q1(X) (NVFP4Tensor) or X (Q1 off), FP4 channels: what X_hat is rebuilt from
  x_out: Any  # MXFP8Tensor of X's outlier channels, or None
  q6_pre: Any  # Q6 operand computed in the forward (non-aligned recipes), or None
  kernel: jax.Array  # master weight: W is re-quantized from it
  key: jax.Array
  split: Any  # ChannelSplit or None
  x_dtype: jax.Array  # empty array carrying x's dtype (dX is returned in it)


def _as_rounded(a: jax.Array) -> jax.Array:
  """`a` with its values really rounded to its (narrow) dtype.

  When the caller computed a bf16 x or dY from float32 inside the same jit
  (`h.astype(bf16)`, the cotangent of a bf16 output), XLA's GPU pipeline may
  drop the f32 -> bf16 -> f32 round trip into our quantizers
  (xla_allow_excess_precision), so the layer would quantize values the bf16
  type does not hold, and GPU and CPU would quantize different inputs. The
  barrier makes the rounded bf16 array a value of its own.
  """
  return lax.optimization_barrier(a) if jnp.dtype(a.dtype).itemsize < 4 else a


def _forward(x, kernel, key, split: ChannelSplit | None, recipe: Recipe):
  backend = recipe.backend
  x = _as_rounded(x)
  keys = _split_keys(key, recipe)
  if split is None:
    x_fp4, x_out = x, None
  else:
    x_fp4 = x[:, split.fp4]  # K' = K - n channels in the FP4 order; quantizers zero-pad K' to 128
    x_out = quantize_mxfp8(x[:, split.outlier], axis=-1)
  xq = _quantize(x_fp4, 1, recipe, keys, axis=-1, backend=backend)  # [M, K'] along K
  wq = _fp4_weight(kernel, None if split is None else split.fp4, recipe, keys)  # [N, K'] along K
  # The outlier channels' MXFP8 product joins the FP4 product's FP32 sum, and the GEMM's epilogue
  # rounds to the output dtype once (the same RNE cast as XLA's): no float32 [M, N] through HBM.
  extra = None if x_out is None else (x_out, quantize_mxfp8(kernel[split.outlier], axis=0))  # w: [N, n_out]
  y = gemm_nt(xq, wq, backend=backend, out_dtype=recipe.out_dtype, extra=extra)
  q6_pre = None
  if not recipe.aligned_backward:
    # Non-aligned (NVIDIA): Q6 quantizes the high-precision X; doing it now
    # means the residual is 4.5-bit X^T instead of a bf16 copy of X.
    q6_pre = _wgrad_x_operand(x_fp4, recipe, keys)
  res = _Residuals(x_fwd=xq if recipe.aligned_backward else None, x_out=x_out, q6_pre=q6_pre,
                   kernel=kernel, key=key, split=split, x_dtype=jnp.zeros((0,), x.dtype))
  return y.astype(recipe.out_dtype), res


def _wgrad_x_operand(x_src: jax.Array, recipe: Recipe, keys: _Keys, operand: bool = False):
  """Q6: X (or X_hat) along tokens M, padded to 128, RHT with key_dw. X stays in its dtype
  (NVIDIA's bf16 X: the kernel reads half the bytes; the XLA path widens it, exactly)."""
  xp = pad_axis_to_multiple(x_src, 0, OUTER_BLOCK)  # [Mp, K']
  return _quantize_rht(xp, 6, recipe, keys, keys.rht_dw, recipe.rht_wgrad, axis=0,
                       backend=recipe.backend, operand=operand)  # canonical [K', Mp]


def _wgrad_x_from_codes(x_fwd, m: int, recipe: Recipe, keys: _Keys,
                        operand: bool = False) -> NVFP4Tensor | NVFP4Operand | None:
  """Q6 of X_hat = the forward's Q1 read from its codes where the kernel runs (`backward_requantize`):
  the same codes as `_wgrad_x_operand(X_hat)`; None elsewhere."""
  cfg = recipe.quantizers[5]
  if not (isinstance(x_fwd, NVFP4Tensor) and cfg.enabled and recipe.rht_wgrad and recipe.scaling == "block"):
    return None
  return gemm_lib.backward_requantize(x_fwd, m, keys.rht_dw, keys.q[5], rounding=cfg.rounding,
                                      backend=recipe.backend, operand=operand)


def _w_hat(kernel: jax.Array, split: ChannelSplit | None, recipe: Recipe, keys: _Keys) -> jax.Array:
  """W_hat [K, N]: the forward's dequantized weight, assembled from both parts."""
  k = kernel.shape[0]
  if split is None:
    return _values(_fp4_weight(kernel, None, recipe, keys))[:, :k].T
  rest, out = split.fp4, split.outlier
  w_rest = _values(_fp4_weight(kernel, rest, recipe, keys))[:, :rest.shape[0]].T
  w_out = dequantize_mxfp8_canonical(quantize_mxfp8(kernel[out], axis=0))[:, :out.shape[0]].T
  return jnp.zeros(kernel.shape, jnp.float32).at[rest].set(w_rest).at[out].set(w_out)


class _BackwardOperands(NamedTuple):
  w_src: jax.Array  # W_hat (aligned) or W, [K, N]: what Q4 quantizes after the RHT
  x_hat: Any  # X_hat [M, K'] that Q6 re-quantizes (aligned), or None
  a3: Any  # Q3(H dY)      [M, Np]  along N
  b4: Any  # Q4(H W^T)     [K, Np]  along N
  a5: Any  # Q5(H dY^T)    [N, Mp]  along tokens
  b6: Any  # Q6(H X^T)     [K', Mp] along tokens


def _backward_operands(recipe: Recipe, res: _Residuals, dy, gemm_operands: bool = False) -> _BackwardOperands:
  """The FP4 operands of the two backward GEMMs (also what the stage-by-stage tests inspect).
  gemm_operands: Q3, Q5 and Q6 as their Triton kernels' bf16 GEMM operands where those run
  (`gemm.gemm_operands`), the same products with no decode pass; Q4 (a weight, the flat view) stays
  codes."""
  keys = _split_keys(res.key, recipe)
  backend = recipe.backend
  # dY stays in its dtype (bf16): the fused quantizer reads half the bytes; the
  # XLA path widens it to float32 (exact).
  # dX = Q3(H dY) . Q4(H W^T), both along N; all FP4 even with OutControl.
  w_src = _w_hat(res.kernel, res.split, recipe, keys) if recipe.aligned_backward else res.kernel
  a3 = _quantize_rht(dy, 3, recipe, keys, keys.rht_dx, recipe.rht_dgrad, axis=-1, backend=backend,
                     operand=gemm_operands)
  b4 = _quantize_rht(w_src, 4, recipe, keys, keys.rht_dx, recipe.rht_dgrad, axis=-1, weight=True,
                     backend=backend)
  # dW = Q6(H X_hat^T) . Q5(H dY^T), both along tokens M (padded to 128).
  dyp = pad_axis_to_multiple(dy, 0, OUTER_BLOCK)  # [Mp, N]
  a5 = _quantize_rht(dyp, 5, recipe, keys, keys.rht_dw, recipe.rht_wgrad, axis=0, backend=backend,
                     operand=gemm_operands)
  x_hat = None
  if recipe.aligned_backward:
    x_hat = _values(res.x_fwd)[:dy.shape[0]]  # [M, K'p]: K' zero-padded to 128 (zero rows of dW, cropped)
    b6 = _wgrad_x_from_codes(res.x_fwd, dy.shape[0], recipe, keys, gemm_operands)
    b6 = _wgrad_x_operand(x_hat, recipe, keys, gemm_operands) if b6 is None else b6  # else XLA drops x_hat
  else:
    b6 = res.q6_pre
  return _BackwardOperands(w_src, x_hat, a3, b4, a5, b6)


def _backward(recipe: Recipe, res: _Residuals, dy):
  kernel, split = res.kernel, res.split
  k, n = kernel.shape
  m = dy.shape[0]
  dy = _as_rounded(dy)  # for the FP4 operands and the MXFP8 outlier operand alike
  ops = _backward_operands(recipe, res, dy, gemm_operands=gemm_lib.gemm_operands())
  backend = recipe.backend
  dx = gemm_nt(ops.a3, ops.b4, backend=backend, out_dtype=res.x_dtype.dtype)[:, :k]  # x's dtype, as the VJP returns
  dw_fp4 = gemm_nt(ops.b6, ops.a5, backend=backend, out_dtype=jnp.float32)  # [K'p, N]
  if split is None:
    dw = dw_fp4
  else:
    # Outlier channels: MXFP8 X_hat_out^T x MXFP8 dY along M, no RHT, no SR. Both operands' values
    # in their own [M, *] layout: dY is neither widened nor transposed in HBM.
    x_out_hat = dequantize_mxfp8_canonical(res.x_out)[:m, :split.outlier.shape[0]]  # [M, n_out]
    dw_out = gemm_lib.gemm_tn(mxfp8_values(x_out_hat, axis=0), mxfp8_values(dy, axis=0),
                              backend=backend)  # [n_out, N]
    rest = split.fp4
    dw = jnp.zeros((k, n), jnp.float32).at[rest].set(dw_fp4[:rest.shape[0]]).at[split.outlier].set(dw_out)
  return dx, dw[:k]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _linear_2d(x, kernel, key, split, recipe: Recipe, interpreted: frozenset):
  del interpreted  # a cache key only: gemm.interpret_kernels is read while tracing
  return _forward(x, kernel, key, split, recipe)[0]


def _linear_2d_fwd(x, kernel, key, split, recipe, interpreted):
  del interpreted
  return _forward(x, kernel, key, split, recipe)


def _linear_2d_bwd(recipe, interpreted, res: _Residuals, dy):
  del interpreted
  dx, dw = _backward(recipe, res, dy)
  return dx.astype(res.x_dtype.dtype), dw.astype(res.kernel.dtype), None, None


_linear_2d.defvjp(_linear_2d_fwd, _linear_2d_bwd)
# One compiled computation for eager callers (inside an outer jit it inlines).
_linear_2d_jit = jax.jit(_linear_2d, static_argnums=(4, 5))


OUTLIER_ROUNDINGS = recipes_lib.OUTLIER_ROUNDINGS


def outlier_count(k: int, fraction: float, rounding: str = "nearest") -> int:
  """OutControl's channel count for K input channels and fraction p.

  "nearest": round(p*K) (halves up), the paper's accuracy setting, at most
  K - 1. "block128": ceil(p*K) rounded up to a multiple of 128, capped at
  floor(K/128)*128 and at K - 128 (the reference code's kernel-friendly
  count; it keeps far more than p at small K).
  """
  if rounding not in OUTLIER_ROUNDINGS:
    raise ValueError(f"outlier_count: rounding must be one of {OUTLIER_ROUNDINGS}, got {rounding!r}.")
  if fraction <= 0:
    return 0
  if rounding == "nearest":
    return min(int(np.floor(fraction * k + 0.5)), k - 1)
  n = int(np.ceil(fraction * k / 128.0)) * 128
  return min(n, (k // 128) * 128, max(k - 128, 0))


def validate_linear_shapes(k: int, n: int, recipe: Recipe) -> None:
  mult = recipe.k_multiple
  for what, d in (("in_features K", k), ("out_features N", n)):
    if d % mult:
      raise ValueError(
          f"linear: {what}={d} is not a multiple of {mult}, which recipe {recipe.name!r} needs "
          f"({'1x128 FP32 blocks' if mult == 128 else '16-element blocks'} along the GEMM reduction axes). "
          f"Pad the layer to {d + (-d) % mult} or run it with recipe 'bf16'.")


def linear(
    x: jax.typing.ArrayLike,
    kernel: jax.typing.ArrayLike,
    *,
    recipe: str | Recipe = "tetrajet_v2",
    key: jax.Array | None = None,
    outlier_idx: jax.typing.ArrayLike | None = None,
    fp4_idx: jax.typing.ArrayLike | None = None,
) -> jax.Array:
  """Quantized y = x @ kernel with an NVFP4 forward and backward (custom_vjp).

  Args:
    x: activations [..., K].
    kernel: weight [K, N] (Flax layout: in x out), the FP32 master weight.
    recipe: a Recipe or preset name ('bf16', 'nvidia_nvfp4', 'tetrajet_v2',
      'tetrajet_v2_outcontrol', ...). Its `backend` field picks the
      execution ('auto', 'xla', 'pallas', 'reference'; see linear/gemm.py).
    key: PRNG key for stochastic rounding and RHT signs; required when the
      recipe uses them. Use a fresh key per layer per step.
    outlier_idx: int array of distinct input channels in [0, K), fewer than
      K (OutControl), that run in MXFP8. None or empty = pure FP4.
    fp4_idx: the other channels, in the order the FP4 part gathers them
      (QuantLinear passes descending calibration norm); default ascending.

  Returns:
    y [..., N] in the recipe's out_dtype (bf16 by default).

  Raises:
    gemm.BackendUnavailableError: recipe.backend='pallas' and a kernel cannot
      run on this device or shape (use 'auto' to fall back to XLA).

  Example:
    >>> y = linear(x, kernel, recipe="tetrajet_v2", key=jax.random.key(0))
  """
  recipe = recipes_lib.get(recipe)
  x = jnp.asarray(x)
  kernel = jnp.asarray(kernel)
  if kernel.ndim != 2:
    raise ValueError(f"linear: kernel must be 2-D [in, out], got shape {kernel.shape}.")
  k, n = kernel.shape
  if x.ndim < 1 or x.shape[-1] != k:
    raise ValueError(f"linear: x has shape {x.shape} but kernel expects {k} input features "
                     f"(x[..., {k}] @ kernel[{k}, {n}]).")
  lead = x.shape[:-1]
  if not recipe.quantized:
    y = jax.lax.dot_general(x.astype(jnp.bfloat16), kernel.astype(jnp.bfloat16),
                            (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return y.astype(recipe.out_dtype)
  validate_linear_shapes(k, n, recipe)
  if key is None:
    if recipe.needs_key:
      raise ValueError(f"linear: recipe {recipe.name!r} uses stochastic rounding / random Hadamard "
                       "signs and needs key=jax.random.key(...) (a fresh one per layer per step).")
    key = jax.random.key(0)  # unused by deterministic recipes
  split = None
  if outlier_idx is not None and jnp.shape(outlier_idx) != (0,):
    if recipe.scaling != "block":
      raise ValueError(f"linear: OutControl channels need a block-scaled recipe, not {recipe.name!r}.")
    try:
      split = channel_split(outlier_idx, k, fp4_idx)
    except ValueError as e:
      raise ValueError(f"linear: {e}") from None
  elif fp4_idx is not None:
    raise ValueError("linear: fp4_idx without outlier_idx; pass the outlier channels too (or neither).")
  y = _linear_2d_jit(x.reshape(-1, k), kernel, key, split, recipe, gemm_lib.interpreted())
  return y.reshape(*lead, n)


def residual_bytes_per_token(recipe: str | Recipe, k: int, n: int, *, outlier_fraction: float | None = None,
                             tokens: int = 4096) -> float:
  """Bytes the forward keeps for the backward, per token (excluding the
  weight, which is a parameter anyway), measured from the traced residuals."""
  recipe = recipes_lib.get(recipe)
  x = jax.ShapeDtypeStruct((tokens, k), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((k, n), jnp.float32)
  if not recipe.quantized:
    return 2.0 * k  # a bf16 dot keeps x (bf16) for dW
  p = recipe.outlier_fraction if outlier_fraction is None else outlier_fraction
  n_out = outlier_count(k, p, recipe.outlier_rounding)
  idx = None if n_out == 0 else ChannelSplit(jax.ShapeDtypeStruct((n_out,), jnp.int32),
                                             jax.ShapeDtypeStruct((k - n_out,), jnp.int32))
  xla = dataclasses.replace(recipe, backend="xla")
  res = jax.eval_shape(lambda a, b, i: _forward(a, b, jax.random.key(0), i, xla)[1], x, w, idx)
  leaves = [res.x_fwd, res.x_out, res.q6_pre]
  total = sum(int(np.prod(l.shape)) * jnp.dtype(l.dtype).itemsize for l in jax.tree.leaves(leaves))
  return total / tokens
