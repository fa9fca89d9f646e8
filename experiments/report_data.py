"""The report's data: result folders as loaded from disk, and the figures
derived from them (seed noise, loss verdicts, late-training rebounds)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from experiments import plots
from experiments.tables import LATENT_HISTOGRAM
from tetrajet_jax.train.arms import ARMS
from tetrajet_jax.train.metrics import find_metrics, read_jsonl

REPO_ROOT = Path(__file__).resolve().parents[1]

# Arms the reference folder should hold, and the arms repeated with another seed.
ABLATION_ARMS = tuple(ARMS)
SEED_NOISE_ARMS = ("bf16", "tetrajet_v2_full")
# A difference counts as resolved when it exceeds this many seed-to-seed
# differences (one pair of seeds: a rough margin, not a significance test).
NOISE_MARGIN = 2.0


def _read_json(path: Path) -> Any | None:
  return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


@dataclasses.dataclass(frozen=True)
class ArmRun:
  """The raw files of one arm (any of them may be missing)."""

  name: str
  config: dict | None = None
  final: dict | None = None
  records: list[dict] = dataclasses.field(default_factory=list)
  latent_histogram: dict | None = None  # {"step", "edges", "counts"} at the end of training

  @property
  def status(self) -> str:
    if self.final is not None:
      return self.final.get("status", "?")
    return "unfinished" if self.config is not None or self.records else "missing"

  @property
  def completed(self) -> bool:
    return self.status == "completed"

  def val(self, key: str) -> float | None:
    return self.final["val"][key] if self.completed else None

  @property
  def tokens_per_s(self) -> float | None:
    return self.final.get("tokens_per_s") if self.completed else None

  @property
  def downstream(self) -> dict[str, dict]:
    return self.final.get("downstream", {}) if self.completed else {}

  @property
  def train(self) -> dict:
    return (self.config or {}).get("train", {})

  @property
  def derived(self) -> dict:
    return (self.config or {}).get("derived", {})


@dataclasses.dataclass(frozen=True)
class RunFolder:
  """One results folder: shared settings, arms, device provenance."""

  path: Path
  expected_arms: tuple[str, ...]
  run: dict | None
  arms: dict[str, ArmRun]
  provenance: list[dict] | None
  # tokens/s of each arm trained alone on the GPU (the device script's probe),
  # when the arms themselves were trained side by side.
  throughput_alone: dict | None = None

  @property
  def shared_gpu(self) -> bool:
    """Whether a device run of this folder trained several arms side by side on one GPU."""
    return any(int(r.get("concurrent_processes", 1)) > 1 for r in self.provenance or [])

  def _finishing_run(self, arm: str) -> dict:
    """The first recorded device run that finished ``arm`` (provenance ``finished_arms``), or {}."""
    return next((rec for rec in self.provenance or [] if arm in rec.get("finished_arms", ())), {})

  def trained_at(self, arm: str) -> str | None:
    """Commit of the device run that finished ``arm``."""
    return self._finishing_run(arm).get("commit")

  def trained_on(self, arm: str) -> str | None:
    """GPU of the device run that finished ``arm`` (e.g. "NVIDIA H100 80GB HBM3")."""
    return self._finishing_run(arm).get("device")

  def speed_ratio(self, arm: str, baseline: str = "bf16", baseline_folder: RunFolder | None = None) -> float | None:
    """`speed` of ``arm`` over ``baseline``'s (in ``baseline_folder``, by default this one), only
    when both trained on the same GPU model (arms may finish on different hosts: an H100's
    ratio against an H200's baseline would measure the hosts, not the arms)."""
    other = baseline_folder or self
    speed, base = self.speed(arm), other.speed(baseline)
    if not speed or not base or self.trained_on(arm) != other.trained_on(baseline):
      return None
    return speed / base

  def speed(self, arm: str) -> float | None:
    """tokens/s that measure the arm's speed: final.json's median over the whole run
    when no arm shared the GPU with it, else the short probe alone on the GPU
    (throughput_alone.json), else None. The whole run comes first because a probe
    of a few dozen steps sees only an OutControl arm's first, pure-FP4 phase."""
    if not self.shared_gpu and self.arm(arm).tokens_per_s:
      return self.arm(arm).tokens_per_s
    return (self.throughput_alone or {}).get(arm, {}).get("tokens_per_s")

  @property
  def exists(self) -> bool:
    return self.path.is_dir()

  @property
  def seed(self) -> int | None:
    return (self.run or {}).get("train", {}).get("seed")

  @property
  def data_seed(self) -> int | None:
    return (self.run or {}).get("train", {}).get("data_seed")

  @property
  def label(self) -> str:
    return f"seed {self.seed}" if self.seed is not None else self.path.name

  def arm(self, name: str) -> ArmRun:
    return self.arms.get(name, ArmRun(name))

  @property
  def missing_arms(self) -> list[str]:
    return [a for a in self.expected_arms if not self.arm(a).completed]

  @property
  def listed_arms(self) -> list[str]:
    """Expected arms and any others present, in the runner's arm order."""
    names = set(self.expected_arms) | set(self.arms)
    return sorted(names, key=lambda a: (list(ARMS).index(a) if a in ARMS else len(ARMS), a))


def load_folder(path: Path, expected_arms: tuple[str, ...]) -> RunFolder:
  arms = {}
  if path.is_dir():
    for d in sorted(p for p in path.iterdir() if p.is_dir()):
      config, final, metrics = d / "config.json", d / "final.json", find_metrics(d)
      if config.is_file() or final.is_file() or metrics is not None:
        arms[d.name] = ArmRun(d.name, config=_read_json(config), final=_read_json(final),
                              records=read_jsonl(metrics) if metrics is not None else [],
                              latent_histogram=_read_json(d / LATENT_HISTOGRAM))
  throughput_alone = _read_json(path / "throughput_alone.json")
  provenance = _read_json(path / "provenance.json")
  if isinstance(provenance, dict):
    provenance = [provenance]
  return RunFolder(path=path, expected_arms=expected_arms, run=_read_json(path / "run.json"), arms=arms,
                   provenance=provenance, throughput_alone=throughput_alone)


def requested_arms(provenance: list[dict]) -> set[str]:
  """Arms named by ``--arms`` in the folder's device commands."""
  arms = set()
  for entry in provenance:
    words = str(entry.get("command", "")).split()
    for flag, value in zip(words, words[1:]):
      if flag == "--arms":
        arms.update(a for a in value.split(",") if a)
  return arms


def load_folders(paths: list[Path]) -> list[RunFolder]:
  """The first folder is the reference (all ablation arms); each other one
  expects the seed-noise arms and every arm its device commands asked for."""
  folders = []
  for i, path in enumerate(paths):
    folder = load_folder(path, ABLATION_ARMS)
    if i > 0:
      wanted = set(SEED_NOISE_ARMS) | requested_arms(folder.provenance or [])
      folder = dataclasses.replace(folder, expected_arms=tuple(a for a in ABLATION_ARMS if a in wanted))
    folders.append(folder)
  return folders


# ---- numbers ---------------------------------------------------------------------------------

def loss_delta(folder: RunFolder, arm: str, baseline: str) -> float | None:
  a, b = folder.arm(arm).val("loss"), folder.arm(baseline).val("loss")
  return None if a is None or b is None else a - b


@dataclasses.dataclass(frozen=True)
class SeedDifference:
  """One arm trained with two seeds: other seed minus reference seed."""

  arm: str
  reference: RunFolder
  other: RunFolder

  @property
  def loss(self) -> float:
    return self.other.arm(self.arm).val("loss") - self.reference.arm(self.arm).val("loss")

  @property
  def ppl(self) -> float:
    return self.other.arm(self.arm).val("ppl") - self.reference.arm(self.arm).val("ppl")


@dataclasses.dataclass(frozen=True)
class SeedNoise:
  """The seed-to-seed differences and the noise figure the Discussion uses (their largest |value|)."""

  differences: list[SeedDifference]
  notes: list[str]

  @property
  def loss(self) -> float | None:
    return max((abs(d.loss) for d in self.differences), default=None)

  @property
  def ppl(self) -> float | None:
    return max((abs(d.ppl) for d in self.differences), default=None)


def seed_noise(folders: list[RunFolder]) -> SeedNoise:
  reference, diffs, notes = folders[0], [], []
  if len(folders) < 2:
    notes.append("no second results folder given: no seed-noise figure.")
  for other in folders[1:]:
    if not other.exists:
      notes.append(f"`{display(other.path)}` not found: seed noise from it is n/a.")
      continue
    if other.seed is not None and other.seed == reference.seed:
      notes.append(f"`{display(other.path)}` has the same seed as the reference ({other.seed}): not a seed "
                   "difference, left out.")
      continue
    for arm in SEED_NOISE_ARMS:
      if reference.arm(arm).completed and other.arm(arm).completed:
        diffs.append(SeedDifference(arm, reference, other))
      else:
        notes.append(f"{arm}: not completed in both {reference.label} and {other.label}: n/a.")
  return SeedNoise(diffs, notes)


def in_units(value: float | None, unit: float | None) -> str:
  """``value`` in units of ``unit`` (e.g. a loss difference in seed-to-seed differences)."""
  if value is None or unit is None or unit == 0:
    return "n/a"
  return f"{value / unit:+.1f}x"


def loss_verdict(delta: float | None, noise: float | None) -> str:
  """The rule for "the arm has a lower validation loss than its baseline" (delta = arm - baseline)."""
  if delta is None:
    return "n/a (arm missing)"
  if noise is None:
    direction = "points that way" if delta < 0 else "points the other way"
    return f"{direction} in one seed; no seed-noise figure to judge it"
  if abs(delta) <= NOISE_MARGIN * noise:
    return f"not resolved at this scale (|Δloss| within {NOISE_MARGIN:g}x the seed-to-seed difference)"
  return "holds at this scale" if delta < 0 else "does not hold at this scale (the reverse is resolved)"


@dataclasses.dataclass(frozen=True)
class Rebound:
  """Late-training rebound of the smoothed training loss (over the last third)."""

  min_step: float
  min_loss: float
  final_loss: float
  smoothing_error: float  # std of raw loss around the smoothed curve / sqrt(window)

  @property
  def rebound(self) -> float:
    return self.final_loss - self.min_loss


def late_rebound(records: list[dict]) -> Rebound | None:
  steps, raw, smoothed, window = plots.smoothed_train_loss(records)
  if steps.size == 0:
    return None
  late = steps >= steps.max() * plots.LATE_START
  if late.sum() < 2:
    return None
  i = int(np.argmin(np.where(late, smoothed, np.inf)))
  error = float(np.std(raw[late] - smoothed[late]) / math.sqrt(window))
  return Rebound(min_step=float(steps[i]), min_loss=float(smoothed[i]), final_loss=float(smoothed[-1]),
                 smoothing_error=error)


def rebound_verdict(without: Rebound | None, with_reset: Rebound | None) -> str:
  """The rule for "without OsciReset the loss rebounds late, and OsciReset removes it"."""
  if without is None or with_reset is None:
    return "n/a (arm or training loss missing)"
  if without.rebound <= NOISE_MARGIN * without.smoothing_error:
    return (f"not observed at this scale (rebound within {NOISE_MARGIN:g}x the smoothed curve's own noise)")
  combined = math.hypot(without.smoothing_error, with_reset.smoothing_error)
  if without.rebound - with_reset.rebound > NOISE_MARGIN * combined:
    return "holds at this scale (one seed)"
  return (f"a rebound is seen without OsciReset, but OsciReset's is not smaller by more than "
          f"{NOISE_MARGIN:g}x the curves' noise: not resolved")


def late_mean(records: list[dict], key: str) -> float | None:
  """Time average of a metric over the last third of training."""
  s, v = plots.series(records, key)
  if s.size == 0:
    return None
  return float(v[s >= s.max() * plots.LATE_START].mean())


# ---- markdown --------------------------------------------------------------------------------


def display(path: Path) -> str:
  """A path as written in the page: relative to the repository when inside it."""
  try:
    return Path(path).resolve().relative_to(REPO_ROOT).as_posix()
  except ValueError:
    return str(path)


def speed_ratio_on_its_gpu(folders: list[RunFolder], folder: RunFolder, arm: str,
                           baseline: str = "bf16") -> tuple[float | None, RunFolder | None]:
  """`arm`'s speed over ``baseline``'s trained on the same GPU model, and the folder of that
  baseline: ``folder``'s own, else the first other folder (seed) whose baseline trained there
  (the model and step are the same; the seed changes only the numbers drawn). (None, None) if none."""
  for other in [folder] + [f for f in folders if f is not folder]:
    if (ratio := folder.speed_ratio(arm, baseline, baseline_folder=other)) is not None:
      return ratio, other
  return None, None


def downstream_tasks(folders: list[RunFolder]) -> list[str]:
  """Downstream tasks in the order the runner wrote them, over all folders."""
  tasks: list[str] = []
  for folder in folders:
    for arm in folder.arms.values():
      tasks += [t for t in arm.downstream if t not in tasks]
  return tasks


def downstream_num_docs(arms: list[ArmRun]) -> list[int]:
  return [task["num_docs"] for arm in arms for task in arm.downstream.values()]


def accuracy_standard_error(num_docs: int) -> float:
  """Binomial standard error of one task's accuracy at its worst (p = 0.5)."""
  return math.sqrt(0.25 / num_docs)
