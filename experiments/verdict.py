"""Plain-language verdicts for a small ablation: is a difference bigger than the noise?

Two sources of noise are within reach of one run:

* the validation sample: every arm is scored on the same validation
  batches, so the difference of two arms is a paired statistic, and a
  bootstrap over batches gives its 95% interval (`paired_bootstrap`);
* the downstream questions: an accuracy from n questions of a task with
  chance level c is compared with the range a guesser reaches 95% of the
  time (`chance_range`, normal approximation of the binomial).

Seed-to-seed noise (another initialisation and data order) is not in these
intervals; it needs several seeds (the reproduction does that). The verdict
says so.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

BOOTSTRAP_SAMPLES = 2000
Z95 = 1.959964  # two-sided 95% normal quantile


def paired_bootstrap(a: np.ndarray, b: np.ndarray, weights: np.ndarray | None = None, *,
                     samples: int = BOOTSTRAP_SAMPLES, seed: int = 0) -> tuple[float, float, float]:
  """Mean of a - b over batches and its 95% percentile-bootstrap interval.

  Args:
    a, b: per-batch mean losses of two arms on the same batches [n].
    weights: tokens per batch [n] (default: equal); the means are weighted.
    samples: bootstrap resamples of the batches.
    seed: resampling seed (the interval is reproducible).

  Returns:
    (difference, low, high).

  Raises:
    ValueError: shapes differ or fewer than two batches.
  """
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if a.shape != b.shape or a.ndim != 1:
    raise ValueError(f"paired_bootstrap: per-batch losses must be two 1-D arrays of one length, got "
                     f"{a.shape} and {b.shape}.")
  if a.size < 2:
    raise ValueError(f"paired_bootstrap: needs at least 2 validation batches, got {a.size}.")
  w = np.ones_like(a) if weights is None else np.asarray(weights, np.float64)
  d = a - b
  idx = np.random.default_rng(seed).integers(0, d.size, size=(samples, d.size))
  boot = (d[idx] * w[idx]).sum(1) / w[idx].sum(1)
  lo, hi = np.percentile(boot, [2.5, 97.5])
  return float((d * w).sum() / w.sum()), float(lo), float(hi)


def chance_range(chance: float, n: int) -> tuple[float, float]:
  """Accuracy range a uniform guesser reaches 95% of the time on n questions."""
  if n < 1:
    raise ValueError(f"chance_range: n={n} questions; need at least one.")
  half = Z95 * math.sqrt(chance * (1.0 - chance) / n)
  return max(0.0, chance - half), min(1.0, chance + half)


def describe_difference(name_a: str, name_b: str, diff: float, lo: float, hi: float) -> str:
  """One sentence: arm a's loss against arm b's, and whether the interval excludes 0."""
  word = "lower" if diff < 0 else "higher"
  ci = f"95% interval {lo:+.4f} to {hi:+.4f} over validation batches"
  if lo > 0 or hi < 0:
    return f"{name_a} ends {abs(diff):.4f} nats {word} than {name_b} ({ci}): larger than the evaluation noise."
  return (f"{name_a} ends {abs(diff):.4f} nats {word} than {name_b} ({ci}): within the evaluation noise, "
          "so this run cannot tell them apart.")


def _batch_losses(final: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
  val = final.get("val", {})
  if final.get("status") != "completed" or "batch_losses" not in val:
    return None
  return np.asarray(val["batch_losses"]), np.asarray(val.get("batch_tokens", np.ones(len(val["batch_losses"]))))


def verdict(finals: dict[str, dict[str, Any]], *, fp4_arm: str, reference: str = "bf16",
            baseline: str = "nvidia_nvfp4") -> list[str]:
  """The verdict lines for ``fp4_arm`` against ``reference`` and ``baseline``.

  Each ``finals[arm]["val"]`` holds ``batch_losses`` (and ``batch_tokens``)
  from the same validation batches, and ``downstream[task]`` holds
  ``accuracy``, ``chance`` and ``num_docs`` (`TaskResult`).
  """
  lines = []
  losses = {a: _batch_losses(f) for a, f in finals.items()}
  pairs = [(fp4_arm, baseline), (fp4_arm, reference), (baseline, reference)]
  for a, b in pairs:
    if losses.get(a) is None or losses.get(b) is None:
      continue
    if len(losses[a][0]) != len(losses[b][0]):
      lines.append(f"{a} and {b} were scored on different validation batches; no paired comparison.")
      continue
    lines.append(describe_difference(a, b, *paired_bootstrap(losses[a][0], losses[b][0], losses[a][1])))
  gap = [losses.get(x) for x in (baseline, reference)]
  if all(g is not None for g in gap) and len(gap[0][0]) == len(gap[1][0]):
    _, lo, hi = paired_bootstrap(gap[0][0], gap[1][0], gap[0][1])
    if hi < 0:
      lines.append(f"{baseline} ends below {reference} beyond the evaluation noise: this run has no FP4 gap to "
                   "close (at this scale the seed and data order move losses by more than FP4 does).")
    elif lo <= 0:
      lines.append(f"The {baseline}-to-{reference} gap itself is not larger than the evaluation noise, so the "
                   "gap closure of this run is not meaningful.")
  for arm, f in finals.items():
    for task, res in f.get("downstream", {}).items():
      lo, hi = chance_range(res["chance"], res["num_docs"])
      if lo <= res["accuracy"] <= hi:
        lines.append(f"{arm} {task}: accuracy {res['accuracy']:.3f} on {res['num_docs']} questions is within what "
                     f"guessing gives ({lo:.3f}-{hi:.3f}, chance {res['chance']:.2f}): no signal.")
  lines.append("These intervals hold the evaluation noise only; another seed moves every arm too "
               "(several seeds measure that).")
  return lines
