"""Oscillation diagnostics (docs/SPEC.md section 7) for experiments and plots.

All functions take a single array or any parameter tree; on a tree they look
at the leaves the filter selects (default: the quantized linears' kernels,
`default_param_filter`) and report per layer ('/'-joined path) and in total
(weighted by element count). Results are host values (floats, NumPy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tetrajet_jax.optim.osci_reset import OsciResetState, find_osci_reset_state, osci_reset_metrics
from tetrajet_jax.optim.weight_quantizer import (NVFP4WeightQuantizer, ParamFilter, Path, Quantizer,
                                                 default_param_filter, leaves_with_paths, path_name)


def _selected(tree: Any, param_filter: ParamFilter | None) -> dict[Path, Any]:
  """{path: leaf} of the leaves to look at; a bare array is the single layer ()."""
  if isinstance(tree, (jax.Array, np.ndarray)):
    return {(): tree}
  param_filter = default_param_filter if param_filter is None else param_filter
  out = {p: w for p, w in leaves_with_paths(tree).items() if param_filter(p, w)}
  if not out:
    raise ValueError("No parameter matches the filter; pass param_filter= or a single array.")
  return out


def _key(prefix: str, path: Path) -> str:
  return f"{prefix}/{path_name(path)}" if path else prefix


def oscillation_fraction(
    source: Any,
    *,
    threshold: float | None = None,
    quantizer: Quantizer | None = None,
    param_filter: ParamFilter | None = None,
) -> dict[str, float]:
  """Fraction of elements with R = D_Q / D_W >= threshold, per layer and in total.

  Args:
    source: either an optimizer state holding an OsciResetState (reports its
      last completed window, at the transformation's own tau; `threshold`
      must then be None), or a recorded trajectory: a sequence [w_0, ..., w_T]
      of parameter trees (or arrays), over which D_Q and D_W are summed.
    threshold: tau for a trajectory (default 8.0).
    quantizer: w -> Q(w); default the forward's RTN NVFP4 along axis 0.
    param_filter: which leaves of a tree to look at.

  Returns:
    {'osci/risk_frac/<path>': float, ..., 'osci/risk_frac': float}; a bare
    array trajectory gives only 'osci/risk_frac'.
  """
  holds_state = any(isinstance(x, OsciResetState) for x in
                    jax.tree_util.tree_leaves(source, is_leaf=lambda x: isinstance(x, OsciResetState)))
  if holds_state or not isinstance(source, Sequence):
    if threshold is not None:
      raise ValueError("oscillation_fraction: an OsciReset state counts R >= tau at the transformation's own "
                       "threshold; leave threshold=None (or pass a recorded trajectory).")
    metrics = osci_reset_metrics(find_osci_reset_state(source))
    return {k: float(v) for k, v in metrics.items() if k.startswith("osci/risk_frac")}
  if len(source) < 2:
    raise ValueError(f"oscillation_fraction: a trajectory needs at least 2 snapshots, got {len(source)}.")
  threshold = 8.0 if threshold is None else float(threshold)
  quantizer = NVFP4WeightQuantizer() if quantizer is None else quantizer
  quantize = jax.jit(quantizer)
  snapshots = [_selected(w, param_filter) for w in source]
  out: dict[str, float] = {}
  risky_total = size_total = 0
  for path in snapshots[0]:
    d_q = d_w = 0.0
    prev_w = np.asarray(snapshots[0][path], np.float64)
    prev_q = np.asarray(quantize(jnp.asarray(snapshots[0][path], jnp.float32)), np.float64)
    for snap in snapshots[1:]:
      w = np.asarray(snap[path], np.float64)
      q = np.asarray(quantize(jnp.asarray(snap[path], jnp.float32)), np.float64)
      d_q, d_w = d_q + np.abs(q - prev_q), d_w + np.abs(w - prev_w)
      prev_w, prev_q = w, q
    risk = np.where(d_w > 0, d_q / np.where(d_w > 0, d_w, 1.0), 0.0)
    risky = int(np.sum(risk >= threshold))
    out[_key("osci/risk_frac", path)] = risky / risk.size
    risky_total, size_total = risky_total + risky, size_total + risk.size
  out["osci/risk_frac"] = risky_total / size_total
  return out


def default_histogram_edges(bins_per_unit: int = 32, limit: float = 6.5) -> np.ndarray:
  """Bin edges over [-limit, limit] with every E2M1 decision threshold at a bin centre."""
  width = 1.0 / bins_per_unit
  n = int(round(2 * limit * bins_per_unit))
  return (-limit + width / 2 + width * np.arange(n + 1)).astype(np.float64)


def latent_weight_histogram(
    w: Any,
    *,
    bins: int | np.ndarray | None = None,
    quantizer: NVFP4WeightQuantizer | None = None,
    param_filter: ParamFilter | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Histogram of latent weights w / (s_out * s_in), in grid units.

  Oscillating weights pile up at the rounding thresholds (0.25, 0.75, 1.25,
  1.75, 2.5, 3.5, 5 and their negatives); the default bins put each threshold
  at a bin centre (width 1/32).

  Args:
    w: an array (quantized along axis 0) or a parameter tree.
    bins: number of equal bins over [-6.5, 6.5] or explicit edges; default
      `default_histogram_edges()`.
    quantizer: supplies `latent(w)`; default NVFP4WeightQuantizer().
    param_filter: which leaves of a tree to include (summed into one histogram).

  Returns:
    (edges float64 [B + 1], counts int64 [B]) as NumPy; values outside the
    edges are not counted.
  """
  quantizer = NVFP4WeightQuantizer() if quantizer is None else quantizer
  if bins is None:
    edges = default_histogram_edges()
  elif isinstance(bins, int):
    edges = np.linspace(-6.5, 6.5, bins + 1)
  else:
    edges = np.asarray(bins, np.float64)
  latent = jax.jit(quantizer.latent)
  counts = np.zeros(len(edges) - 1, np.int64)
  for leaf in _selected(w, param_filter).values():
    v = np.asarray(latent(jnp.asarray(leaf, jnp.float32)), np.float64).reshape(-1)
    counts += np.histogram(v, edges)[0]
  return edges, counts


