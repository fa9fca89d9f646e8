"""Statistics over seeds: per-arm means and spreads, paired differences with 95%
intervals, and the verdict rule of the reproduction's claims.

A run folder is one seed: every arm in it saw the same initialisation seed
and data order, so two arms are compared seed by seed (a paired difference
per folder) and the spread of those differences is what a claim must beat.
With n seeds, the interval is mean +- t(0.975, n - 1) * sd / sqrt(n), the
Student interval of the mean paired difference. With two or three seeds it
is wide (t = 12.71 and 4.30): that is the honest size of what few seeds can
resolve.

Verdict rule for a claim "A is lower than B" (Δ = A - B per seed):
  confirmed   the whole interval is below 0;
  refuted     the whole interval is above 0;
  unresolved  the interval contains 0, or fewer than two seeds have both arms.
For a claimed share (the full method closes about half of NVIDIA's gap to
bf16): confirmed when the interval lies inside (0, 1) and contains the
paper's figure; refuted when it excludes the paper's figure; else unresolved.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

# Two-sided 95% quantiles t(0.975, df) of Student's t for df = 1..30.
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
         2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
         2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)
_Z975 = 1.959964

CONFIRMED, REFUTED, UNRESOLVED = "confirmed", "refuted", "unresolved"


def t975(df: int) -> float:
  """t(0.975, df): the table above, then the Cornish-Fisher expansion (error < 1e-4 for df > 30)."""
  if df < 1:
    raise ValueError(f"t975: df must be >= 1, got {df}.")
  if df <= len(_T975):
    return _T975[df - 1]
  z = _Z975
  return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclasses.dataclass(frozen=True)
class Spread:
  """Mean and sample standard deviation of one figure over seeds (std None for one seed)."""

  mean: float
  std: float | None
  n: int


def spread(values: Sequence[float]) -> Spread | None:
  """Spread of the finite values given (None when there are none)."""
  vals = [float(v) for v in values if v is not None and math.isfinite(v)]
  if not vals:
    return None
  mean = sum(vals) / len(vals)
  std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else None
  return Spread(mean, std, len(vals))


@dataclasses.dataclass(frozen=True)
class Interval:
  """Mean of per-seed values with its 95% Student interval."""

  mean: float
  low: float
  high: float
  n: int


def interval(values: Sequence[float]) -> Interval | None:
  """The 95% interval of the mean of per-seed values (None below two values)."""
  s = spread(values)
  if s is None or s.n < 2:
    return None
  half = t975(s.n - 1) * s.std / math.sqrt(s.n)
  return Interval(s.mean, s.mean - half, s.mean + half, s.n)


def lower_verdict(iv: Interval | None) -> str:
  """The rule for "A is lower than B", given the interval of A - B."""
  if iv is None:
    return UNRESOLVED
  if iv.high < 0:
    return CONFIRMED
  if iv.low > 0:
    return REFUTED
  return UNRESOLVED


def share_verdict(iv: Interval | None, claimed: float) -> str:
  """The rule for "the share is about `claimed`", given the interval of the per-seed shares."""
  if iv is None:
    return UNRESOLVED
  if not iv.low <= claimed <= iv.high:
    return REFUTED
  if 0.0 < iv.low and iv.high < 1.0:
    return CONFIRMED
  return UNRESOLVED
