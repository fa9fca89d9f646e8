"""The metrics file: per-layer OsciReset figures recorded only when they change, the archived
(xz) form a results folder commits, and readers that see the same values either way."""

from __future__ import annotations

import json
import lzma
import math

import numpy as np

from experiments import plots
from tetrajet_jax.optim import is_layer_metric
from tetrajet_jax.train.metrics import ARCHIVED_METRICS_FILE, METRICS_FILE, MetricsWriter, find_metrics, read_jsonl

LAYER = "osci/risk_frac/layers_0/mlp/down/kernel"


def _dense(step: int) -> dict[str, float]:
  """What a train step returns: the aggregate every step, a per-layer figure that changes at
  steps 20 and 30, and one that is NaN from step 25 on."""
  return {"train/loss": 5.0 - 0.01 * step, "osci/risk_frac": 0.001 * step,
          LAYER: 0.0 if step < 20 else (0.02 if step < 30 else 0.05),
          "osci/reset_frac/layers_0/attn/qkv/kernel": math.nan if step >= 25 else 0.0}


def test_layer_figures_are_recorded_when_they_change(tmp_path):
  assert is_layer_metric(LAYER) and not is_layer_metric("osci/risk_frac") and not is_layer_metric("train/loss")
  w = MetricsWriter(tmp_path, tensorboard=False, changes_only=is_layer_metric)
  for step in range(40):
    w.write(step, _dense(step))
  w.close()
  recs = read_jsonl(tmp_path / METRICS_FILE)
  assert [r["step"] for r in recs] == list(range(40))
  assert all("train/loss" in r and "osci/risk_frac" in r for r in recs)  # aggregates: every step
  assert [r["step"] for r in recs if LAYER in r] == [0, 20, 30]
  assert [r["step"] for r in recs if "osci/reset_frac/layers_0/attn/qkv/kernel" in r] == [0, 25]  # NaN once
  # Holding each recorded value until the next record gives back every step's value.
  held, value = [], None
  for r in recs:
    value = r.get(LAYER, value)
    held.append(value)
  assert held == [_dense(s)[LAYER] for s in range(40)]


def test_archived_metrics_read_the_same_and_the_plot_holds_layer_values(tmp_path):
  live, archived = tmp_path / "live" / "tetrajet_v2_oscireset", tmp_path / "archived" / "tetrajet_v2_oscireset"
  w = MetricsWriter(live, tensorboard=False, changes_only=is_layer_metric)
  for step in range(40):
    w.write(step, _dense(step))
  w.close()
  archived.mkdir(parents=True)
  (archived / ARCHIVED_METRICS_FILE).write_bytes(lzma.compress((live / METRICS_FILE).read_bytes()))
  assert find_metrics(live) == live / METRICS_FILE and find_metrics(archived) == archived / ARCHIVED_METRICS_FILE
  assert find_metrics(tmp_path) is None
  assert json.dumps(read_jsonl(find_metrics(archived))) == json.dumps(read_jsonl(find_metrics(live)))
  s, v = plots._layer_series(plots.load_runs(tmp_path / "archived")["tetrajet_v2_oscireset"],
                             "osci/risk_frac")["layers_0/mlp/down/kernel"]
  # From the first nonzero record (step 20) to the last step recorded (39), held.
  np.testing.assert_array_equal(s, [20, 30, 39])
  np.testing.assert_array_equal(v, [0.02, 0.05, 0.05])
