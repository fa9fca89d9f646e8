"""Flax NNX integration: a drop-in for `nnx.Linear` that runs the quantized
linear layer, owns its quantization key stream and its OutControl state.

Parameters and layout are nnx.Linear's (`kernel` [in, out], optional `bias`),
so initializers and checkpoints carry over. Extra state, all NNX Variables
(checkpointed with the model, never trained):
  QuantKeyState       the layer's key seed (uint32 key data) and call counter:
                      every call draws fold_in(seed, counter), so each layer
                      gets fresh SR/RHT randomness per step, reproducible
                      from the init rngs.
  OutControlStats     per-input-channel accumulated L2 norm of x (calibration).
  OutControlChannels  `oc_channels`: the frozen outlier channel indices (int32,
                      fixed count); `oc_fp4_channels`: the other channels in
                      the order the FP4 part gathers them. Both follow
                      descending accumulated norm (docs/SPEC.md section 4).

OutControl phases (a static attribute; changing it retraces):
  "fp4"        pure FP4 (before calibration),
  "calibrate"  pure FP4, and accumulate per-channel ||x||_2 each call,
  "frozen"     the top-p channels run in MXFP8 (docs/SPEC.md section 4).

The outlier count is `outlier_count(K, p, recipe.outlier_rounding)`;
`outlier_fractions` reports the effective fraction n/K per layer.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
from flax import nnx

from tetrajet_jax.linear import recipes as recipes_lib
from tetrajet_jax.linear.layer import (ChannelSplit, linear, outlier_count, validate_channel_split,
                                       validate_linear_shapes)
from tetrajet_jax.tree_paths import path_strs

OUTCONTROL_PHASES = ("fp4", "calibrate", "frozen")


class QuantKeyState(nnx.Variable):
  """Key seed / counter of a layer's quantization randomness."""


class OutControlStats(nnx.Variable):
  """Accumulated per-input-channel L2 norms of a layer's input."""


class OutControlChannels(nnx.Variable):
  """Frozen outlier (MXFP8) input channel indices of a layer."""


def stream_key(rngs: nnx.Rngs) -> jax.Array:
  """One draw from the 'quant' stream (else 'params', else the default one)."""
  for name in ("quant", "params", "default"):
    try:
      return getattr(rngs, name)()
    except AttributeError:
      continue
  raise ValueError("QuantLinear needs nnx.Rngs with a 'quant', 'params' or default stream.")


