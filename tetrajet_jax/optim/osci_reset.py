"""OsciReset: find FP4 weights that oscillate between two grid values and reset
their master weights onto the value they keep landing on (docs/SPEC.md section 3).

For every element of every tracked weight, with Q the forward quantizer:
  D_Q = sum_t |Q(w_t) - Q(w_{t-1})|,  D_W = sum_t |w_t - w_{t-1}|
over a window of T updates, R = D_Q / D_W (0 where D_W = 0); one update
after the window (as the reference does), elements with R >= tau land
exactly on Q(w). An oscillating element has a large D_Q (every flip costs a
whole grid gap) for a tiny D_W.

Schedule, in optimizer updates n = 0, 1, ... (the update that turns w_n into
w_{n+1}): periods start at S, S + P, S + 2P, ...; updates n in
[S + kP, S + kP + T) form the window of period k; the next update
n = S + kP + T applies the reset (it adds nothing to the sums). Before S and
between windows the transformation only counts updates.

In OutControl layers only the FP4 rows take part, and Q is the forward's own
quantization of the gathered FP4 rows in the layer's FP4 order (docs/SPEC.md
section 3): `update(..., outlier_channels=tree)` passes each such kernel's
`ChannelSplit` (`tetrajet_jax.nn.outlier_channels_tree`). Q(w_{n}) is
recomputed from `params` (the optimizer's input), so no snapshot of weights
or codes is stored. Tracked leaves of one shape (a model's repeated blocks)
go through the window step as one vmapped batch, which keeps the compiled
program's size independent of the depth.

Where the update falls in that schedule is a function of the update count,
so a caller that knows the count on the host (a training loop) passes it as
`window_phase` (`window_phase_of`): the compiled update then holds no
conditional. Without it the device decides with `lax.cond`, and on a GPU an
XLA conditional copies its predicate to the host and waits for the stream to
reach it, so the host cannot queue the next step ahead while the current
one runs.

The transformation goes after the optimizer in a chain, so it sees the
parameters the update would produce:
  optax.chain(optax.adamw(...), osci_reset(start_step=..., period=...))
A reset replaces the update of a reset element by q - w (q = Q(w + u)), so
that `optax.apply_updates` lands on q bitwise; Adam's moments are untouched.

Exactness: p + fl(q - p) == q holds whenever q/2 <= p <= 2q (Sterbenz) or q
== 0, which covers every oscillating element (w moves by far less than a grid
gap). For any other element the two float neighbours of fl(q - p) are tried
as well; if none lands on q exactly the element keeps its upstream update
(it then counts as risky but not reset, so `num_risky_last - num_reset`
shows it).

Memory (state only; see docs/OSCI_RESET.md for measured figures):
  track_fraction = 1: D_Q, D_W float32 per tracked weight: 8 bytes/weight.
  track_fraction = f < 1: per tracked element int32 index + 2 float32
    accumulators: 12 * ceil(f * n) / n bytes/weight (1.2 at f = 0.1).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from tetrajet_jax.linear.layer import ChannelSplit, channel_split
from tetrajet_jax.optim.weight_quantizer import (NVFP4WeightQuantizer, ParamFilter, Path, Quantizer,
                                                 default_param_filter, leaves_with_paths, nest, path_name)


class OsciResetState(NamedTuple):
  """OsciReset's state. Per-leaf fields are nested dicts holding only the tracked leaves (by path).

  Fields (n = elements of a tracked leaf, k = ceil(track_fraction * n)):
    count: int32 []; updates seen so far (the index n of the next update).
    d_q: {path: float32 [*shape] (track_fraction = 1) or [k]}; window sum |Q(w_t) - Q(w_{t-1})|.
    d_w: {path: same as d_q}; window sum |w_t - w_{t-1}|.
    index: {path: int32 [k]}, flat (row-major) indices tracked in the current
      period (track_fraction < 1); {} when every element is tracked.
    num_active: {path: int32 []}; elements that take part (outlier rows excluded) at the last window update.
    num_risky: {path: int32 []}; elements with R >= tau so far in the current window (live).
    num_risky_last: {path: int32 []}; elements with R >= tau at the end of the last completed window.
    num_reset: {path: int32 []}; elements reset at the last reset.
  """

  count: jax.Array
  d_q: Any
  d_w: Any
  index: Any
  num_active: Any
  num_risky: Any
  num_risky_last: Any
  num_reset: Any


def _check_int(name: str, value: Any, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, int):
    raise ValueError(f"osci_reset: {name} must be an int, got {value!r}.")
  if value < minimum:
    raise ValueError(f"osci_reset: {name} must be >= {minimum}, got {value}.")
  return value


def _exact_step(p: jax.Array, q: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(d, ok): an update d with p + d == q in p's dtype where ok; tries fl(q - p) and its two neighbours."""
  d0 = q - p
  d, ok = d0, (p + d0) == q
  for cand in (jnp.nextafter(d0, jnp.inf), jnp.nextafter(d0, -jnp.inf)):
    hit = ~ok & ((p + cand) == q)
    d, ok = jnp.where(hit, cand, d), ok | hit
  return d, ok


