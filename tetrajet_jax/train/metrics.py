"""Metric sinks (JSONL + TensorBoard) and a throughput meter.

The train step returns a dict of slash-namespaced device scalars
(``train/loss``, ``osci/reset_fraction``, ...). The trainer hands the dict
of step ``s`` to `MetricsWriter.write` only after dispatching step ``s + 1``,
so the host never stalls the device waiting on the newest step.
"""

from __future__ import annotations

import json
import lzma
import math
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

METRICS_FILE = "metrics.jsonl"
# The archived form a results folder commits (xz-compressed JSONL: a 300M-token arm's
# per-step records are about 4 MB as text, 0.75 MB compressed).
ARCHIVED_METRICS_FILE = METRICS_FILE + ".xz"

# Dense bf16 peak FLOP/s per chip, for the MFU-style ratio. Devices not listed
# report FLOP/s only.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "B200": 2250e12}


def peak_flops(device: jax.Device | None = None) -> float | None:
  kind = (device or jax.devices()[0]).device_kind
  for name, flops in PEAK_BF16_FLOPS.items():
    if name in kind:
      return flops
  return None


def to_host(metrics: dict[str, Any]) -> dict[str, float]:
  """Device scalars -> Python floats (blocks on those arrays only)."""
  return {k: float(np.asarray(v)) for k, v in jax.device_get(metrics).items()}


class MetricsWriter:
  """Appends ``{"step": s, name: value, ...}`` lines to a JSONL file and the
  same scalars to TensorBoard event files (tensorboardX).

  Non-finite values are written as JSON ``null`` so the file stays valid JSON
  per line (and a NaN loss is visible in the record that stopped the run).

  changes_only(key) -> True marks keys written only when their value differs
  from the last one written (piecewise-constant per-layer figures, such as
  OsciReset's per-layer fractions, which change once per window: written every
  step they would be most of a long run's file). A reader takes such a key's
  value as holding until its next record.
  """

  def __init__(self, directory: str | Path, *, tensorboard: bool = True,
               changes_only: Callable[[str], bool] | None = None):
    self.directory = Path(directory)
    self.directory.mkdir(parents=True, exist_ok=True)
    self.path = self.directory / METRICS_FILE
    self._changes_only = changes_only
    self._last: dict[str, float] = {}  # last written value of each changes-only key
    self._file = open(self.path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel

      self._tb = SummaryWriter(str(self.directory / "tb"))

  def write(self, step: int, metrics: dict[str, float]) -> None:
    record = {"step": int(step)}
    for k, v in metrics.items():
      v = float(v)
      if self._changes_only is not None and self._changes_only(k):
        if k in self._last and (self._last[k] == v or (math.isnan(v) and math.isnan(self._last[k]))):
          continue
        self._last[k] = v
      record[k] = v if math.isfinite(v) else None
      if self._tb is not None and math.isfinite(v):
        self._tb.add_scalar(k, v, int(step))
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()

  def close(self) -> None:
    self._file.close()
    if self._tb is not None:
      self._tb.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
  """All records of a metrics file, plain or xz-compressed (``.xz``); ``null`` reads back as NaN."""
  out = []
  opener = lzma.open if Path(path).suffix == ".xz" else open
  with opener(path, "rt", encoding="utf-8") as f:
    for line in f:
      if line.strip():
        out.append({k: (math.nan if v is None else v) for k, v in json.loads(line).items()})
  return out


def find_metrics(directory: str | Path) -> Path | None:
  """A run folder's metrics file: the live ``metrics.jsonl``, else its archived ``.xz`` form."""
  for name in (METRICS_FILE, ARCHIVED_METRICS_FILE):
    if (Path(directory) / name).is_file():
      return Path(directory) / name
  return None


def truncate_jsonl(path: str | Path, *, after_step: int) -> None:
  """Drops records with ``step >= after_step`` (a resumed run rewrites them)."""
  path = Path(path)
  if not path.is_file():
    return
  keep = [line for line in path.read_text(encoding="utf-8").splitlines()
          if line.strip() and json.loads(line)["step"] < after_step]
  path.write_text("".join(line + "\n" for line in keep), encoding="utf-8")


class Throughput:
  """Tokens/s and model FLOP/s over the steps since the last `reset`.

  The trainer resets it after anything that is not a train step (compilation,
  validation, checkpoint waits), so the rate reflects steady-state steps.
  """

  def __init__(self, *, tokens_per_step: int, flops_per_token: float, peak: float | None):
    self.tokens_per_step = tokens_per_step
    self.flops_per_token = flops_per_token
    self.peak = peak
    self.reset()

  def reset(self) -> None:
    self._t0 = None
    self._steps = 0

  def tick(self) -> dict[str, float]:
    """Called when a step's metrics are read (i.e. the step has finished)."""
    now = time.perf_counter()
    if self._t0 is None:
      self._t0 = now  # the first finished step starts the clock
      return {}
    self._steps += 1
    dt = now - self._t0
    tok_s = self._steps * self.tokens_per_step / dt
    out = {"perf/tokens_per_s": tok_s, "perf/model_tflops_per_s": tok_s * self.flops_per_token / 1e12,
           "perf/step_time_s": dt / self._steps}
    if self.peak:
      out["perf/mfu"] = tok_s * self.flops_per_token / self.peak
    return out