class QuantLinear(nnx.Module):
  """y = x @ kernel (+ bias) through `tetrajet_jax.linear` with a recipe.

  Example:
    >>> layer = QuantLinear(512, 1024, recipe="tetrajet_v2", rngs=nnx.Rngs(0))
    >>> y = layer(x)  # x [..., 512] -> y [..., 1024] (bf16)
  """

  def __init__(
      self,
      in_features: int,
      out_features: int,
      *,
      recipe: str | recipes_lib.Recipe = "tetrajet_v2",
      use_bias: bool = False,
      kernel_init: Callable = nnx.initializers.lecun_normal(),
      bias_init: Callable = nnx.initializers.zeros_init(),
      param_dtype: Any = jnp.float32,
      rngs: nnx.Rngs,
  ):
    self.recipe = recipes_lib.get(recipe)
    validate_linear_shapes(in_features, out_features, self.recipe)
    self.in_features = in_features
    self.out_features = out_features
    self.kernel = nnx.Param(kernel_init(rngs.params(), (in_features, out_features), param_dtype))
    self.bias = nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype)) if use_bias else None
    self.key_seed = QuantKeyState(jax.random.key_data(stream_key(rngs)))
    self.key_count = QuantKeyState(jnp.zeros((), jnp.uint32))
    n_out = (outlier_count(in_features, self.recipe.outlier_fraction, self.recipe.outlier_rounding)
             if self.recipe.quantized else 0)
    self.outcontrol_phase = "fp4"
    if n_out:
      self.oc_stats = OutControlStats(jnp.zeros((in_features,), jnp.float32))
      self.oc_channels = OutControlChannels(jnp.arange(n_out, dtype=jnp.int32))
      self.oc_fp4_channels = OutControlChannels(jnp.arange(n_out, in_features, dtype=jnp.int32))
    else:
      self.oc_stats = None
      self.oc_channels = None
      self.oc_fp4_channels = None

  @property
  def has_outcontrol(self) -> bool:
    return self.oc_channels is not None

  def channel_split(self) -> ChannelSplit | None:
    """The frozen split (outliers, FP4 order), or None before freezing / without OutControl."""
    if not self.has_outcontrol or self.outcontrol_phase != "frozen":
      return None
    return ChannelSplit(self.oc_channels[...], self.oc_fp4_channels[...])

  def set_channel_order(self, order: jax.typing.ArrayLike) -> None:
    """Sets the split from a permutation of the K channels: the first n
    (this layer's outlier count) run in MXFP8, the rest in FP4 in that order.

    Raises:
      ValueError: not a permutation of range(K), or the layer has no OutControl.
    """
    if not self.has_outcontrol:
      raise ValueError("set_channel_order: this layer has no OutControl (recipe outlier_fraction is 0).")
    order = jnp.asarray(order, jnp.int32)
    n = self.oc_channels[...].shape[0]
    if order.shape != (self.in_features,):
      raise ValueError(f"set_channel_order: order has shape {order.shape}; it must list all "
                       f"{self.in_features} input channels.")
    validate_channel_split(order[:n], order[n:], self.in_features)
    self._assign_order(order)

  def _assign_order(self, order: jax.Array) -> None:
    n = self.oc_channels[...].shape[0]
    self.oc_channels[...] = order[:n].astype(jnp.int32)
    self.oc_fp4_channels[...] = order[n:].astype(jnp.int32)

  def next_key(self) -> jax.Array:
    """A fresh key for this call; advances the layer's counter."""
    key = jax.random.fold_in(jax.random.wrap_key_data(self.key_seed[...]), self.key_count[...])
    self.key_count[...] = self.key_count[...] + 1
    return key

  def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
    """Args: x [..., in]; key: optional explicit key (else the layer's stream)."""
    if self.has_outcontrol and self.outcontrol_phase == "calibrate":
      xs = jax.lax.stop_gradient(x).astype(jnp.float32).reshape(-1, self.in_features)
      self.oc_stats[...] = self.oc_stats[...] + jnp.sqrt(jnp.sum(xs * xs, axis=0))
    split = self.channel_split()
    if key is None and self.recipe.quantized:
      key = self.next_key()
    y = linear(x, self.kernel[...], recipe=self.recipe, key=key,
               outlier_idx=None if split is None else split.outlier,
               fp4_idx=None if split is None else split.fp4)
    if self.bias is not None:
      y = y + self.bias[...].astype(y.dtype)
    return y


def reset_outlier_stats(model: nnx.Module) -> None:
  """Zeroes the accumulated OutControl statistics of every QuantLinear that has them."""
  for _, layer in iter_quant_linears(model):
    if layer.has_outcontrol:
      layer.oc_stats[...] = jnp.zeros_like(layer.oc_stats[...])


def iter_quant_linears(model: nnx.Module) -> Iterator[tuple[tuple, QuantLinear]]:
  """(path, layer) for every QuantLinear in the model's graph."""
  for path, module in nnx.iter_modules(model):
    if isinstance(module, QuantLinear):
      yield path, module


def set_outcontrol_phase(model: nnx.Module, phase: str) -> None:
  """Sets the OutControl phase of every QuantLinear with OutControl."""
  if phase not in OUTCONTROL_PHASES:
    raise ValueError(f"Unknown OutControl phase {phase!r}; use one of {', '.join(OUTCONTROL_PHASES)}.")
  for _, layer in iter_quant_linears(model):
    if layer.has_outcontrol:
      layer.outcontrol_phase = phase


def freeze_outlier_channels(model: nnx.Module) -> dict[str, int]:
  """Freezes each OutControl layer's channel order: descending accumulated
  norm (ties by index); the first n run in MXFP8, the rest in FP4 in that
  order (docs/SPEC.md section 4).

  Returns {layer path: channel count}. Raises if a layer saw no calibration
  data (its statistics are all zero): run phase "calibrate" first.
  """
  frozen = {}
  for path, layer in iter_quant_linears(model):
    if not layer.has_outcontrol:
      continue
    stats = layer.oc_stats[...]
    if not bool(jnp.any(stats > 0)):
      raise ValueError(f"OutControl layer {'/'.join(map(str, path))} has no calibration statistics; "
                       "run some steps with set_outcontrol_phase(model, 'calibrate') first.")
    n = layer.oc_channels[...].shape[0]
    # A permutation by construction: no host-side check (the arrays may span processes).
    layer._assign_order(jnp.argsort(-stats, stable=True))  # pylint: disable=protected-access
    layer.outcontrol_phase = "frozen"
    frozen["/".join(map(str, path))] = n
  return frozen


