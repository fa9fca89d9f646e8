"""Input validation and the optional non-finite check shared by the quantizers.

NaN/Inf policy (documented in README "Numerics"): by default a non-finite value
propagates into its scaling block: the block's scale is stored as NaN, so the
whole block dequantizes to NaN (never to a wrong finite number). With
`check_numerics()` enabled, a quantizer that sees a non-finite input raises
NonFiniteError naming the tensor instead: at once where the input is a
concrete array (eager calls), and under jax.jit through a host callback whose
failure the `check_numerics` context turns back into NonFiniteError (XLA's
runtime reports any callback failure as a JaxRuntimeError).
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


class NonFiniteError(FloatingPointError):
  """A quantizer saw NaN or Inf while numerics checking was enabled."""


# Errors raised by the runtime callbacks, waiting for a check_numerics context
# to re-raise them in the caller's thread. Callbacks run on runtime threads,
# hence a lock, not thread-local storage.
_pending_lock = threading.Lock()
_pending: list[str] = []


def _take_pending() -> str | None:
  with _pending_lock:
    msg = _pending[0] if _pending else None
    _pending.clear()
  return msg


@contextlib.contextmanager
def check_numerics(enabled: bool = True) -> Iterator[None]:
  """Context manager: quantizers called inside it raise NonFiniteError on NaN/Inf inputs.

  Eager calls raise at once. Under jax.jit the flag is read at trace time (so
  wrap the first call of a jitted function in it), the check runs on the
  device, and the error is raised when the context exits, or where the
  failed computation's result is awaited inside it; both raise the exact
  type NonFiniteError. (A result awaited outside the context raises XLA's
  JaxRuntimeError, whose message names the NonFiniteError.)

  Example:
    >>> with check_numerics():
    ...   jax.block_until_ready(jax.jit(quantize_nvfp4)(x))  # NonFiniteError if x holds NaN
  """
  prev = numerics_checking_enabled()
  _state.enabled = enabled
  _take_pending()  # a failure from before this context is not ours
  try:
    yield
  except jax.errors.JaxRuntimeError as e:
    msg = _take_pending()
    if msg is None:
      raise
    raise NonFiniteError(msg) from e
  finally:
    _state.enabled = prev
  try:
    jax.effects_barrier()  # the checks of computations launched inside have run
  except jax.errors.JaxRuntimeError as e:
    msg = _take_pending()
    if msg is None:
      raise
    raise NonFiniteError(msg) from e
  msg = _take_pending()
  if msg is not None:
    raise NonFiniteError(msg)


def _message(name: str) -> str:
  return (f"{name}: input holds NaN or Inf. Find the op that produced it (e.g. "
          "jax.config.update('jax_debug_nans', True)) or lower the learning rate; "
          "disable tetrajet_jax.check_numerics to let NaN propagate instead.")


def _raise_if_nonfinite(all_finite: np.ndarray, *, name: str) -> None:
  if not bool(all_finite):
    with _pending_lock:
      _pending.append(_message(name))
    raise NonFiniteError(_message(name))


def emit_finite_check(x: jax.Array, name: str) -> None:
  """Emits a runtime check (host callback) that fails on NaN/Inf in x (see check_numerics)."""
  jax.debug.callback(_raise_if_nonfinite, jnp.all(jnp.isfinite(x)), name=name)


def check_concrete_input(x: jax.Array, name: str) -> None:
  """Raises NonFiniteError at once if x is a concrete array holding NaN/Inf.

  Tracers (inside jit, vmap, grad) are left to the runtime check
  (emit_finite_check) of the traced quantizer.
  """
  if isinstance(x, jax.core.Tracer):
    return
  if not bool(jnp.all(jnp.isfinite(x))):
    raise NonFiniteError(_message(name))


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