def outlier_leaves(outlier_channels: Any) -> dict[Path, Any]:
  """{path: ChannelSplit or int outlier rows} of an `outlier_channels` tree (None leaves dropped)."""
  if outlier_channels is None:
    return {}
  flat = leaves_with_paths(outlier_channels, is_leaf=lambda x: x is None or isinstance(x, ChannelSplit))
  return {p: v for p, v in flat.items() if v is not None}


def leaf_fp4_rows(path: Path, shape: tuple[int, ...], outliers: dict[Path, Any]) -> tuple[jax.Array, Any]:
  """(bool [shape[0]] rows that take part, FP4 rows in the forward's order or None = all rows).

  An outlier_channels leaf is a ChannelSplit, or int outlier rows (the FP4
  part then takes the other rows ascending, as `linear` does without fp4_idx).
  """
  split = outliers.get(path)
  if split is None:
    return jnp.ones((shape[0],), jnp.bool_), None
  if not isinstance(split, ChannelSplit):
    idx = jnp.asarray(split)
    if not jnp.issubdtype(idx.dtype, jnp.integer):
      raise ValueError(f"osci_reset: outlier_channels for {path_name(path)!r} must be integer indices or a "
                       f"ChannelSplit, got dtype {idx.dtype}.")
    if len(shape) != 2:
      raise ValueError(f"osci_reset: outlier rows for {path_name(path)!r} need a 2-D [in, out] kernel, "
                       f"got shape {shape}.")
    try:
      split = channel_split(idx.reshape(-1), shape[0])
    except ValueError as e:
      raise ValueError(f"osci_reset: outlier_channels for {path_name(path)!r}: {e}") from None
  rows = jnp.asarray(split.fp4, jnp.int32)
  return jnp.zeros((shape[0],), jnp.bool_).at[rows].set(True), rows


@dataclasses.dataclass(frozen=True)
class _Config:
  """OsciReset's settings, validated by `osci_reset`."""

  start_step: int
  period: int
  window: int
  threshold: float
  quantizer: Any
  param_filter: Any
  track_fraction: float
  apply: bool

  @property
  def lean(self) -> bool:
    return self.track_fraction < 1.0

  def num_tracked(self, size: int) -> int:
    return min(size, math.ceil(self.track_fraction * size)) if self.lean else size


# Where an update falls in OsciReset's schedule, as `window_phase_of` names it.
OUTSIDE, FIRST, INSIDE = "outside", "first", "inside"
WINDOW_PHASES = (OUTSIDE, FIRST, INSIDE)


def window_phase_of(count: int, *, start_step: int, period: int, window: int) -> str:
  """Where update ``count`` (0-based) falls: FIRST (a window's first update, which picks the
  tracked elements and clears the sums), INSIDE (the window's other updates and the reset update
  after it) or OUTSIDE (no window: only the count advances)."""
  offset = count - start_step
  if offset < 0 or offset % period > window:
    return OUTSIDE
  return FIRST if offset % period == 0 else INSIDE


