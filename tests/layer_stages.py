"""The linear layer's backward operands Q3..Q6, built by the layer's own code
(its forward's residuals, then `_backward_operands`, which `_backward` runs
too), so tests can compare them stage by stage (against the NumPy reference,
or GPU against CPU) and say where a difference starts instead of only that dX
or dW differ."""

from __future__ import annotations

from tetrajet_jax.linear import layer, recipes


def backward_operands(x, w, dy, key, recipe_name: str = "tetrajet_v2", backend: str = "reference") -> dict:
  """{"w_hat", "x_hat", "a3", "b4", "a5", "b6"}: W_hat, X_hat and the four
  GEMM operands (NVFP4Tensor) of the recipe's backward for x [M, K], w [K, N],
  dy [M, N] (no outlier channels)."""
  recipe = recipes.get(recipe_name, backend=backend)
  _, res = layer._forward(x, w, key, None, recipe)  # pylint: disable=protected-access
  ops = layer._backward_operands(recipe, res, dy)  # pylint: disable=protected-access
  return {"w_hat": ops.w_src, "x_hat": ops.x_hat, "a3": ops.a3, "b4": ops.b4, "a5": ops.a5, "b6": ops.b6}
