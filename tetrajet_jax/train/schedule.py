"""Learning-rate schedule and the method's step windows, scaled to a run.

LR (docs/SPEC.md section 6, in tokens; a run has a fixed number of tokens per step, so the
token points are step points): linear warmup from ``peak/warmup`` to
``peak`` over ``warmup_steps``, cosine decay to ``final_ratio * peak``
(0.1x) at ``t_max_steps``, then flat at that floor until the last step.
Defaults (`default_lr_steps`) scale the paper's 70M run: warmup 1e9 tokens
= 2% of t_max = 50e9 tokens, and t_max = 50e9 of the run's 12,505 x 1024 x
4096 tokens (95.3% of the run).

OsciReset (docs/SPEC.md section 3): window T = 50 and period P = 200 as in the reference;
only the start S moves, to the same point of the run's own schedule as the
reference's step 8000 of 12,505 (the same cosine-decay progress, 0.664,
where the LR is 0.33x peak). The reset is the update after each window. A
run with room for fewer than 3 resets is refused
(`OsciResetScheduleError`, naming the minimum run length) unless the caller
sets the window and period explicitly.

OutControl calibration: reference steps 501-550 of 12,505, i.e. starting
at 4.0% of the run and lasting 0.4% of it; here
``start = max(1, round(501 / 12505 * total))``,
``length = max(4, round(50 / 12505 * total))``. Layers run pure FP4 before
the window, accumulate channel statistics during it, and use the frozen
top-p channels after it.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

# The paper's 70M run (docs/SPEC.md section 6): tokens per step, steps, warmup and t_max in tokens, OsciReset start.
REF_TOKENS_PER_STEP = 1024 * 4096
REF_TOTAL_STEPS = 12505
REF_WARMUP_TOKENS = 1e9
REF_T_MAX_TOKENS = 50e9
REF_OSCI_START = 8000
WARMUP_FRACTION_OF_T_MAX = REF_WARMUP_TOKENS / REF_T_MAX_TOKENS
T_MAX_FRACTION_OF_RUN = REF_T_MAX_TOKENS / (REF_TOTAL_STEPS * REF_TOKENS_PER_STEP)
# Cosine-decay progress of the reference's OsciReset start.
OSCI_START_DECAY_PROGRESS = ((REF_OSCI_START - REF_WARMUP_TOKENS / REF_TOKENS_PER_STEP)
                             / ((REF_T_MAX_TOKENS - REF_WARMUP_TOKENS) / REF_TOKENS_PER_STEP))
OSCI_WINDOW = 50
OSCI_PERIOD = 200
OSCI_MIN_RESETS = 3
CALIB_START_FRACTION = 501 / REF_TOTAL_STEPS
CALIB_LENGTH_FRACTION = 50 / REF_TOTAL_STEPS


class OsciResetScheduleError(ValueError):
  """The run is too short for OsciReset's reference window and period."""


