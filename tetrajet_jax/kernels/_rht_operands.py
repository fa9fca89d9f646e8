"""The RHT-16 as tensor-core operands: the constant B matrices the backward quantizer's wgmma
multiplies by, and the exact split of float32 inputs into bf16 wgmma operands.

The transform's entries (+-1/4, 0) are exact in bf16, and every product with a bf16 part of
the input is exact, so only the FP32 accumulation rounds (docs/KERNELS.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tetrajet_jax.numerics.nvfp4 import INNER_BLOCK as INNER, OUTER_BLOCK as OUTER


def transform_matrix(signs_16: jax.Array | None) -> jax.Array:
  """bf16 [128, 128] B^T: row j = transform row perm[j] of blockdiag((1/4) H16 D) (exact in bf16),
  or of the identity when signs_16 is None (no RHT: the products x * 1 are exact, so y = x).

  perm lists the even outputs 0, 2, ..., 126, then the odd ones 1, 3, ..., 127.
  """
  if signs_16 is None:
    t = jnp.eye(INNER, dtype=jnp.float32)
  else:
    h = np.array([[1.0]])
    while h.shape[0] < INNER:
      h = np.block([[h, h], [h, -h]])
    t = 0.25 * jnp.asarray(h, jnp.float32) * jnp.asarray(signs_16, jnp.float32)[None, :]  # (1/4) H D
  blk = jnp.kron(jnp.eye(OUTER // INNER, dtype=jnp.float32), t)  # [128 out, 128 in]
  perm = np.concatenate([np.arange(0, OUTER, 2), np.arange(1, OUTER, 2)])
  return blk[perm].astype(jnp.bfloat16)


def transform_block(signs_16: jax.Array | None) -> jax.Array:
  """bf16 [16, 16] B^T of one inner block: row j = row perm[j] of (1/4) H16 D (or of the identity),
  perm = even outputs 0, 2, ..., 14, then the odd ones; `transform_matrix` is eight of these on
  the diagonal, with its permutation taken over the whole 128-block."""
  t = transform_matrix(signs_16).astype(jnp.float32)  # [128, 128]: rows 0..63 even, 64..127 odd outputs
  rows = np.concatenate([np.arange(INNER // 2), OUTER // 2 + np.arange(INNER // 2)])  # block 0's outputs
  return t[rows, :INNER].astype(jnp.bfloat16)


def split3(xf):
  """x = hi + mid + lo exactly, each part exact in bf16 (truncation by bit masks)."""
  mask = jnp.uint32(0xFFFF0000)
  trunc = lambda v: lax.bitcast_convert_type(lax.bitcast_convert_type(v, jnp.uint32) & mask, jnp.float32)
  hi = trunc(xf)
  r1 = xf - hi
  mid = trunc(r1)
  lo = r1 - mid
  return hi, mid, lo
