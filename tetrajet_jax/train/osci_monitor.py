"""A measure-only oscillation monitor for arms that run without OsciReset.

Arms without OsciReset still need the quantity OsciReset acts on (spec 7:
"fraction of weight elements with R >= tau over time") so the ablation can
plot it with and without the reset. This transformation passes the updates
through unchanged and, on OsciReset's windows (same S, P, T, tau), sums
``D_Q = |Q(w + u) - Q(w)|`` and ``D_W = |u|`` per element; at a window's
last update it records the fraction with ``R = D_Q / D_W >= tau``. Its
metric is ``osci/risk_frac`` like OsciReset's own; OsciReset arms report it
from OsciReset's state instead. In OutControl layers (``outlier_channels``,
as for OsciReset) only the FP4 rows count, quantized as the forward does.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from tetrajet_jax.optim import NVFP4WeightQuantizer
from tetrajet_jax.optim.osci_reset import find_state, leaf_fp4_rows, outlier_leaves


class OsciMonitorState(NamedTuple):
  count: jax.Array  # int32 []: updates seen
  d_q: dict[str, jax.Array]  # {"__"-joined path of a tracked kernel: float32 like it}
  d_w: dict[str, jax.Array]  # same
  risk_frac: jax.Array  # float32 []: fraction with R >= tau at the end of the last window


def _flat(tree: Any) -> dict[str, tuple[tuple[str, ...], jax.Array]]:
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    names = tuple(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
    out["__".join(names)] = (names, leaf)  # orbax-safe key (no "/" or ".")
  return out


def osci_monitor(*, start_step: int, period: int, window: int, threshold: float,
                 param_filter) -> optax.GradientTransformationExtraArgs:
  """Measure-only twin of OsciReset's window statistics (see module docstring)."""
  quantize = NVFP4WeightQuantizer()

  def init_fn(params):
    def zeros():  # distinct buffers for d_q and d_w (the train state is donated)
      return {k: jnp.zeros(x.shape, jnp.float32) for k, (p, x) in _flat(params).items() if param_filter(p, x)}
    return OsciMonitorState(jnp.zeros((), jnp.int32), zeros(), zeros(), jnp.zeros((), jnp.float32))

  def update_fn(updates, state, params=None, *, outlier_channels=None, **extra):
    del extra
    outliers = outlier_leaves(outlier_channels)
    n = state.count
    offset = n - start_step
    phase = jnp.mod(offset, period)
    in_window = (offset >= 0) & (phase < window)
    keep = jnp.where(phase == 0, 0.0, 1.0)  # a window's first update restarts the sums
    flat_p, flat_u = _flat(params), _flat(updates)
    rows = {k: leaf_fp4_rows(flat_p[k][0], flat_p[k][1].shape, outliers) for k in state.d_q}

    def accumulate(carry):
      d_q, d_w = carry
      new_q, new_w = {}, {}
      for k in d_q:
        p, u = flat_p[k][1], flat_u[k][1].astype(jnp.float32)
        active, r = rows[k]
        q = quantize if r is None else (lambda w, r=r: quantize(w, r))
        active = jnp.broadcast_to(active.reshape((-1,) + (1,) * (p.ndim - 1)), p.shape)
        new_q[k] = d_q[k] * keep + jnp.where(active, jnp.abs(q(p + u) - q(p)), 0.0)
        new_w[k] = d_w[k] * keep + jnp.where(active, jnp.abs(u), 0.0)
      return new_q, new_w

    d_q, d_w = jax.lax.cond(in_window, accumulate, lambda c: c, (state.d_q, state.d_w))
    risky = sum(jnp.sum((d_w[k] > 0) & (d_q[k] >= threshold * d_w[k])) for k in d_q)
    size = sum(jnp.sum(rows[k][0]) * (d_q[k].size // d_q[k].shape[0]) for k in d_q)
    last = in_window & (phase == window - 1)
    risk = jnp.where(last, jnp.asarray(risky, jnp.float32) / jnp.maximum(size, 1).astype(jnp.float32),
                     state.risk_frac)
    return updates, OsciMonitorState(n + 1, d_q, d_w, risk)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def find_monitor_state(opt_state: Any) -> OsciMonitorState:
  return find_state(opt_state, OsciMonitorState)