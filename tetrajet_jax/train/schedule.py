"""Learning-rate schedule and the method's step windows, scaled to a run.

LR: linear warmup from ``peak/warmup`` to ``peak`` over ``warmup_steps``,
then cosine decay to ``final_ratio * peak`` at the last step (spec 6: 0.1x).

The paper's OsciReset and OutControl step numbers belong to runs of 12-50k
steps; a shorter run must place them at the same *relative* points of its
own schedule. The rules, with the reference numbers they come from (70M:
52B tokens at 1024x4096 tokens per step = 12,398 steps):

* OsciReset start ``S``: the first step whose cosine-decay progress
  (``(step - warmup) / (total - warmup)``) reaches 0.65, where the LR is
  0.35x peak. Spec 3: "60-70% into the cosine decay, LR about 0.26-0.42 of
  peak" (70M: S = 8000 of 12,398).
* Period ``P = max(8, (total - S) // 24)``: about 24 reset rounds fit after
  S, as in the reference (70M: (12,398 - 8000) / 200 = 22; 370M: 39).
* Window ``T = clamp(P // 4, 2, 50)``: the reference 50 updates out of a
  200-step period; never more than 50, never fewer than 2 (a ratio of
  changes needs at least two updates).
* OutControl calibration: reference steps 501-550 of 12,398, i.e. starting
  at 4.0% of the run and lasting 0.4% of it; here
  ``start = max(1, round(0.0403 * total))``,
  ``length = max(4, round(0.00403 * total))``. Layers run pure FP4 before
  the window, accumulate channel statistics during it, and use the frozen
  top-p channels after it.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

OSCI_START_DECAY_PROGRESS = 0.65
OSCI_ROUNDS = 24
OSCI_MIN_PERIOD = 8
OSCI_MAX_WINDOW = 50
CALIB_START_FRACTION = 501 / 12398
CALIB_LENGTH_FRACTION = 50 / 12398


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schedule:
  """Step counts and LR of one run.

  Attributes:
    total_steps: optimizer steps in the run.
    warmup_steps: linear warmup steps (< total_steps).
    peak_lr: LR at the end of warmup.
    final_ratio: LR at the last step, as a fraction of peak.
  """

  total_steps: int
  warmup_steps: int
  peak_lr: float
  final_ratio: float = 0.1

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

  def lr(self, step):
    """LR used by the update of ``step`` (0-based); works on ints and traced arrays."""
    step = jnp.asarray(step, jnp.float32)
    W, S, peak = self.warmup_steps, self.total_steps, self.peak_lr
    warm = peak * (step + 1.0) / max(W, 1)
    progress = jnp.clip((step - W) / max(S - 1 - W, 1), 0.0, 1.0)
    final = self.final_ratio * peak
    cos = final + (peak - final) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    return jnp.where(step < W, warm, cos)

  def decay_progress(self, step: int) -> float:
    return min(max((step - self.warmup_steps) / max(self.total_steps - 1 - self.warmup_steps, 1), 0.0), 1.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OsciResetWindows:
  """Where OsciReset runs: first window at ``start_step``, every ``period`` steps, ``window`` long."""

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


def scaled_osci_reset(schedule: Schedule, *, threshold: float = 8.0) -> OsciResetWindows:
  """OsciReset placement for ``schedule`` (module docstring: the rule and its source)."""
  decay = schedule.total_steps - 1 - schedule.warmup_steps
  start = schedule.warmup_steps + math.ceil(OSCI_START_DECAY_PROGRESS * decay)
  period = max(OSCI_MIN_PERIOD, (schedule.total_steps - start) // OSCI_ROUNDS)
  window = min(max(period // 4, 2), OSCI_MAX_WINDOW)
  return OsciResetWindows(start_step=start, period=period, window=window, threshold=threshold)


def scaled_calibration(schedule: Schedule) -> CalibrationWindow:
  """OutControl calibration window for ``schedule`` (module docstring: the rule)."""
  start = max(1, round(CALIB_START_FRACTION * schedule.total_steps))
  length = max(4, round(CALIB_LENGTH_FRACTION * schedule.total_steps))
  if start + length >= schedule.total_steps:
    raise ValueError(f"the OutControl calibration window [{start}, {start + length}) does not fit in "
                     f"{schedule.total_steps} steps; train for more steps.")
  return CalibrationWindow(start=start, length=length)
