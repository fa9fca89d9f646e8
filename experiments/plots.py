"""Plots of an ablation run from its metrics files (matplotlib, PNG); experiments/report.py reuses them.

``python -m experiments.plots RESULTS_DIR`` redraws them from
``RESULTS_DIR/<arm>/metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

from tetrajet_jax.train.metrics import read_jsonl  # pylint: disable=wrong-import-position

# The training loss is smoothed over about this many points per curve.
SMOOTHING_POINTS = 50
# "Late training" starts at this fraction of the last step (the zoomed panel;
# experiments/report.py measures the late rebound over the same range).
LATE_START = 2 / 3


def series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  pts = [(r["step"], r[key]) for r in records if key in r and not math.isnan(r[key])]
  if not pts:
    return np.zeros(0), np.zeros(0)
  s, v = zip(*pts)
  return np.asarray(s, float), np.asarray(v, float)


def smoothing_window(num_points: int) -> int:
  """Moving-average window for a curve of ``num_points`` training-loss points."""
  return max(1, num_points // SMOOTHING_POINTS)


def smooth(values: np.ndarray, window: int) -> np.ndarray:
  """Trailing moving average (the first points average what exists)."""
  if window <= 1 or values.size == 0:
    return values
  c = np.cumsum(np.insert(values, 0, 0.0))
  idx = np.arange(1, values.size + 1)
  lo = np.maximum(idx - window, 0)
  return (c[idx] - c[lo]) / (idx - lo)


def load_runs(results_dir: Path, arms: list[str] | None = None) -> dict[str, list[dict]]:
  runs = {}
  for d in sorted(p for p in Path(results_dir).iterdir() if (p / "metrics.jsonl").is_file()):
    if arms is None or d.name in arms:
      runs[d.name] = read_jsonl(d / "metrics.jsonl")
  if arms is not None:
    runs = {a: runs[a] for a in arms if a in runs}
  return runs


def smoothed_train_loss(records: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
  """Steps, raw values, trailing moving average and its window of ``train/loss``."""
  s, v = series(records, "train/loss")
  window = smoothing_window(s.size)
  return s, v, smooth(v, window), window


def plot_loss(runs: dict[str, list[dict]], path: Path, title: str = "loss") -> Path:
  """Train loss (smoothed) and validation loss; right panel zooms on the last third."""
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  last_step = 0
  for i, (arm, recs) in enumerate(runs.items()):
    s, _, sv, _ = smoothed_train_loss(recs)
    if s.size == 0:
      continue
    last_step = max(last_step, s.max())
    vs, vv = series(recs, "val/loss")
    for ax in axes:
      ax.plot(s, sv, color=colors[i % len(colors)], lw=1.2, label=f"{arm} train")
      if vs.size:
        ax.plot(vs, vv, "o--", color=colors[i % len(colors)], ms=4, lw=0.8, label=f"{arm} val")
  axes[0].set_title(title)
  axes[1].set_title("last third (zoom)")
  lo = last_step * LATE_START
  axes[1].set_xlim(lo, last_step * 1.01 + 1)
  ys = []
  for recs in runs.values():
    s, _, sv, _ = smoothed_train_loss(recs)
    vs, vv = series(recs, "val/loss")
    ys += list(sv[s >= lo]) + list(vv[vs >= lo])
  if ys:
    pad = 0.05 * (max(ys) - min(ys) + 1e-6)
    axes[1].set_ylim(min(ys) - pad, max(ys) + pad)
  for ax in axes:
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def _from_first_window(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Drops the leading zeros: the metrics read 0 until the first window ends,
  which means "not measured yet", and drawing them as a measured 0 would
  suggest a jump when the first window closes."""
  nz = np.flatnonzero(values)
  return (steps[nz[0]:], values[nz[0]:]) if nz.size else (steps[:0], values[:0])


def plot_oscillation(runs: dict[str, list[dict]], path: Path) -> Path | None:
  """Fraction of FP4 weights with R >= tau per window, and of weights reset."""
  have = {a: r for a, r in runs.items() if series(r, "osci/risk_frac")[0].size}
  if not have:
    return None
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
  for arm, recs in have.items():
    s, v = _from_first_window(*series(recs, "osci/risk_frac"))
    axes[0].step(s, v, where="post", label=arm)
    s, v = _from_first_window(*series(recs, "osci/reset_frac"))
    if s.size:
      axes[1].step(s, v, where="post", label=arm)
  axes[0].set_title("oscillating weights (R >= tau at the end of each window, from the first window on)")
  axes[1].set_title("weights reset by OsciReset (last reset)")
  for ax in axes:
    ax.set_xlabel("step")
    ax.set_ylabel("fraction of FP4 weights")
    ax.grid(alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def plot_all(results_dir: Path, arms: list[str] | None = None) -> list[Path]:
  runs = load_runs(results_dir, arms)
  out = [plot_loss(runs, Path(results_dir) / "loss.png")]
  osc = plot_oscillation(runs, Path(results_dir) / "oscillation.png")
  if osc is not None:
    out.append(osc)
  return out


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m experiments.plots", description=__doc__)
  p.add_argument("results_dir", type=Path)
  args = p.parse_args(argv)
  for path in plot_all(args.results_dir):
    print(path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
