"""Independent reference of the quantized linear layer's three GEMMs (docs/SPEC.md section 2),
in NumPy float64 on top of tests/numpy_reference.py.

Stochastic rounding draws: the reference uses the layer's documented
counter-based generator, re-implemented in NumPy (tests/numpy_reference.py),
seeded like the layer with jax.random.bits(key, (), uint32), so a fixed key
gives a deterministic, comparable result; the rounding rule is its own. The
key schedule it replicates is the layer's documented one: split(key, 8) ->
[rht_dx, rht_dw, q1..q6].
"""

from __future__ import annotations

import jax
import numpy as np

from tests import numpy_reference as ref

F32 = np.float32


def _on_cpu(fn, key, *args, **kwargs) -> np.ndarray:
  """A jax.random draw made on the host CPU, whatever the default backend: the
  reference stays independent of the device under test."""
  cpu = jax.devices("cpu")[0]
  with jax.default_device(cpu):
    return np.asarray(fn(jax.device_put(key, cpu), *args, **kwargs))


def rht_matrix(key) -> np.ndarray:
  signs = np.asarray(_on_cpu(jax.random.rademacher, key, (16,), dtype=np.float32), np.float64)
  return 0.25 * ref.sylvester_hadamard(16) @ np.diag(signs)


def rht_last(x: np.ndarray, key) -> np.ndarray:
  """(1/4) H D on 16-chunks along the last axis, float32 result."""
  m = rht_matrix(key)
  *lead, n = x.shape
  xc = x.astype(np.float64).reshape(*lead, n // 16, 16)
  return (xc @ m.T).reshape(*lead, n).astype(F32)


def fake_quant_block(x: np.ndarray, *, key=None) -> np.ndarray:
  """Dequantized double-block NVFP4 of x along its last axis (RTN, or SR with key)."""
  x = np.asarray(x, F32)
  seed = None if key is None else int(_on_cpu(jax.random.bits, key, (), np.uint32))
  codes, s_in, s_out = ref.nvfp4_block(x, seed=seed)
  s = np.repeat((s_in * np.repeat(s_out, 8, -1)).astype(F32), 16, -1)
  return ref.decode_codes(codes) * s.astype(np.float64)


def tetrajet_forward(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
  x_hat = fake_quant_block(x)
  w_hat_t = fake_quant_block(kernel.T)  # [N, K] along K
  return x_hat @ w_hat_t.T


def tetrajet_backward(x, kernel, dy, key, *, operands: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
  """dX, dW of recipe tetrajet_v2 (aligned, RHT on both backward GEMMs, SR).
  If `operands` is a dict, the dequantized GEMM operands a3, b4 ([M|K, Np],
  along N) and a5, b6 ([N|K, Mp], along tokens) are stored in it."""
  ks = jax.random.split(jax.device_put(key, jax.devices("cpu")[0]), 8)  # keys on the host too
  k_rht_dx, k_rht_dw, kq = ks[0], ks[1], ks[2:]
  m = x.shape[0]
  x_hat = fake_quant_block(x).astype(F32)  # [M, K]
  w_hat = fake_quant_block(kernel.T).T.astype(F32)  # [K, N]
  dy = dy.astype(F32)
  a3 = fake_quant_block(rht_last(dy, k_rht_dx), key=kq[2])  # [M, N]
  b4 = fake_quant_block(rht_last(w_hat, k_rht_dx), key=kq[3])  # [K, N]
  dx = a3 @ b4.T
  mp = -(-m // 128) * 128
  dyp = np.zeros((mp, dy.shape[1]), F32)
  dyp[:m] = dy
  xp = np.zeros((mp, x.shape[1]), F32)
  xp[:m] = x_hat
  a5 = fake_quant_block(rht_last(dyp.T, k_rht_dw), key=kq[4])  # [N, Mp]
  b6 = fake_quant_block(rht_last(xp.T, k_rht_dw), key=kq[5])  # [K, Mp]
  dw = b6 @ a5.T
  if operands is not None:
    operands.update(a3=a3, b4=b4, a5=a5, b6=b6)
  return dx, dw