def _validated_config(*, start_step, period, window, threshold, quantizer, param_filter, track_fraction,
                      apply) -> _Config:
  """`osci_reset`'s arguments checked and completed with the defaults (ValueError says what to change)."""
  start_step = _check_int("start_step", start_step, 0)
  window = _check_int("window", window, 1)
  period = _check_int("period", period, 1)
  if window >= period:
    raise ValueError(f"osci_reset: window ({window}) must be shorter than period ({period}); "
                     f"windows of consecutive periods would overlap.")
  if not threshold > 0:
    raise ValueError(f"osci_reset: threshold must be > 0, got {threshold} (the paper uses 8).")
  threshold = float(threshold)
  if not 0.0 < track_fraction <= 1.0:
    raise ValueError(f"osci_reset: track_fraction must be in (0, 1], got {track_fraction} "
                     f"(1 tracks every element; 0.1 is the paper's memory-lean variant).")
  lean = track_fraction < 1.0
  quantizer = NVFP4WeightQuantizer() if quantizer is None else quantizer
  if not callable(quantizer):
    raise ValueError(f"osci_reset: quantizer must be callable w -> Q(w), got {quantizer!r}.")
  if lean and not callable(getattr(quantizer, "edge_distance", None)):
    raise ValueError("osci_reset: track_fraction < 1 needs a quantizer with an edge_distance(w) method "
                     "(distance to the nearest decision threshold in grid gaps), e.g. NVFP4WeightQuantizer.")
  param_filter = default_param_filter if param_filter is None else param_filter
  return _Config(start_step=start_step, period=period, window=window, threshold=threshold, quantizer=quantizer,
                 param_filter=param_filter, track_fraction=track_fraction, apply=apply)


def osci_reset(
    *,
    start_step: int,
    period: int,
    window: int = 50,
    threshold: float = 8.0,
    quantizer: Quantizer | None = None,
    param_filter: ParamFilter | None = None,
    track_fraction: float = 1.0,
    apply: bool = True,
) -> optax.GradientTransformationExtraArgs:
  """Oscillation reset (TetraJet-v2 OsciReset), chained after the optimizer.

  Args:
    start_step: first update of the first period (spec S); nothing happens
      before it. Runs of other lengths rescale S only
      (`tetrajet_jax.train.schedule.scaled_osci_reset`).
    period: updates between period starts (spec P).
    window: updates per window (spec T), 1 <= window < period; the reset
      is the update after the window.
    threshold: tau; elements with D_Q / D_W >= tau are reset.
    quantizer: w -> Q(w), float32 of w's shape; default: the forward's RTN
      NVFP4 along axis 0 of [in, out] kernels (`NVFP4WeightQuantizer()`).
      For kernels with outlier channels it is called as quantizer(w, rows),
      rows the FP4 rows in the forward's order. With track_fraction < 1 it
      must also have `edge_distance(w[, rows])`. Leaves of one shape are
      processed as one batch, so the quantizer must be a JAX function that
      `jax.vmap` can batch.
    param_filter: (path, leaf) -> bool, path a tuple of str keys; default
      `default_param_filter` (2-D 'kernel' leaves outside 'embed'/'lm_head').
      Tracked leaves must be float32 (the master weights).
    track_fraction: fraction of each leaf's elements tracked per period
      (memory-lean variant): at each period start the ceil(f * n) elements
      closest to an RTN decision threshold.
    apply: False = monitor mode: the same windows and statistics (so
      `osci_reset_metrics` reports the oscillating fraction), but no element
      is reset and the updates pass through unchanged; for runs without
      OsciReset that still plot the quantity it acts on.

  Returns:
    A GradientTransformationExtraArgs. `update(updates, state, params,
    outlier_channels=None, window_phase=None)` needs `params`;
    ``window_phase`` = `window_phase_of(state's count, ...)` lets the host
    pick the branch (no device-side conditional; the caller vouches that it
    matches the count); `outlier_channels` is a tree like
    params (or a sub-tree of it) whose leaves are `ChannelSplit`s (MXFP8
    rows, FP4 rows in the forward's gather order), int32 MXFP8 row indices
    (FP4 rows then ascending), or None. MXFP8 rows never take part, and
    Q(w) of the FP4 rows is the forward's quantization of those rows.

  Example:
    >>> tx = optax.chain(optax.adamw(1e-3),
    ...                  osci_reset(start_step=8000, period=200, window=50))
    >>> state = tx.init(params)
    >>> updates, state = tx.update(grads, state, params)
  """
  cfg = _validated_config(start_step=start_step, period=period, window=window, threshold=threshold,
                          quantizer=quantizer, param_filter=param_filter, track_fraction=track_fraction,
                          apply=apply)

  def update_fn(updates, state, params=None, *, outlier_channels=None, window_phase=None, **extra_args):
    del extra_args  # other transformations' extra arguments
    if params is None:
      raise ValueError("osci_reset: update needs params (tx.update(updates, state, params)); it must see "
                       "the weights the update produces to track Q(w).")
    if window_phase is not None and window_phase not in WINDOW_PHASES:
      raise ValueError(f"osci_reset: window_phase must be None or one of {WINDOW_PHASES} "
                       f"(`window_phase_of(count, ...)` gives it), got {window_phase!r}.")
    with jax.named_scope("osci_reset"):  # names its ops in profiles and HLO dumps
      return _update(cfg, updates, state, params, outlier_channels, window_phase)

  return optax.GradientTransformationExtraArgs(lambda params: _init_state(cfg, params), update_fn)


