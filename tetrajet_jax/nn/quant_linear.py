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
  OutControlChannels  the frozen outlier channel indices (int32, fixed count).

OutControl phases (a static attribute; changing it retraces):
  "fp4"        pure FP4 (before calibration),
  "calibrate"  pure FP4, and accumulate per-channel ||x||_2 each call,
  "frozen"     the top-p channels run in MXFP8 (spec 4).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
from flax import nnx

from tetrajet_jax.linear import recipes as recipes_lib
from tetrajet_jax.linear.layer import linear, outlier_count, validate_linear_shapes
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
    n_out = outlier_count(in_features, self.recipe.outlier_fraction) if self.recipe.quantized else 0
    self.outcontrol_phase = "fp4"
    if n_out:
      self.oc_stats = OutControlStats(jnp.zeros((in_features,), jnp.float32))
      self.oc_channels = OutControlChannels(jnp.arange(n_out, dtype=jnp.int32))
    else:
      self.oc_stats = None
      self.oc_channels = None

  @property
  def has_outcontrol(self) -> bool:
    return self.oc_channels is not None

  def next_key(self) -> jax.Array:
    """A fresh key for this call; advances the layer's counter."""
    key = jax.random.fold_in(jax.random.wrap_key_data(self.key_seed[...]), self.key_count[...])
    self.key_count[...] = self.key_count[...] + 1
    return key

  def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
    """Args: x [..., in]; key: optional explicit key (else the layer's stream)."""
    outlier_idx = None
    if self.has_outcontrol and self.outcontrol_phase == "calibrate":
      xs = jax.lax.stop_gradient(x).astype(jnp.float32).reshape(-1, self.in_features)
      self.oc_stats[...] = self.oc_stats[...] + jnp.sqrt(jnp.sum(xs * xs, axis=0))
    elif self.has_outcontrol and self.outcontrol_phase == "frozen":
      outlier_idx = self.oc_channels[...]
    if key is None and self.recipe.quantized:
      key = self.next_key()
    y = linear(x, self.kernel[...], recipe=self.recipe, key=key, outlier_idx=outlier_idx)
    if self.bias is not None:
      y = y + self.bias[...].astype(y.dtype)
    return y


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
  """Freezes each OutControl layer's top channels by accumulated norm.

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
    top = jax.lax.top_k(stats, n)[1]
    layer.oc_channels[...] = jnp.sort(top).astype(jnp.int32)
    layer.outcontrol_phase = "frozen"
    frozen["/".join(map(str, path))] = n
  return frozen


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
  frozen OutControl channels holds its int32 indices, every other leaf None."""
  if params is None:
    params = nnx.state(model, nnx.Param).to_pure_dict()
  layers = _kernel_paths(model)

  def pick(path, leaf):
    del leaf
    key = path_strs(path)
    layer = layers.get(key)
    if layer is not None and layer.has_outcontrol and layer.outcontrol_phase == "frozen":
      return layer.oc_channels[...]
    return None

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
  """
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
