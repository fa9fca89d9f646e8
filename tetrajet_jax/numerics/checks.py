"""Input validation and the optional non-finite check shared by the quantizers.

NaN/Inf policy (documented in README "Numerics"): by default a non-finite value
propagates into its scaling block: the block's scale is stored as NaN, so the
whole block dequantizes to NaN (never to a wrong finite number). With
`check_numerics()` enabled, a quantizer that sees a non-finite input raises
an error naming the tensor instead (also under jit, via a host callback).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

_state = threading.local()


def numerics_checking_enabled() -> bool:
  return getattr(_state, "enabled", False)


@contextlib.contextmanager
def check_numerics(enabled: bool = True) -> Iterator[None]:
  """Context manager: quantizers traced inside it raise on NaN/Inf inputs.

  The flag is read at trace time, so wrap the `jax.jit` call (or the first call
  of a jitted function) in it.
  """
  prev = numerics_checking_enabled()
  _state.enabled = enabled
  try:
    yield
  finally:
    _state.enabled = prev


class NonFiniteError(FloatingPointError):
  """A quantizer saw NaN or Inf while numerics checking was enabled."""


def _raise_if_nonfinite(all_finite: np.ndarray, *, name: str) -> None:
  if not bool(all_finite):
    raise NonFiniteError(
        f"{name}: input holds NaN or Inf. Find the op that produced it (e.g. "
        "jax.config.update('jax_debug_nans', True)) or lower the learning rate; "
        "disable tetrajet_jax.check_numerics to let NaN propagate instead.")


def emit_finite_check(x: jax.Array, name: str) -> None:
  """Emits a runtime check (host callback) that raises NonFiniteError on NaN/Inf in x."""
  jax.debug.callback(_raise_if_nonfinite, jnp.all(jnp.isfinite(x)), name=name)


def as_float_input(x: jax.typing.ArrayLike, name: str) -> jax.Array:
  """Validates a quantizer input: floating dtype, returned as float32."""
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(
        f"{name}: expected a floating-point array, got dtype {x.dtype}. "
        "Quantizers take float inputs; cast integers explicitly with "
        ".astype(jnp.float32) if that is what you mean.")
  return x.astype(jnp.float32)


def normalize_axis(axis: int, ndim: int, name: str) -> int:
  if ndim == 0:
    raise ValueError(f"{name}: cannot quantize a scalar; pass an array with at least one axis.")
  if not -ndim <= axis < ndim:
    raise ValueError(f"{name}: axis {axis} is out of range for an array of rank {ndim}.")
  return axis % ndim


def pad_axis_to_multiple(x: jax.Array, axis: int, multiple: int) -> jax.Array:
  """Zero-pads `axis` up to a multiple: zeros change no amax and no dot product."""
  n = x.shape[axis]
  pad = (-n) % multiple
  if pad == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)
