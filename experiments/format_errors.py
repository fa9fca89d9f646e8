"""Quantization error of each format on Gaussian and heavy-tailed data.

    python -m experiments.format_errors [--rows 1024 --cols 4096 --seed 0]

Prints relative RMS error ||x - Q(x)|| / ||x|| and effective bits
-log2(rel MSE) / 2 for: NVFP4 double-block (TetraJet-v2, 1x16 E4M3 in 1x128
FP32), NVFP4 per-tensor (NVIDIA), NVFP4 16x16 per-tensor (NVIDIA weights),
NVFP4 with RHT-16 first, MXFP8 (E4M3, E8M0 1x32), and bf16 for scale.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import tetrajet_jax as tj


def _formats(key):
  rht_key = jax.random.key(1)
  return {
      "nvfp4 double-block (1x16 e4m3 / 1x128 fp32)": lambda x: tj.dequantize(tj.quantize_nvfp4(x)),
      "nvfp4 per-tensor (1x16 e4m3 / fp32 tensor)": lambda x: tj.dequantize(tj.quantize_nvfp4(x, scaling="tensor")),
      "nvfp4 per-tensor 16x16 (weights)": lambda x: tj.dequantize(
          tj.quantize_nvfp4(x, scaling="tensor", block_2d=True)),
      "nvfp4 double-block, stochastic rounding": lambda x: tj.dequantize(
          tj.quantize_nvfp4(x, rounding="stochastic", key=key)),
      "nvfp4 double-block after RHT-16 (error in rotated basis)": lambda x: tj.inverse_random_hadamard_16(
          tj.dequantize(tj.quantize_nvfp4(tj.random_hadamard_16(x, rht_key))), rht_key),
      "mxfp8 (e4m3, e8m0 1x32)": lambda x: tj.dequantize(tj.quantize_mxfp8(x)),
      "bf16": lambda x: x.astype(jnp.bfloat16).astype(jnp.float32),
  }


def error_table(rows: int, cols: int, seed: int) -> list[tuple[str, str, float, float]]:
  rng = np.random.default_rng(seed)
  data = {
      "gaussian": rng.standard_normal((rows, cols)).astype(np.float32),
      "student-t(3)": rng.standard_t(3.0, (rows, cols)).astype(np.float32),
  }
  out = []
  for fname, fn in _formats(jax.random.key(seed)).items():
    f = jax.jit(fn)
    for dname, x in data.items():
      x64 = x.astype(np.float64)
      y = np.asarray(f(jnp.asarray(x)), np.float64)
      rel_mse = np.sum((y - x64) ** 2) / np.sum(x64**2)
      out.append((fname, dname, float(np.sqrt(rel_mse)), float(-np.log2(rel_mse) / 2)))
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--rows", type=int, default=1024)
  p.add_argument("--cols", type=int, default=4096)
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args(argv)
  print(f"backend: {jax.default_backend()}; data [{a.rows} x {a.cols}], seed {a.seed}")
  print(f"| {'format':58s} | {'data':12s} | rel. RMS error | effective bits |")
  print(f"|{'-' * 60}|{'-' * 14}|---------------:|---------------:|")
  for fname, dname, rel, bits in error_table(a.rows, a.cols, a.seed):
    print(f"| {fname:58s} | {dname:12s} | {rel:14.5f} | {bits:14.2f} |")


if __name__ == "__main__":
  main()
