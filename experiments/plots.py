"""Plots of an ablation run from its metrics files (matplotlib, PNG); experiments/report.py reuses them.

``python -m experiments.plots RESULTS_DIR`` redraws them from
``RESULTS_DIR/<arm>/metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

from tetrajet_jax.numerics.e2m1 import E2M1_GRID  # pylint: disable=wrong-import-position
from tetrajet_jax.train.metrics import find_metrics, read_jsonl  # pylint: disable=wrong-import-position

# The training loss is smoothed over about this many points per curve.
SMOOTHING_POINTS = 50
# "Late training" starts at this fraction of the last step (the zoomed panel;
# experiments/report.py measures the late rebound over the same range).
LATE_START = 2 / 3


def _save(fig, path: Path) -> Path:
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


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
  for d in sorted(p for p in Path(results_dir).iterdir() if find_metrics(p) is not None):
    if arms is None or d.name in arms:
      runs[d.name] = read_jsonl(find_metrics(d))
  if arms is not None:
    runs = {a: runs[a] for a in arms if a in runs}
  return runs


def load_phases(results_dir: Path, arms: list[str]) -> dict[str, dict]:
  """Each arm's schedule windows from its ``config.json`` (``derived``): OutControl's
  calibration window and OsciReset's windows, where the arm has them."""
  phases = {}
  for arm in arms:
    cfg = Path(results_dir) / arm / "config.json"
    if cfg.is_file():
      derived = json.loads(cfg.read_text(encoding="utf-8")).get("derived", {})
      phases[arm] = {k: derived[k] for k in ("outcontrol_calibration", "osci_reset") if k in derived}
  return phases


def mark_phases(ax, phases: dict[str, dict], last_step: float) -> None:
  """Shades OutControl's calibration window and OsciReset's windows; a dotted line at each reset.

  Arms of one run share one schedule, so the first arm that has a window
  gives it; the legend names each kind once.
  """
  calib = next((p["outcontrol_calibration"] for p in phases.values() if "outcontrol_calibration" in p), None)
  if calib is not None:
    ax.axvspan(calib["start"], calib["start"] + calib["length"], color="tab:orange", alpha=0.15,
               label="OutControl picks outlier channels")
  osci = next((p["osci_reset"] for p in phases.values() if "osci_reset" in p), None)
  if osci is None:
    return
  first = True
  for start in np.arange(osci["start_step"], last_step + 1, osci["period"]):
    ax.axvspan(start, start + osci["window"], color="tab:purple", alpha=0.10,
               label="OsciReset watches flips" if first else "_nolegend_")
    ax.axvline(start + osci["window"] + 1, color="tab:purple", ls=":", lw=0.8,
               label="OsciReset resets" if first else "_nolegend_")
    first = False