def _init_state(cfg: _Config, params: Any) -> OsciResetState:
  """Zero window sums and counters for the leaves `cfg.param_filter` tracks."""
  leaves = leaves_with_paths(params)
  tracked = {p: w for p, w in leaves.items() if cfg.param_filter(p, w)}
  if not tracked and cfg.apply:  # a monitor may watch nothing (e.g. a model with no FP4 layer)
    names = ", ".join(path_name(p) for p in list(leaves)[:8])
    raise ValueError(f"osci_reset: param_filter matches no parameter (first paths: {names}); "
                     f"the default tracks 2-D leaves named 'kernel' outside 'embed'/'lm_head'.")
  for p, w in tracked.items():
    if jnp.asarray(w).dtype != jnp.float32:
      raise ValueError(f"osci_reset: tracked parameter {path_name(p)!r} has dtype {jnp.asarray(w).dtype}; "
                       f"OsciReset needs float32 master weights to land on Q(w) exactly.")
    if jnp.ndim(w) < 1:
      raise ValueError(f"osci_reset: tracked parameter {path_name(p)!r} is a scalar; exclude it in param_filter.")

  def acc(w):
    shape = (cfg.num_tracked(w.size),) if cfg.lean else w.shape
    return jnp.zeros(shape, jnp.float32)

  zero = lambda w: jnp.zeros((), jnp.int32)
  return OsciResetState(
      count=jnp.zeros((), jnp.int32),
      d_q=nest({p: acc(w) for p, w in tracked.items()}),
      d_w=nest({p: acc(w) for p, w in tracked.items()}),
      index=nest({p: jnp.zeros((cfg.num_tracked(w.size),), jnp.int32) for p, w in tracked.items()}) if cfg.lean else {},
      num_active=nest({p: zero(w) for p, w in tracked.items()}),
      num_risky=nest({p: zero(w) for p, w in tracked.items()}),
      num_risky_last=nest({p: zero(w) for p, w in tracked.items()}),
      num_reset=nest({p: zero(w) for p, w in tracked.items()}),
  )


