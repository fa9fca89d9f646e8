"""Statistics over seeds: Student quantiles against numeric integration, intervals, verdict rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments import seed_stats as ss


def _t_cdf_central(q: float, df: int) -> float:
  """P(|T| <= q) for Student's t with df degrees of freedom, by the trapezoid rule in float64."""
  x = np.linspace(0.0, q, 400_001)
  log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
  pdf = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
  return float(2.0 * np.trapezoid(pdf, x))


@pytest.mark.parametrize("df", [1, 2, 3, 5, 10, 30, 31, 60, 200])
def test_t975_holds_95_percent(df):
  assert _t_cdf_central(ss.t975(df), df) == pytest.approx(0.95, abs=2e-4)


def test_t975_refuses_no_degrees_of_freedom():
  with pytest.raises(ValueError, match="df must be >= 1"):
    ss.t975(0)


def test_spread_and_interval_by_hand():
  s = ss.spread([5.0, 5.2, 5.1, None, float("nan")])  # missing seeds are skipped
  assert s.n == 3 and s.mean == pytest.approx(5.1) and s.std == pytest.approx(0.1)
  iv = ss.interval([5.0, 5.2, 5.1])
  half = 4.3027 * 0.1 / math.sqrt(3)
  assert (iv.low, iv.high, iv.n) == (pytest.approx(5.1 - half), pytest.approx(5.1 + half), 3)
  assert ss.spread([]) is None and ss.spread([1.0]).std is None
  assert ss.interval([1.0]) is None  # one seed: no interval


def test_lower_verdict_rule():
  assert ss.lower_verdict(ss.interval([-0.03, -0.02, -0.025])) == ss.CONFIRMED
  assert ss.lower_verdict(ss.interval([0.03, 0.02, 0.025])) == ss.REFUTED
  assert ss.lower_verdict(ss.interval([-0.03, 0.02, -0.01])) == ss.UNRESOLVED
  assert ss.lower_verdict(None) == ss.UNRESOLVED


def test_share_verdict_rule():
  assert ss.share_verdict(ss.interval([0.45, 0.55, 0.50]), 0.513) == ss.CONFIRMED
  assert ss.share_verdict(ss.interval([0.10, 0.12, 0.11]), 0.513) == ss.REFUTED  # excludes the claim
  assert ss.share_verdict(ss.interval([-0.5, 1.2, 0.6]), 0.513) == ss.UNRESOLVED  # contains it, too wide
  assert ss.share_verdict(None, 0.513) == ss.UNRESOLVED