def smoothed_train_loss(records: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
  """Steps, raw values, trailing moving average and its window of ``train/loss``."""
  s, v = series(records, "train/loss")
  window = smoothing_window(s.size)
  return s, v, smooth(v, window), window


def plot_loss(runs: dict[str, list[dict]], path: Path, title: str = "loss",
              phases: dict[str, dict] | None = None) -> Path:
  """Train loss (smoothed) and validation loss; right panel zooms on the last third.

  ``phases`` (`load_phases`) marks where OutControl calibrates and OsciReset acts.
  """
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
  lo = last_step * LATE_START
  ys = []
  for recs in runs.values():
    s, _, sv, _ = smoothed_train_loss(recs)
    vs, vv = series(recs, "val/loss")
    ys += list(sv[s >= lo]) + list(vv[vs >= lo])
  for ax in axes:
    mark_phases(ax, phases or {}, last_step)
  _loss_panels(axes, title, "loss (nats/token)", last_step, ys)
  return _save(fig, path)


def _loss_panels(axes, title: str, ylabel: str, last_step: float, late_values) -> None:
  """Titles, labels, grid and legend of a (whole run, last third) pair of loss panels; the zoom
  spans the last third's steps and the values plotted there."""
  axes[0].set_title(title)
  axes[1].set_title("last third (zoom)")
  if len(late_values):
    pad = 0.05 * (max(late_values) - min(late_values) + 1e-6)
    axes[1].set_ylim(min(late_values) - pad, max(late_values) + pad)
  for ax in axes:
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
  axes[1].set_xlim(last_step * LATE_START, last_step * 1.01 + 1)
  axes[0].legend(fontsize=8)


def plot_loss_bands(runs: dict[str, list[list[dict]]], path: Path, title: str = "loss over seeds") -> Path | None:
  """Per arm, the mean over seeds of the smoothed training loss with the band from the lowest to
  the highest seed; right panel: the last third. Seeds are put on the first seed's steps."""
  curves = {}
  for arm, seeds in runs.items():
    smoothed = [smoothed_train_loss(r) for r in seeds]
    smoothed = [(s, sv) for s, _, sv, _ in smoothed if s.size]
    if not smoothed:
      continue
    steps = smoothed[0][0]
    stack = np.stack([np.interp(steps, s, sv) for s, sv in smoothed])
    curves[arm] = (steps, stack.mean(0), stack.min(0), stack.max(0), len(smoothed))
  if not curves:
    return None
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  last_step = max(c[0].max() for c in curves.values())
  lo = last_step * LATE_START
  for i, (arm, (steps, mean, low, high, n)) in enumerate(curves.items()):
    for ax in axes:
      ax.fill_between(steps, low, high, color=colors[i % len(colors)], alpha=0.2, lw=0)
      ax.plot(steps, mean, color=colors[i % len(colors)], lw=1.2, label=f"{arm} ({n} seeds)")
  late = np.concatenate([np.concatenate([lw[st >= lo], hi[st >= lo]]) for st, _, lw, hi, _ in curves.values()])
  _loss_panels(axes, title, "train loss, smoothed (nats/token)", last_step, late)
  return _save(fig, path)


# E2M1 round-to-nearest decision thresholds (midpoints between grid values), in grid units.
E2M1_THRESHOLDS = tuple(float(m) for m in (E2M1_GRID[1:] + E2M1_GRID[:-1]) / 2)


def plot_latent_histograms(hists: dict[str, tuple[np.ndarray, np.ndarray]], path: Path) -> Path | None:
  """Density of latent weights w / s (grid units) per arm, from (edges, counts); the E2M1
  decision thresholds, where oscillating weights pile up, are marked. Right: |w / s| <= 2."""
  hists = {a: (np.asarray(e, np.float64), np.asarray(c, np.float64)) for a, (e, c) in hists.items()
           if np.asarray(c).sum() > 0}
  if not hists:
    return None
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
  for arm, (edges, counts) in hists.items():
    density = counts / counts.sum() / np.diff(edges)
    for ax in axes:
      ax.stairs(density, edges, label=arm)
  for ax, limit in zip(axes, (6.5, 2.0)):
    for t in E2M1_THRESHOLDS:
      if t <= limit:
        for x in (-t, t):
          ax.axvline(x, color="grey", lw=0.5, ls=":")
    ax.set_xlim(-limit, limit)
    ax.set_xlabel("latent weight w / s (E2M1 grid units)")
    ax.set_ylabel("density")
    ax.grid(alpha=0.3)
  axes[0].set_title("FP4 latent weights at the end of training (dotted: rounding thresholds)")
  axes[1].set_title("the same, |w / s| <= 2")
  axes[0].legend(fontsize=8)
  return _save(fig, path)


def _from_first_window(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Drops the zeros before the first window: the metrics read 0 until the first window ends,
  which means "not measured yet", and drawing them as a measured 0 would
  suggest a jump when the first window closes."""
  nz = np.flatnonzero(values)
  return (steps[nz[0]:], values[nz[0]:]) if nz.size else (steps[:0], values[:0])


def _layer_series(records: list[dict], prefix: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Per-layer curves logged as ``<prefix>/<layer path>``. The trainer records those only when
  they change (`MetricsWriter`'s changes_only), so each curve holds its last value up to the
  last step the aggregate ``<prefix>`` was recorded at."""
  names = sorted({k[len(prefix) + 1:] for r in records for k in r if k.startswith(prefix + "/")})
  end = series(records, prefix)[0]
  out = {}
  for n in names:
    s, v = series(records, f"{prefix}/{n}")
    if s.size and end.size and end.max() > s[-1]:
      s, v = np.append(s, end.max()), np.append(v, v[-1])
    out[n] = _from_first_window(s, v)
  return out


def plot_oscillation(runs: dict[str, list[dict]], path: Path, phases: dict[str, dict] | None = None) -> Path | None:
  """Left: per arm, the share of FP4 weights that keep flipping between two
  FP4 values (flip ratio R >= tau over a watch window). Right: the same share
  per layer for the arm with the most of them, so a reader sees which layers
  oscillate; where no per-layer curves were logged, the share of weights
  OsciReset reset."""
  have = {a: r for a, r in runs.items() if series(r, "osci/risk_frac")[0].size}
  if not have:
    return None
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
  last_step = max(series(r, "osci/risk_frac")[0].max() for r in have.values())
  for arm, recs in have.items():
    s, v = _from_first_window(*series(recs, "osci/risk_frac"))
    axes[0].step(s, v, where="post", label=arm)
  axes[0].set_title("Weights flipping back and forth between two FP4 values")
  worst = max(have, key=lambda a: float(np.nanmax(series(have[a], "osci/risk_frac")[1])))
  layers = _layer_series(have[worst], "osci/risk_frac")
  if layers:
    for name, (s, v) in layers.items():
      axes[1].step(s, v, where="post", lw=0.9, label=name)
    axes[1].set_title(f"The same, layer by layer ({worst})")
  else:
    for arm, recs in have.items():
      s, v = _from_first_window(*series(recs, "osci/reset_frac"))
      if s.size:
        axes[1].step(s, v, where="post", label=arm)
    axes[1].set_title("Weights OsciReset snapped back to their FP4 value")
  for ax in axes:
    mark_phases(ax, {a: p for a, p in (phases or {}).items() if "osci_reset" in p}, last_step)
    ax.set_xlabel("step")
    ax.set_ylabel("share of FP4 weights")
    ax.grid(alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=7, ncol=2 if len(ax.lines) > 8 else 1)
  return _save(fig, path)


def plot_all(results_dir: Path, arms: list[str] | None = None) -> list[Path]:
  runs = load_runs(results_dir, arms)
  phases = load_phases(results_dir, list(runs))
  out = [plot_loss(runs, Path(results_dir) / "loss.png", phases=phases)]
  osc = plot_oscillation(runs, Path(results_dir) / "oscillation.png", phases=phases)
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
