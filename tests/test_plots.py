"""Plots mark the method's phases and draw the oscillation panels from real metrics files."""

from __future__ import annotations

import json

import matplotlib
import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np

from experiments import plots


def _write_run(root, arm, *, derived, layers=("layers_0/attn/qkv", "layers_0/mlp/down")):
  d = root / arm
  d.mkdir(parents=True)
  (d / "config.json").write_text(json.dumps({"derived": derived}))
  with (d / "metrics.jsonl").open("w") as f:
    for step in range(1, 41):
      rec = {"step": step, "train/loss": 5.0 - 0.05 * step}
      if "osci_reset" in derived:
        rec["osci/risk_frac"] = 0.0 if step < 20 else 0.01 * step
        rec["osci/reset_frac"] = 0.0 if step < 25 else 0.002
        for i, name in enumerate(layers):
          rec[f"osci/risk_frac/{name}"] = 0.0 if step < 20 else 0.01 * (i + 1)
      f.write(json.dumps(rec) + "\n")


def test_phases_are_shaded_where_the_config_puts_them(tmp_path):
  osci = {"start_step": 20, "period": 8, "window": 3}
  _write_run(tmp_path, "bf16", derived={})
  _write_run(tmp_path, "tetrajet_v2_full",
             derived={"outcontrol_calibration": {"start": 2, "length": 4}, "osci_reset": osci})
  phases = plots.load_phases(tmp_path, ["bf16", "tetrajet_v2_full"])
  assert phases["bf16"] == {}
  fig, ax = plt.subplots()
  plots.mark_phases(ax, phases, last_step=40)
  xs = sorted((float(p.get_x()), float(p.get_x() + p.get_width())) for p in ax.patches)
  # calibration [2, 6); windows at 20, 28, 36 of length 3; resets one update after each window
  assert xs == [(2.0, 6.0), (20.0, 23.0), (28.0, 31.0), (36.0, 39.0)]
  assert sorted(float(l.get_xdata()[0]) for l in ax.lines) == [24.0, 32.0, 40.0]
  labels = {t.get_label() for t in [*ax.patches, *ax.lines] if not str(t.get_label()).startswith("_")}
  assert labels == {"OutControl picks outlier channels", "OsciReset watches flips", "OsciReset resets"}
  plt.close(fig)


def test_plot_all_writes_both_figures_with_per_layer_panel(tmp_path):
  _write_run(tmp_path, "tetrajet_v2_oscireset", derived={"osci_reset": {"start_step": 20, "period": 8,
                                                                         "window": 3}})
  paths = plots.plot_all(tmp_path)
  assert [p.name for p in paths] == ["loss.png", "oscillation.png"]
  for p in paths:
    assert matplotlib.image.imread(p).ndim == 3
  layers = plots._layer_series(plots.load_runs(tmp_path)["tetrajet_v2_oscireset"], "osci/risk_frac")
  assert sorted(layers) == ["layers_0/attn/qkv", "layers_0/mlp/down"]
  s, v = layers["layers_0/mlp/down"]
  assert s[0] == 20 and np.all(v == 0.02)  # leading "not measured yet" zeros dropped


def _records(final_loss, rebound=0.0, steps=60):
  t = np.arange(steps)
  loss = final_loss + np.exp(-t / 10) + rebound * (t > 50)
  return [{"step": int(i), "train/loss": float(v)} for i, v in zip(t, loss)]


def test_loss_bands_draw_mean_and_seed_range(tmp_path):
  runs = {"bf16": [_records(3.0), _records(3.1), _records(2.9)], "tetrajet_v2": [_records(3.2, 0.1)]}
  path = plots.plot_loss_bands(runs, tmp_path / "bands.png")
  img = matplotlib.image.imread(path)
  assert img.shape[0] > 100 and img.std() > 0.01  # a drawn figure, not a blank canvas
  assert plots.plot_loss_bands({"bf16": [[]]}, tmp_path / "none.png") is None
  assert not (tmp_path / "none.png").exists()


def test_latent_histograms_density_and_empty(tmp_path, monkeypatch):
  edges = np.linspace(-6.5, 6.5, 53)
  counts = np.zeros(52)
  counts[[20, 31]] = [300, 100]
  drawn = {}
  real_stairs = matplotlib.axes.Axes.stairs

  def spy(ax, values, edges_, **kw):  # the drawn density must integrate to 1
    drawn.setdefault(kw.get("label"), []).append(float(np.sum(np.asarray(values) * np.diff(edges_))))
    return real_stairs(ax, values, edges_, **kw)

  monkeypatch.setattr(matplotlib.axes.Axes, "stairs", spy)
  path = plots.plot_latent_histograms({"tetrajet_v2": (edges, counts)}, tmp_path / "latent.png")
  assert path.is_file() and drawn["tetrajet_v2"] == [1.0, 1.0]
  assert plots.plot_latent_histograms({"x": (edges, np.zeros(52))}, tmp_path / "empty.png") is None

