"""The demo's verdict: paired bootstrap over validation batches, chance ranges, wording."""

from __future__ import annotations

import numpy as np
import pytest

from experiments import verdict


def test_paired_bootstrap_matches_the_normal_interval_on_gaussian_differences(rng):
  n = 400
  base = rng.normal(4.0, 0.3, n)  # batch difficulty, shared by both arms (paired)
  a = base + rng.normal(0.02, 0.01, n)
  diff, lo, hi = verdict.paired_bootstrap(a, base, samples=4000, seed=1)
  d = a - base
  se = d.std(ddof=1) / np.sqrt(n)
  assert diff == pytest.approx(d.mean(), rel=1e-12)
  # percentile bootstrap of a mean ~ mean +- 1.96 se (tolerance: bootstrap Monte Carlo error)
  assert lo == pytest.approx(d.mean() - 1.96 * se, abs=0.15 * se)
  assert hi == pytest.approx(d.mean() + 1.96 * se, abs=0.15 * se)


def test_paired_bootstrap_weights_batches_by_tokens():
  a, b = np.array([1.0, 3.0]), np.zeros(2)
  diff, _, _ = verdict.paired_bootstrap(a, b, np.array([3.0, 1.0]))
  assert diff == 1.5


def test_paired_bootstrap_rejects_unpaired_input():
  with pytest.raises(ValueError, match="one length"):
    verdict.paired_bootstrap(np.ones(3), np.ones(4))
  with pytest.raises(ValueError, match="at least 2 validation batches"):
    verdict.paired_bootstrap(np.ones(1), np.ones(1))


def test_chance_range_is_the_binomial_95_percent_range():
  lo, hi = verdict.chance_range(0.25, 100)
  assert (lo, hi) == pytest.approx((0.25 - 1.959964 * np.sqrt(0.25 * 0.75 / 100),
                                    0.25 + 1.959964 * np.sqrt(0.25 * 0.75 / 100)))
  # a simulated guesser lands inside about 95% of the time
  acc = np.random.default_rng(0).binomial(100, 0.25, 20000) / 100
  assert 0.93 < np.mean((acc >= lo) & (acc <= hi)) < 0.97


def _final(losses, downstream=None):
  return {"status": "completed", "val": {"batch_losses": list(losses), "batch_tokens": [128] * len(losses)},
          "downstream": downstream or {}}


def test_verdict_says_within_noise_and_flags_chance_accuracy(rng):
  base = rng.normal(4.0, 0.3, 16)
  finals = {
      "bf16": _final(base),
      "nvidia_nvfp4": _final(base + 0.2 + rng.normal(0, 0.01, 16)),  # a clear gap
      "tetrajet_v2_full": _final(base + 0.2 + rng.normal(0, 0.05, 16),  # same as nvidia within noise
                                 {"arc_easy": {"accuracy": 0.27, "chance": 0.25, "num_docs": 100},
                                  "piqa": {"accuracy": 0.80, "chance": 0.5, "num_docs": 100}}),
  }
  lines = verdict.verdict(finals, fp4_arm="tetrajet_v2_full")
  text = "\n".join(lines)
  assert "tetrajet_v2_full ends" in lines[0] and "than nvidia_nvfp4" in lines[0]
  assert "within the evaluation noise" in lines[0]
  assert "than bf16" in lines[1] and "larger than the evaluation noise" in lines[1]
  assert "nvidia_nvfp4 ends" in lines[2] and "larger than the evaluation noise" in lines[2]
  assert "tetrajet_v2_full arc_easy: accuracy 0.270 on 100 questions is within what guessing gives" in text
  assert "piqa" not in text  # 0.80 vs chance 0.5 is signal
  assert "gap closure of this run is not meaningful" not in text
  assert lines[-1].startswith("These intervals hold the evaluation noise only")


def test_verdict_says_when_the_gap_itself_is_noise(rng):
  base = rng.normal(4.0, 0.3, 16)
  finals = {"bf16": _final(base), "nvidia_nvfp4": _final(base + rng.normal(0, 0.05, 16)),
            "tetrajet_v2_full": _final(base + rng.normal(0, 0.05, 16))}
  assert any("gap closure of this run is not meaningful" in l
             for l in verdict.verdict(finals, fp4_arm="tetrajet_v2_full"))


def test_verdict_says_when_the_baseline_beats_the_reference(rng):
  """An FP4 baseline clearly below bf16 leaves no gap to close; the verdict says that, not 'noise'."""
  base = rng.normal(4.0, 0.3, 16)
  finals = {"bf16": _final(base), "nvidia_nvfp4": _final(base - 0.2 + rng.normal(0, 0.01, 16)),
            "tetrajet_v2_full": _final(base + rng.normal(0, 0.05, 16))}
  text = "\n".join(verdict.verdict(finals, fp4_arm="tetrajet_v2_full"))
  assert "nvidia_nvfp4 ends below bf16 beyond the evaluation noise: this run has no FP4 gap to close" in text
  assert "gap closure of this run is not meaningful" not in text