def default_lr_steps(total_steps: int, warmup_steps: int | None = None,
                     t_max_steps: int | None = None) -> tuple[int, int]:
  """(warmup_steps, t_max_steps) for a run of ``total_steps``; None = the
  paper's 70M ratios (t_max = 95.3% of the run, warmup = 2% of t_max, at
  least 1 step)."""
  if t_max_steps is None:
    t_max_steps = max(1, min(total_steps - 1, round(T_MAX_FRACTION_OF_RUN * total_steps)))
  if warmup_steps is None:
    warmup_steps = min(max(1, round(WARMUP_FRACTION_OF_T_MAX * t_max_steps)), max(t_max_steps - 1, 0))
  return warmup_steps, t_max_steps


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schedule:
  """Step counts and LR of one run.

  Attributes:
    total_steps: optimizer steps in the run.
    warmup_steps: linear warmup steps (< total_steps).
    peak_lr: LR at the end of warmup.
    final_ratio: the floor (LR at t_max and after), as a fraction of peak.
    t_max_steps: the step where the cosine reaches the floor; None = the
      last step (total_steps - 1). `default_lr_steps` gives the paper's.
  """

  total_steps: int
  warmup_steps: int
  peak_lr: float
  final_ratio: float = 0.1
  t_max_steps: int | None = None

  def __post_init__(self):
    if self.total_steps < 2:
      raise ValueError(f"total_steps={self.total_steps} must be >= 2; train for more tokens.")
    if not 0 <= self.warmup_steps < self.total_steps:
      raise ValueError(f"warmup_steps={self.warmup_steps} must be in [0, total_steps="
                       f"{self.total_steps}); lower --warmup or train longer.")
    if not self.peak_lr > 0:
      raise ValueError(f"peak_lr={self.peak_lr} must be > 0.")
    if not 0 <= self.final_ratio <= 1:
      raise ValueError(f"final_ratio={self.final_ratio} must be in [0, 1].")
    if self.t_max_steps is not None and self.t_max_steps <= self.warmup_steps:
      raise ValueError(f"t_max_steps={self.t_max_steps} must be after warmup_steps={self.warmup_steps}.")

  @property
  def t_max(self) -> int:
    """The step where the cosine reaches the floor."""
    return self.total_steps - 1 if self.t_max_steps is None else self.t_max_steps

  def lr(self, step):
    """LR used by the update of ``step`` (0-based); works on ints and traced arrays."""
    step = jnp.asarray(step, jnp.float32)
    W, peak = self.warmup_steps, self.peak_lr
    warm = peak * (step + 1.0) / max(W, 1)
    progress = jnp.clip((step - W) / max(self.t_max - W, 1), 0.0, 1.0)  # 1 (the floor) from t_max on
    final = self.final_ratio * peak
    cos = final + (peak - final) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    return jnp.where(step < W, warm, cos)

  def decay_progress(self, step: int) -> float:
    return min(max((step - self.warmup_steps) / max(self.t_max - self.warmup_steps, 1), 0.0), 1.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OsciResetWindows:
  """Where OsciReset runs: first window at ``start_step``, every ``period`` steps, ``window`` long;
  each reset is the update after a window."""

  start_step: int
  period: int
  window: int
  threshold: float = 8.0

  def __post_init__(self):
    if self.start_step < 0 or self.period < 1 or self.window < 1:
      raise ValueError(f"OsciReset start={self.start_step}, period={self.period}, window="
                       f"{self.window}: need start >= 0, period >= 1, window >= 1.")
    if self.window >= self.period:
      raise ValueError(f"OsciReset window={self.window} must be shorter than its period={self.period}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CalibrationWindow:
  """OutControl: accumulate channel statistics on steps [start, start + length), then freeze."""

  start: int
  length: int

  def __post_init__(self):
    if self.start < 0 or self.length < 1:
      raise ValueError(f"OutControl calibration start={self.start}, length={self.length}: need "
                       "start >= 0 and length >= 1.")

  @property
  def end(self) -> int:
    return self.start + self.length

  def phase(self, step: int) -> str:
    """The OutControl phase in force for the update of ``step``."""
    if step < self.start:
      return "fp4"
    return "calibrate" if step < self.end else "frozen"


def osci_resets_in_run(total_steps: int, start: int, period: int, window: int) -> int:
  """How many resets (the updates start + k*period + window) fall on updates 0..total_steps-1."""
  last = total_steps - 1 - start - window
  return 0 if last < 0 else last // period + 1


def _scaled_start(schedule: Schedule) -> int:
  return schedule.warmup_steps + math.ceil(OSCI_START_DECAY_PROGRESS * (schedule.t_max - schedule.warmup_steps))


def osci_reset_min_steps(schedule: Schedule, *, start: int | None = None) -> int:
  """The shortest run that fits OSCI_MIN_RESETS resets at T = 50, P = 200,
  with ``start`` if fixed, else with the default warmup and t_max
  (`default_lr_steps`) if this schedule uses them, else with its proportions."""
  defaults = (schedule.warmup_steps, schedule.t_max) == default_lr_steps(schedule.total_steps)
  n = max(schedule.total_steps, 2)
  while True:
    if start is None:
      if defaults:
        warm, t_max = default_lr_steps(n)
      else:
        t_max = max(1, round(schedule.t_max / schedule.total_steps * n))
        warm = min(round(schedule.warmup_steps / schedule.total_steps * n), t_max - 1)
      s = _scaled_start(Schedule(total_steps=n, warmup_steps=warm, peak_lr=1.0, t_max_steps=t_max))
    else:
      s = start
    if osci_resets_in_run(n, s, OSCI_PERIOD, OSCI_WINDOW) >= OSCI_MIN_RESETS:
      return n
    n += 1


def scaled_osci_reset(schedule: Schedule, *, threshold: float = 8.0, start: int | None = None,
                      period: int | None = None, window: int | None = None) -> OsciResetWindows:
  """OsciReset placement for ``schedule`` (module docstring: the rule and its source).

  ``start``, ``period``, ``window``: explicit values (None = the rule: S
  scaled, P = 200, T = 50).

  Raises:
    OsciResetScheduleError: fewer than 3 resets fit in the run and neither
      ``period`` nor ``window`` was set explicitly; the message names the
      minimum run length.
  """
  s = _scaled_start(schedule) if start is None else start
  p = OSCI_PERIOD if period is None else period
  w = OSCI_WINDOW if window is None else window
  if period is None and window is None:
    fits = osci_resets_in_run(schedule.total_steps, s, p, w)
    if fits < OSCI_MIN_RESETS:
      need = osci_reset_min_steps(schedule, start=start)
      raise OsciResetScheduleError(
          f"OsciReset: a run of {schedule.total_steps} steps has room for {fits} reset(s) at start S={s}, "
          f"window T={w}, period P={p} (the reference values); it needs {OSCI_MIN_RESETS}. Train for at least "
          f"{need} steps, or set the window or period explicitly (--osci-window / --osci-period) to accept "
          f"values that may not tell an oscillation from one honest crossing.")
  return OsciResetWindows(start_step=s, period=p, window=w, threshold=threshold)


def scaled_calibration(schedule: Schedule) -> CalibrationWindow:
  """OutControl calibration window for ``schedule`` (module docstring: the rule)."""
  start = max(1, round(CALIB_START_FRACTION * schedule.total_steps))
  length = max(4, round(CALIB_LENGTH_FRACTION * schedule.total_steps))
  if start + length >= schedule.total_steps:
    raise ValueError(f"the OutControl calibration window [{start}, {start + length}) does not fit in "
                     f"{schedule.total_steps} steps; train for more steps.")
  return CalibrationWindow(start=start, length=length)
