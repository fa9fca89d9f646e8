"""The linear layer's backward operands Q3..Q6, built by the layer's own
internal functions exactly as its backward builds them, so tests can compare
them stage by stage (against the NumPy reference, or GPU against CPU) and say
where a difference starts instead of only that dX or dW differ."""

from __future__ import annotations

import importlib

import jax.numpy as jnp

_lin = importlib.import_module("tetrajet_jax.linear.linear")  # the module (the package re-exports `linear`)


def backward_operands(x, w, dy, key, recipe_name: str = "tetrajet_v2", gemm: str = "exact") -> dict:
  """{"w_hat", "x_hat", "a3", "b4", "a5", "b6"}: the dequantized-able operands
  (NVFP4Tensor or arrays) of the recipe's backward for x [M, K], w [K, N], dy [M, N]."""
  recipe = _lin.recipes_lib.get(recipe_name)
  keys = _lin._split_keys(key, recipe)  # pylint: disable=protected-access
  w_hat = _lin._w_hat(w, None, recipe, keys)  # pylint: disable=protected-access
  a3 = _lin._quantize_rht(dy, 3, recipe, keys, keys.rht_dx, recipe.rht_dgrad, axis=-1, gemm=gemm)  # pylint: disable=protected-access
  b4 = _lin._quantize_rht(w_hat, 4, recipe, keys, keys.rht_dx, recipe.rht_dgrad, axis=-1, weight=True,  # pylint: disable=protected-access
                          gemm=gemm)
  dyp = jnp.pad(dy, [(0, -dy.shape[0] % 128), (0, 0)])
  a5 = _lin._quantize_rht(dyp, 5, recipe, keys, keys.rht_dw, recipe.rht_wgrad, axis=0, gemm=gemm)  # pylint: disable=protected-access
  x_hat = _lin._values(_lin._quantize(x, 1, recipe, keys, axis=-1))[: x.shape[0]]  # pylint: disable=protected-access
  b6 = _lin._wgrad_x_operand(x_hat, recipe, keys, gemm)  # pylint: disable=protected-access
  return {"w_hat": w_hat, "x_hat": x_hat, "a3": a3, "b4": b4, "a5": a5, "b6": b6}