def _leaf_window_step(cfg: _Config, p, u, fields, row_active, rows, starts, ends):
  """One window update (or the reset update after it, `ends`) of one leaf: (new update, new fields)."""
  d_q, d_w, index, n_active, n_risky, n_risky_last, n_reset = fields
  q_of = cfg.quantizer if rows is None else (lambda w: cfg.quantizer(w, rows))
  # Barriers keep XLA (CPU) from contracting a product feeding these adds into an FMA: the
  # upstream update and Q(w) = (q * s_in) * s_out must be rounded to float32 before they are
  # added or subtracted, or w_new, D_Q and the exact landing would not be float32 arithmetic.
  p, u = jax.lax.optimization_barrier((p, u))
  w_new = (p + u).astype(p.dtype)  # what optax.apply_updates will produce
  q_prev, q_new = jax.lax.optimization_barrier((q_of(p), q_of(w_new)))
  active = jnp.broadcast_to(row_active.reshape((-1,) + (1,) * (p.ndim - 1)), p.shape)
  if cfg.lean:
    def select(_):
      dist = cfg.quantizer.edge_distance(p) if rows is None else cfg.quantizer.edge_distance(p, rows)
      score = jnp.where(active, dist, jnp.inf).reshape(-1)
      _, idx = jax.lax.top_k(-score, index.shape[0])
      return jnp.sort(idx).astype(jnp.int32)  # sorted: gathers and scatters walk memory in order
    if isinstance(starts, bool):  # the host knows the window phase: no conditional in the program
      index = select(None) if starts else index
    else:
      index = jax.lax.cond(starts, select, lambda _: index, None)
    pick = lambda x: x.reshape(-1)[index]
    p_t, q_prev_t, q_new_t, w_new_t, active_t = map(pick, (p, q_prev, q_new, w_new, active))
  else:
    p_t, q_prev_t, q_new_t, w_new_t, active_t = p, q_prev, q_new, w_new, active
  acc = active_t & ~ends  # the reset update adds nothing to the window's sums
  d_q = jnp.where(starts, 0.0, d_q) + jnp.where(acc, jnp.abs(q_new_t - q_prev_t), 0.0)
  d_w = jnp.where(starts, 0.0, d_w) + jnp.where(acc, jnp.abs(w_new_t - p_t), 0.0)
  risk = jnp.where(d_w > 0, d_q / jnp.where(d_w > 0, d_w, 1.0), 0.0)
  risky = active_t & (risk >= cfg.threshold)
  if not cfg.apply:
    reset = jnp.zeros_like(risky)  # monitor mode: the updates pass through unchanged
  else:
    step, exact = _exact_step(p_t, q_new_t)
    reset = risky & exact & ends
    if cfg.lean:
      u_flat = u.reshape(-1)
      u = u_flat.at[index].set(jnp.where(reset, step, u_flat[index]), unique_indices=True).reshape(u.shape)
    else:
      u = jnp.where(reset, step, u)
  n_risky = jnp.sum(risky, dtype=jnp.int32)
  n_risky_last = jnp.where(ends, n_risky, n_risky_last)
  n_reset = jnp.where(ends, jnp.sum(reset, dtype=jnp.int32), n_reset)
  n_active = jnp.sum(active, dtype=jnp.int32)
  return u, (d_q, d_w, index, n_active, n_risky, n_risky_last, n_reset)


def _same_shape_groups(params: list[Any], rows: list[tuple[jax.Array, Any]]) -> list[list[int]]:
  """Indices of tracked leaves grouped by (shape, dtype, FP4 row count): a model's blocks repeat
  the same kernels, so each group's window step runs as one batched (vmapped) computation."""
  groups: dict[Any, list[int]] = {}
  for i, (p, (_, fp4_rows)) in enumerate(zip(params, rows)):
    key = (tuple(jnp.shape(p)), jnp.result_type(p), None if fp4_rows is None else tuple(jnp.shape(fp4_rows)))
    groups.setdefault(key, []).append(i)
  return list(groups.values())