def outlier_fractions(model: nnx.Module) -> dict[str, float]:
  """{layer path: effective OutControl fraction n/K} for every layer with OutControl."""
  return {"/".join(map(str, path)): layer.oc_channels[...].shape[0] / layer.in_features
          for path, layer in iter_quant_linears(model) if layer.has_outcontrol}


def _kernel_paths(model: nnx.Module) -> dict[tuple[str, ...], QuantLinear]:
  return {path_strs(path) + ("kernel",): layer
          for path, layer in iter_quant_linears(model) if layer.recipe.quantized}


def quantized_kernel_filter(model: nnx.Module) -> Callable[[tuple[str, ...], Any], bool]:
  """Exact OsciReset param filter: True for kernels of quantized QuantLinears.

  Paths are tuples of strings, as in `nnx.state(model, nnx.Param).to_pure_dict()`
  (list indices as their decimal string).
  """
  paths = frozenset(_kernel_paths(model))
  return lambda path, leaf: path_strs(path) in paths


def outlier_channels_tree(model: nnx.Module, params: Any | None = None) -> Any:
  """A pytree like the model's pure param dict: each quantized kernel with
  frozen OutControl channels holds its `ChannelSplit` (outliers, FP4 order),
  every other leaf None (OsciReset's `outlier_channels`)."""
  if params is None:
    params = nnx.state(model, nnx.Param).to_pure_dict()
  layers = _kernel_paths(model)

  def pick(path, leaf):
    del leaf
    key = path_strs(path)
    layer = layers.get(key)
    return None if layer is None else layer.channel_split()

  return jax.tree_util.tree_map_with_path(pick, params)


def quantize_linears(model: nnx.Module, recipe: str | recipes_lib.Recipe, *, pattern: str | None = None,
                     rngs: nnx.Rngs | None = None) -> list[str]:
  """Replaces the model's nnx.Linear layers by QuantLinear, in place.

  Args:
    model: any NNX model.
    recipe: recipe for the converted layers (its `backend` included).
    pattern: regex searched in each layer's '/'-joined path; None = all.
    rngs: seeds the layers' quantization key streams (default nnx.Rngs(0)).
      A linear that already carries a `key_seed` (QuantKeyState, drawn by the
      model at init) keeps it instead, so the converted model's keys do not
      depend on the conversion.

  Returns:
    The converted paths. Kernel and bias values are carried over unchanged.

  Raises:
    ValueError: unknown recipe, a pattern that matches nothing, or a matched
      layer the recipe cannot quantize (named in the message); every match is
      checked before any layer is converted, so the model is left untouched.
  """
  recipe = recipes_lib.get(recipe)
  rngs = rngs if rngs is not None else nnx.Rngs(0)
  regex = re.compile(pattern) if pattern is not None else None
  targets = []
  for path, module in nnx.iter_modules(model):
    if type(module) is nnx.Linear and path:
      name = "/".join(map(str, path))
      if regex is None or regex.search(name):
        targets.append((path, name, module))
  if regex is not None and not targets:
    raise ValueError(f"quantize_linears: pattern {pattern!r} matched no nnx.Linear in the model.")
  for _, name, lin in targets:
    try:
      validate_linear_shapes(*lin.kernel[...].shape, recipe)
    except ValueError as e:
      raise ValueError(f"quantize_linears: layer {name!r} cannot take recipe {recipe.name!r}: {e} "
                       "No layer was converted; narrow `pattern` to skip it.") from None
  converted = []
  for path, name, lin in targets:
    k = lin.kernel[...]
    q = QuantLinear(k.shape[0], k.shape[1], recipe=recipe, use_bias=lin.bias is not None,
                    param_dtype=k.dtype, rngs=rngs)
    q.kernel[...] = k
    if isinstance(getattr(lin, "key_seed", None), QuantKeyState):
      q.key_seed[...] = lin.key_seed[...]
    if lin.bias is not None:
      q.bias[...] = lin.bias[...]
    parent = model
    for p in path[:-1]:
      parent = parent[p] if isinstance(p, int) else getattr(parent, p)
    if isinstance(path[-1], int):
      parent[path[-1]] = q
    else:
      setattr(parent, path[-1], q)
    converted.append(name)
  return converted
