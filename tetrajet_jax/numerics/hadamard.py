"""Random Hadamard transform on 16-element chunks (RHT-16, docs/SPEC.md section 2).

y = (1/4) H16 D x on each contiguous 16-chunk along `axis`, H16 the Sylvester
Hadamard matrix and D = diag(signs), signs in {-1, +1} drawn from `key`.
(1/4) H16 D is orthogonal, so applying the same transform to both operands of
a GEMM along its reduction axis leaves the product unchanged, while it spreads
outliers across the chunk before quantization.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from tetrajet_jax.numerics import checks

RHT_BLOCK = 16


def hadamard_signs(key: jax.Array) -> jax.Array:
  """The 16 random signs (float32, +-1) that `key` stands for."""
  return jax.random.rademacher(key, (RHT_BLOCK,), dtype=jnp.float32)


def _fwht16(x: jax.Array) -> jax.Array:
  """Unnormalized Sylvester-Hadamard transform over the last axis (size 16).

  Butterflies with adds only: exact orthogonal structure, no matmul precision
  setting (an f32 matmul on GPU may run as TF32). Each stage pairs element j
  with j ^ h and writes (a + b, a - b); the partner is read through a reversed
  view and the two results are selected by position, not stacked, so every
  stage is elementwise and XLA may fuse them (a stack is a concatenation
  along a minor axis, which XLA ran as one strided pass per stage).
  """
  lead = x.shape[:-1]
  h = 1
  while h < RHT_BLOCK:
    y = x.reshape(*lead, RHT_BLOCK // (2 * h), 2, h)
    partner = jnp.flip(y, axis=-2)  # b in a's slot, a in b's
    first = lax.broadcasted_iota(jnp.int32, y.shape, y.ndim - 2) == 0
    x = jnp.where(first, y + partner, partner - y).reshape(*lead, RHT_BLOCK)  # a + b, a - b
    h *= 2
  return x


def _chunked(x: jax.Array, axis: int, fn) -> jax.Array:
  x = jnp.asarray(x)
  axis = checks.normalize_axis(axis, x.ndim, "random_hadamard_16")
  n = x.shape[axis]
  if n % RHT_BLOCK:
    raise ValueError(
        f"random_hadamard_16: axis {axis} has length {n}, not a multiple of {RHT_BLOCK}; "
        f"zero-pad it to {n + (-n) % RHT_BLOCK} first.")
  xc = jnp.moveaxis(x, axis, -1)
  lead = xc.shape[:-1]
  y = fn(xc.reshape(*lead, n // RHT_BLOCK, RHT_BLOCK)).reshape(*lead, n)
  return jnp.moveaxis(y, -1, axis)


def random_hadamard_16(x: jax.typing.ArrayLike, key: jax.Array, *, axis: int = -1) -> jax.Array:
  """Applies (1/4) H16 D to each 16-chunk of x along `axis` (same key -> same D)."""
  d = hadamard_signs(key)
  return _chunked(x, axis, lambda c: _fwht16(c * d) * 0.25)


def inverse_random_hadamard_16(y: jax.typing.ArrayLike, key: jax.Array, *, axis: int = -1) -> jax.Array:
  """Inverse of random_hadamard_16 with the same key: x = D (1/4) H16 y."""
  d = hadamard_signs(key)
  return _chunked(y, axis, lambda c: _fwht16(c) * 0.25 * d)
