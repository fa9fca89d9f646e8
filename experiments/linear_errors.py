"""Accuracy of the quantized linear layer per recipe.

    python -m experiments.linear_errors [--m 2048 --k 1024 --n 1024]

For each recipe: relative error ||est - ref|| / ||ref|| of Y, dX and dW
against the float64 layer on the same inputs (Gaussian and Student-t(3)
activations), the deviation of the `fast` (XLA bf16) GEMM path from the
`exact` (FP32) path, and the residual bytes per token kept for the backward
against a bf16 layer.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import tetrajet_jax as tj
from tetrajet_jax.linear import outlier_count, residual_bytes_per_token

RECIPES = ("bf16", "nvidia_nvfp4", "tetrajet_v2", "tetrajet_v2_outcontrol")


def _rel(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def layer_errors(recipe: str, x, w, dy, *, backend: str, key) -> tuple[tuple, tuple]:
  k = w.shape[0]
  idx = rest = None
  r = tj.recipes.get(recipe)
  if r.outlier_fraction > 0:
    # Frozen OutControl channels as QuantLinear freezes them: descending input-channel norm, the
    # first n in MXFP8, the rest in FP4 in that order.
    n_out = outlier_count(k, r.outlier_fraction, r.outlier_rounding)
    order = jnp.argsort(-jnp.linalg.norm(x, axis=0), stable=True).astype(jnp.int32)
    idx, rest = order[:n_out], order[n_out:]

  @jax.jit
  def run(x, w, dy):
    y, vjp = jax.vjp(lambda x, w: tj.linear(x, w, recipe=tj.recipes.get(recipe, backend=backend), key=key,
                                            outlier_idx=idx, fp4_idx=rest), x, w)
    return (y, *vjp(dy.astype(y.dtype)))

  return run(x, w, dy)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--m", type=int, default=2048)
  p.add_argument("--k", type=int, default=1024)
  p.add_argument("--n", type=int, default=1024)
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args(argv)
  rng = np.random.default_rng(a.seed)
  key = jax.random.key(a.seed)
  w = (rng.standard_normal((a.k, a.n)) * 0.02).astype(np.float32)
  dy = np.asarray(jnp.asarray(rng.standard_normal((a.m, a.n)), jnp.bfloat16).astype(jnp.float32))
  inputs = {
      "gaussian": rng.standard_normal((a.m, a.k)).astype(np.float32),
      # Heavy tails plus a few hot channels, as activations in LLMs have.
      "student-t(3)+hot ch.": (rng.standard_t(3.0, (a.m, a.k)) *
                               np.where(rng.random(a.k) < 0.02, 20.0, 1.0)).astype(np.float32),
  }
  print(f"backend: {jax.default_backend()}; M={a.m} K={a.k} N={a.n}; references in float64")
  print("| recipe | input | rel err Y | rel err dX | rel err dW | fast vs exact (Y, dX, dW) |")
  print("|---|---|---:|---:|---:|---:|")
  for recipe in RECIPES:
    for name, x in inputs.items():
      x64, w64, dy64 = (v.astype(np.float64) for v in (x, w, dy))
      ref = (x64 @ w64, dy64 @ w64.T, x64.T @ dy64)
      exact = layer_errors(recipe, jnp.asarray(x), jnp.asarray(w), jnp.asarray(dy), backend="reference", key=key)
      fast = layer_errors(recipe, jnp.asarray(x), jnp.asarray(w), jnp.asarray(dy), backend="xla", key=key)
      errs = [_rel(e, r) for e, r in zip(exact, ref)]
      dev = [_rel(f, e) for f, e in zip(fast, exact)]
      print(f"| {recipe} | {name} | {errs[0]:.4f} | {errs[1]:.4f} | {errs[2]:.4f} | "
            f"{dev[0]:.1e}, {dev[1]:.1e}, {dev[2]:.1e} |")
  print()
  print("| recipe | residual bytes / token (K=1024) | vs bf16 |")
  print("|---|---:|---:|")
  base = residual_bytes_per_token("bf16", 1024, 4096)
  for recipe in RECIPES:
    b = residual_bytes_per_token(recipe, 1024, 4096)
    print(f"| {recipe} | {b:.1f} | {b / base:.3f} |")


if __name__ == "__main__":
  main()
