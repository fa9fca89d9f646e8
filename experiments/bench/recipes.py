"""Times a quantized linear layer's forward + backward per recipe vs bf16.

    python -m experiments.bench recipes [--shapes 16384x1024x4096,16384x4096x1024]
                                        [--backends xla,auto] [--out results/bench_linear.json]

One process, one device: every recipe's fwd+bwd (Y, dX, dW; all quantizers
included) is timed with the same harness and reported as a ratio to the bf16
layer timed in the same run. Median of repeats.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import tetrajet_jax as tj
from experiments.bench.timing import commit_id, device_name, time_fn, write_result
from tetrajet_jax.linear import outlier_count

RECIPES = ("bf16", "nvidia_nvfp4", "tetrajet_v2", "tetrajet_v2_outcontrol")


def fwd_bwd_fn(recipe: str, backend: str, k: int):
  r = tj.recipes.get(recipe, backend=backend)
  n_out = outlier_count(k, r.outlier_fraction, r.outlier_rounding) if r.quantized else 0
  idx = jnp.arange(n_out, dtype=jnp.int32) * (k // max(n_out, 1)) if n_out else None

  @jax.jit
  def step(x, w, dy, key):
    y, vjp = jax.vjp(lambda x, w: tj.linear(x, w, recipe=r, key=key, outlier_idx=idx), x, w)
    dx, dw = vjp(dy)
    return y, dx, dw

  return step


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(prog="python -m experiments.bench recipes", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--shapes", default="16384x1024x4096,16384x4096x1024", help="MxKxN list")
  p.add_argument("--backends", default="xla", help="comma list of backends for the FP4 recipes (xla, auto, pallas)")
  p.add_argument("--reps", type=int, default=10)
  p.add_argument("--out", default="")
  a = p.parse_args(argv)
  bad = sorted(set(a.backends.split(",")) - set(tj.recipes.BACKENDS))
  if bad:
    p.error(f"--backends: unknown {bad}; use a comma-separated subset of {','.join(tj.recipes.BACKENDS)}")
  rows = []
  for shape in a.shapes.split(","):
    m, k, n = (int(v) for v in shape.split("x"))
    kx, kw, kd = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (m, k), jnp.bfloat16)
    w = jax.random.normal(kw, (k, n), jnp.float32) * 0.02
    dy = jax.random.normal(kd, (m, n), jnp.bfloat16)
    key = jax.random.key(1)
    base = time_fn(fwd_bwd_fn("bf16", "xla", k), x, w, dy, key, reps=a.reps)
    flops = 3 * 2 * m * k * n
    rows.append(dict(shape=shape, recipe="bf16", backend="xla", ms=base * 1e3, ratio=1.0,
                     tflops=flops / base / 1e12))
    for backend in a.backends.split(","):
      for recipe in RECIPES[1:]:
        try:
          t = time_fn(fwd_bwd_fn(recipe, backend, k), x, w, dy, key, reps=a.reps)
        except Exception as e:  # noqa: BLE001 - report and go on with the other variants
          rows.append(dict(shape=shape, recipe=recipe, backend=backend, error=f"{type(e).__name__}: {e}"[:200]))
          continue
        rows.append(dict(shape=shape, recipe=recipe, backend=backend, ms=t * 1e3, ratio=t / base,
                         tflops=flops / t / 1e12))
  print(f"device {device_name()}, commit {commit_id()}; fwd+bwd (Y, dX, dW), median of {a.reps} samples "
        "of 10 calls in one jitted loop")
  print("| M x K x N | recipe | backend | ms | time / bf16 | effective TFLOP/s |")
  print("|---|---|---|---:|---:|---:|")
  for r in rows:
    if "error" in r:
      print(f"| {r['shape']} | {r['recipe']} | {r['backend']} | failed: {r['error']} | | |")
    else:
      print(f"| {r['shape']} | {r['recipe']} | {r['backend']} | {r['ms']:.3f} | {r['ratio']:.2f} | {r['tflops']:.0f} |")
  write_result(a.out, dict(device=device_name(), commit=commit_id(), rows=rows))
  return rows