def _update(cfg: _Config, updates, state: OsciResetState, params, outlier_channels, window_phase):
  """OsciReset's update (see `osci_reset`): (new updates, new state)."""
  u_leaves = leaves_with_paths(updates)
  p_leaves = leaves_with_paths(params)
  names = [tuple(p) for p in leaves_with_paths(state.d_q)]
  for path in names:
    if path not in p_leaves or path not in u_leaves:
      raise ValueError(f"osci_reset: tracked parameter {path_name(path)!r} is missing from params/updates; "
                       f"the tree changed since init.")
  outliers: dict[Path, Any] = {}
  if outlier_channels is not None:
    outliers = outlier_leaves(outlier_channels)
    unknown = [path_name(p) for p in outliers if p not in p_leaves]
    if unknown:
      raise ValueError(f"osci_reset: outlier_channels names paths that are not parameters: {unknown}.")

  def per_leaf(field):
    flat = leaves_with_paths(field)
    return [flat[p] for p in names]

  fields = list(zip(per_leaf(state.d_q), per_leaf(state.d_w),
                    per_leaf(state.index) if cfg.lean else [None] * len(names),
                    per_leaf(state.num_active), per_leaf(state.num_risky),
                    per_leaf(state.num_risky_last), per_leaf(state.num_reset)))
  us = [u_leaves[p] for p in names]
  ps = [p_leaves[p] for p in names]
  rows = [leaf_fp4_rows(p, tuple(jnp.shape(w)), outliers) for p, w in zip(names, ps)]

  n = state.count
  offset = n - cfg.start_step
  phase = jnp.where(offset >= 0, offset % cfg.period, cfg.period)
  ends = phase == cfg.window

  def window_step(starts, operands):
    us, fields = operands
    step = functools.partial(_leaf_window_step, cfg, starts=starts, ends=ends)
    stack = lambda xs: jax.tree.map(lambda *leaves: jnp.stack(leaves), *xs)
    out: list[Any] = [None] * len(names)
    for group in _same_shape_groups(ps, rows):
      # One batched computation per group: XLA compiles a group's quantizer once, not once per layer.
      pick = lambda xs: [xs[i] for i in group]
      fp4_rows = [rows[i][1] for i in group]
      batched = jax.vmap(step)(stack(pick(ps)), stack(pick(us)), stack(pick(fields)),
                               stack([rows[i][0] for i in group]), None if fp4_rows[0] is None else stack(fp4_rows))
      for k, i in enumerate(group):
        out[i] = jax.tree.map(lambda x: x[k], batched)
    return [o[0] for o in out], [o[1] for o in out]

  if window_phase is None:  # the device decides (see the module docstring for its cost on a GPU)
    in_window = (offset >= 0) & (phase <= cfg.window)  # the window's T updates and the reset update
    new_us, new_fields = jax.lax.cond(in_window, functools.partial(window_step, phase == 0), lambda ops: ops,
                                      (us, fields))
  elif window_phase == OUTSIDE:
    new_us, new_fields = us, fields
  else:
    new_us, new_fields = window_step(window_phase == FIRST, (us, fields))
  u_leaves = dict(u_leaves)
  u_leaves.update(zip(names, new_us))
  new_updates = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(updates), list(u_leaves.values()))
  column = lambda i: nest({p: f[i] for p, f in zip(names, new_fields)})
  new_state = OsciResetState(
      count=optax.safe_increment(n),
      d_q=column(0), d_w=column(1), index=column(2) if cfg.lean else {},
      num_active=column(3), num_risky=column(4), num_risky_last=column(5), num_reset=column(6))
  return new_updates, new_state




def find_state(opt_state: Any, state_type: type) -> Any:
  """The single `state_type` NamedTuple inside an optimizer state (chain, MultiSteps, inject_hyperparams)."""
  found = [x for x in jax.tree_util.tree_leaves(opt_state, is_leaf=lambda x: isinstance(x, state_type))
           if isinstance(x, state_type)]
  if len(found) != 1:
    raise ValueError(f"Expected exactly one {state_type.__name__} in the optimizer state, found {len(found)}.")
  return found[0]


def find_osci_reset_state(opt_state: Any) -> OsciResetState:
  """The single OsciResetState inside an optimizer state."""
  return find_state(opt_state, OsciResetState)


def is_layer_metric(key: str) -> bool:
  """Whether `key` is one of `osci_reset_metrics`' per-layer keys (``osci/<figure>/<path>``),
  which change once per window: the trainer's metrics file records them when they change."""
  return key.startswith("osci/") and key.count("/") >= 2


def osci_reset_metrics(state: Any) -> dict[str, jax.Array]:
  """Slash-namespaced metrics from an OsciResetState (or an optimizer state holding one).

  Keys, per tracked layer `<path>` and aggregated over layers (weighted by
  the number of participating elements):
    osci/reset_frac[/<path>]: fraction of elements reset at the last reset.
    osci/risk_frac[/<path>]: fraction with R >= tau at the end of the last completed window.
    osci/window_risk_frac[/<path>]: fraction with R >= tau so far in the current window.
  Fractions are over participating elements (outlier rows excluded); 0 before
  the first window. Works under jit.
  """
  st = state if isinstance(state, OsciResetState) else find_osci_reset_state(state)
  active = leaves_with_paths(st.num_active)
  counts = {"reset_frac": leaves_with_paths(st.num_reset), "risk_frac": leaves_with_paths(st.num_risky_last),
            "window_risk_frac": leaves_with_paths(st.num_risky)}
  out: dict[str, jax.Array] = {}
  total_active = sum(a.astype(jnp.float32) for a in active.values())
  for key, num in counts.items():
    for path, c in num.items():
      out[f"osci/{key}/{path_name(path)}"] = c.astype(jnp.float32) / jnp.maximum(active[path], 1).astype(jnp.float32)
    total = sum(c.astype(jnp.float32) for c in num.values())
    out[f"osci/{key}"] = total / jnp.maximum(total_active, 1.0)
  return out