def weight_change_rates(
    w_prev: Any,
    w_new: Any,
    quantizer: Quantizer | None = None,
    *,
    param_filter: ParamFilter | None = None,
) -> dict[str, float]:
  """Per-step rates of change of the master weights W and of Q(W).

  Returns, per layer (`/<path>` suffix) and in total (element-weighted):
    rate/dw: mean |W_new - W_prev|;  rate/dq: mean |Q(W_new) - Q(W_prev)|;
    rate/flip_frac: fraction of elements whose Q(W) changed.
  An oscillating layer shows dq >> dw: Q(W) jumps whole grid gaps while W
  barely moves.
  """
  quantizer = NVFP4WeightQuantizer() if quantizer is None else quantizer
  quantize = jax.jit(quantizer)
  prev, new = _selected(w_prev, param_filter), _selected(w_new, param_filter)
  if prev.keys() != new.keys():
    raise ValueError("weight_change_rates: w_prev and w_new hold different parameters.")
  out: dict[str, float] = {}
  sums = {"dw": 0.0, "dq": 0.0, "flip_frac": 0.0}
  size_total = 0
  for path in prev:
    a, b = jnp.asarray(prev[path], jnp.float32), jnp.asarray(new[path], jnp.float32)
    dw = np.abs(np.asarray(b, np.float64) - np.asarray(a, np.float64))
    dq_raw = np.asarray(quantize(b), np.float64) - np.asarray(quantize(a), np.float64)
    stats = {"dw": dw.sum(), "dq": np.abs(dq_raw).sum(), "flip_frac": float(np.count_nonzero(dq_raw))}
    for name, total in stats.items():
      out[_key(f"rate/{name}", path)] = float(total) / dw.size
      sums[name] += float(total)
    size_total += dw.size
  for name, total in sums.items():
    out[f"rate/{name}"] = total / size_total
  return out
