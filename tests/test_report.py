"""experiments/report.py on synthetic results folders written in the runner's format.

The folders hold known perplexities, so gap closure, seed differences and the
Discussion's verdicts are computed here independently and looked up in the
page; missing arms and a missing seed folder must give n/a, not a crash.
"""

from __future__ import annotations

import dataclasses
import json
import math

import matplotlib.image
import numpy as np
import pytest

from experiments import report
from tetrajet_jax.model.configs import get_config
from tetrajet_jax.train.arms import ARMS
from tetrajet_jax.train.trainer import TrainConfig

STEPS = 300
BATCH, SEQ = 8, 128
PPL = {  # final validation perplexity per (arm, seed)
    ("bf16", 0): 30.0, ("nvidia_nvfp4", 0): 34.0, ("tetrajet_v2", 0): 33.0,
    ("tetrajet_v2_outcontrol", 0): 32.5, ("tetrajet_v2_oscireset", 0): 32.0, ("tetrajet_v2_full", 0): 31.0,
    ("bf16", 1): 30.3, ("tetrajet_v2_full", 1): 31.2,
}
PPL_THREE_SEEDS = {  # PPL, plus seed 1's other arms and seed 2: the "Across seeds" section's test
    **PPL, ("nvidia_nvfp4", 1): 34.1, ("tetrajet_v2", 1): 33.2, ("tetrajet_v2_outcontrol", 1): 33.4,
    ("tetrajet_v2_oscireset", 1): 32.3,
    ("bf16", 2): 30.1, ("nvidia_nvfp4", 2): 34.2, ("tetrajet_v2", 2): 32.9, ("tetrajet_v2_outcontrol", 2): 32.8,
    ("tetrajet_v2_oscireset", 2): 31.9, ("tetrajet_v2_full", 2): 31.1,
}
TOKENS_PER_S = {"bf16": 1000.0}  # the FP4 arms: 800
REBOUND_ARM = "tetrajet_v2"  # its training loss climbs over the last 10% of the steps
TASKS = {"arc_easy": 0.25, "piqa": 0.5}  # task -> chance


def _write_json(path, obj):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def _metrics(arm: str, seed: int, val_loss: float) -> list[dict]:
  """Per-step records like the trainer's, plus periodic validation records."""
  rng = np.random.default_rng(list(ARMS).index(arm) * 10 + seed)
  t = np.arange(STEPS)
  loss = val_loss + 2.0 * np.exp(-t / 30) + rng.normal(0, 0.01, STEPS)
  if arm == REBOUND_ARM:
    loss += 0.1 * np.clip((t - 0.9 * STEPS) / (0.1 * STEPS), 0, None)
  records = []
  for step in range(STEPS):
    rec = {"step": step, "train/loss": float(loss[step]), "train/lr": 1e-3}
    if ARMS[arm].quantized:
      late = step >= STEPS * 0.7
      rec["osci/risk_frac"] = (0.002 if ARMS[arm].oscireset else 0.02) if late else 0.0
      if ARMS[arm].oscireset:
        rec["osci/reset_frac"] = 0.002 if late else 0.0
        rec["osci/window_risk_frac"] = 0.0
    if step >= 2:
      rec["perf/tokens_per_s"] = TOKENS_PER_S.get(arm, 800.0)
    records.append(rec)
    if (step + 1) % 100 == 0:
      records.append({"step": step, "val/loss": val_loss + 0.01, "val/ppl": math.exp(val_loss + 0.01),
                      "val/bits_per_byte": 1.0})
  return records


def write_folder(root, seed: int, arms: list[str], provenance=None):
  """A results folder as experiments/ablation.py and the trainer write it (checkpoints and tb/ left out)."""
  model = dataclasses.replace(get_config("20m"), vocab_size=16384)
  for arm in arms:
    config = TrainConfig(model="20m", arm=arm, batch_size=BATCH, seq_len=SEQ, total_steps=STEPS, seed=seed,
                         eval_every=100, osci_period=40, osci_window=10)
    identity = config.run_identity()
    identity.pop("arm")
    _write_json(root / "run.json", {"train": identity, "data": "bpe16384"})
    derived = {"tokens_per_step": config.tokens_per_step, "total_tokens": config.tokens_per_step * STEPS,
               "param_counts": model.param_counts(), "bf16_blocks": [], "mesh": {"data": 1, "fsdp": 1},
               "processes": 1}
    if ARMS[arm].oscireset:
      derived["osci_reset"] = dataclasses.asdict(config.osci_windows)
    if ARMS[arm].outcontrol:
      derived["outcontrol_calibration"] = dataclasses.asdict(config.calibration)
    _write_json(root / arm / "config.json", {"train": dataclasses.asdict(config), "model": dataclasses.asdict(model),
                                             "data": "bpe16384", "derived": derived})
    loss = math.log(PPL_THREE_SEEDS[arm, seed])
    with open(root / arm / "metrics.jsonl", "w", encoding="utf-8") as f:
      for rec in _metrics(arm, seed, loss):
        f.write(json.dumps(rec) + "\n")
    downstream = {t: {"task": t, "metric": "acc", "accuracy": chance + 0.1, "acc": chance + 0.1,
                      "acc_norm": chance, "chance": chance, "num_docs": 500} for t, chance in TASKS.items()}
    _write_json(root / arm / "final.json", {
        "arm": arm, "status": "completed", "steps": STEPS, "tokens": STEPS * BATCH * SEQ,
        "val": {"loss": loss, "ppl": PPL_THREE_SEEDS[arm, seed], "bits_per_byte": loss / math.log(2) / 4,
                "tokens": 65536.0, "bytes": 262144.0},
        "downstream": downstream, "tokens_per_s": TOKENS_PER_S.get(arm, 800.0),
        "model_tflops_per_s": 1.0, "wall_s_this_session": 100.0})
    if ARMS[arm].quantized and not ARMS[arm].outcontrol:  # as the runner writes it
      edges = np.linspace(-6.5, 6.5, 27)
      counts = np.full(26, 10 + 5 * seed)
      if not ARMS[arm].oscireset:
        counts[[8, 17]] += 100  # weights piled up at a rounding threshold
      _write_json(root / arm / "latent_histogram.json",
                  {"step": STEPS, "edges": edges.tolist(), "counts": counts.tolist()})
  if provenance is not None:
    _write_json(root / "provenance.json", provenance)
  return root


@pytest.fixture
def folders(tmp_path):
  seed0 = write_folder(tmp_path / "seed0", 0, list(ARMS), provenance={
      "commit": "abc1234", "device": "NVIDIA H200", "command": "python -m experiments.ablation --seed 0",
      "wall_s": 3600.0, "date": "2026-01-01"})
  seed1 = write_folder(tmp_path / "seed1", 1, ["bf16", "tetrajet_v2_full"], provenance=[
      {"commit": "def5678", "device": "NVIDIA H200", "command": "python -m experiments.ablation --arms bf16 --seed 1",
       "wall_s": 900.0, "date": "2026-01-02", "finished_arms": ["bf16"]},
      {"commit": "fed8765", "device": "NVIDIA H200", "command": "python -m experiments.ablation --seed 1 --resume",
       "wall_s": 950.0, "date": "2026-01-03", "finished_arms": ["bf16", "tetrajet_v2_full"]}])
  return seed0, seed1


def run_report(tmp_path, runs) -> str:
  out = tmp_path / "docs" / "RESULTS.md"
  argv = ["--runs", *map(str, runs), "--out", str(out), "--figures", str(tmp_path / "docs" / "results")]
  assert report.main(argv) == 0
  return out.read_text(encoding="utf-8")


def section(text: str, title: str) -> str:
  start = text.index(f"## {title}\n")
  end = text.find("\n## ", start + 1)
  return text[start:] if end < 0 else text[start:end]


def table_rows(text: str) -> list[dict[str, str]]:
  """The first Markdown table of ``text`` as {column: cell} rows."""
  lines = [l for l in text.splitlines() if l.startswith("|")]
  header = [c.strip() for c in lines[0].strip("|").split("|")]
  return [dict(zip(header, (c.strip() for c in l.strip("|").split("|")))) for l in lines[2:]]


def test_numbers_rows_figures_and_provenance(tmp_path, folders):
  text = run_report(tmp_path, folders)
  rows = table_rows(section(text, "Main table"))
  keys = [(r["arm"], r["seed"]) for r in rows]
  assert sorted(keys) == sorted({(a, f"seed {s}") for a, s in PPL}) and len(keys) == len(set(keys)) == len(PPL)
  by_key = {(r["arm"], r["seed"]): r for r in rows}
  for (arm, seed), ppl in PPL.items():
    assert by_key[arm, f"seed {seed}"]["val PPL"] == f"{ppl:.3f}"
  # Gap closure within seed 0, from the known perplexities.
  nvidia, bf16 = PPL["nvidia_nvfp4", 0], PPL["bf16", 0]
  for arm in ("tetrajet_v2", "tetrajet_v2_outcontrol", "tetrajet_v2_oscireset", "tetrajet_v2_full"):
    assert by_key[arm, "seed 0"]["gap closure"] == f"{100 * (nvidia - PPL[arm, 0]) / (nvidia - bf16):.1f}%"
  assert by_key["tetrajet_v2_full", "seed 0"]["gap closure"] == "75.0%"
  assert by_key["tetrajet_v2_full", "seed 1"]["gap closure"] == "n/a"
  assert by_key["tetrajet_v2", "seed 0"]["x bf16 tokens/s"] == "0.80x"
  assert by_key["tetrajet_v2", "seed 0"]["arc_easy acc"] == "0.350 (0.25)"

  # Seed differences, and arm differences in units of the largest one.
  noise_rows = {r["arm"]: r for r in table_rows(section(text, "Seed noise"))}
  d_bf16 = math.log(PPL["bf16", 1]) - math.log(PPL["bf16", 0])
  d_full = math.log(PPL["tetrajet_v2_full", 1]) - math.log(PPL["tetrajet_v2_full", 0])
  assert noise_rows["bf16"]["Δ loss"] == f"{d_bf16:+.4f}"
  assert noise_rows["bf16"]["Δ PPL"] == f"{PPL['bf16', 1] - PPL['bf16', 0]:+.3f}"
  assert noise_rows["tetrajet_v2_full"]["Δ loss"] == f"{d_full:+.4f}"
  noise = max(abs(d_bf16), abs(d_full))
  diffs = section(text, "Seed noise").split("Differences between arms")[1]
  diff_rows = {r["arms"]: r for r in table_rows(diffs)}
  v2_minus_bf16 = math.log(PPL["tetrajet_v2", 0]) - math.log(PPL["bf16", 0])
  assert diff_rows["tetrajet_v2 - bf16"]["Δ loss / seed noise"] == f"{v2_minus_bf16 / noise:+.1f}x"

  # Verdicts follow the rules: 2x the seed noise.
  discussion = section(text, "Discussion")
  v2_minus_nvidia = math.log(PPL["tetrajet_v2", 0]) - math.log(nvidia)
  outcontrol_minus_v2 = math.log(PPL["tetrajet_v2_outcontrol", 0]) - math.log(PPL["tetrajet_v2", 0])
  assert v2_minus_nvidia < -2 * noise and abs(outcontrol_minus_v2) < 2 * noise  # the test's own premise
  assert "**TetraJet-v2 beats NVIDIA's recipe**: holds at this scale" in discussion
  assert "**OutControl lowers the validation loss**: not resolved at this scale" in discussion
  assert "**Without OsciReset the loss rebounds late in training**: holds at this scale" in discussion
  assert "**OsciReset lowers the fraction of oscillating weights**: holds in this run" in discussion
  assert "**Gap closure of the full method vs the paper**: above the paper's average" in discussion
  assert "51.3% on average" in discussion
  assert f"{100 * (26.20 - 25.11) / (26.20 - 23.70):.1f}% at 370M" in discussion

  # Figures: valid PNGs, linked with paths relative to the page.
  for name in ("loss.png", "seeds.png", "oscillation.png"):
    png = tmp_path / "docs" / "results" / name
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert matplotlib.image.imread(png).ndim == 3
    assert f"](results/{name})" in text

  provenance = section(text, "Provenance")
  for commit in ("abc1234", "def5678", "fed8765"):
    assert f"commit `{commit}`" in provenance
  assert f"{STEPS:,} steps x {BATCH * SEQ:,} tokens per step" in provenance
  # Each arm's commit: the first run that finished it; n/a without finished_arms records.
  seed1 = provenance[provenance.index("### seed 1"):]
  assert "| bf16 | completed |" in seed1 and "`def5678` |" in seed1.split("| bf16 |")[1].splitlines()[0]
  assert "`fed8765` |" in seed1.split("| tetrajet_v2_full |")[1].splitlines()[0]
  assert provenance[:provenance.index("### seed 1")].split("| bf16 |")[1].splitlines()[0].endswith("| n/a |")
  assert "GENERATED FILE: do not edit by hand" in text


def test_missing_arm_and_seed_folder_give_na(tmp_path, folders):
  seed0, _ = folders
  for f in (seed0 / "nvidia_nvfp4").iterdir():
    f.unlink()
  (seed0 / "nvidia_nvfp4").rmdir()
  (seed0 / "provenance.json").unlink()
  text = run_report(tmp_path, [seed0, tmp_path / "no_such_seed1"])
  rows = {(r["arm"], r["seed"]): r for r in table_rows(section(text, "Main table"))}
  assert rows["nvidia_nvfp4", "seed 0"]["status"] == "missing"
  assert rows["nvidia_nvfp4", "seed 0"]["val loss"] == "n/a"
  assert rows["tetrajet_v2_full", "seed 0"]["gap closure"] == "n/a"
  assert rows["bf16", "no_such_seed1"]["val loss"] == "n/a"
  assert "Missing: seed 0: nvidia_nvfp4 missing" in text
  assert "`" + str(tmp_path / "no_such_seed1") + "` not found" in text
  assert "not recorded (no provenance.json)" in section(text, "Provenance")
  discussion = section(text, "Discussion")
  assert "**TetraJet-v2 beats NVIDIA's recipe**: n/a" in discussion
  assert "**OutControl lowers the validation loss**: points that way in one seed; no seed-noise figure" in discussion
  assert "![Seed-to-seed loss curves]" not in text


def test_seed_folder_expects_the_arms_its_commands_asked_for(tmp_path, folders):
  """A repeat seed whose device command named more arms than it finished lists
  the rest as missing, in the summary and as rows of the main table."""
  seed0, _ = folders
  seed2 = write_folder(tmp_path / "seed2", 2, ["bf16"], provenance=[
      {"commit": "abc", "device": "NVIDIA H200", "finished_arms": ["bf16"],
       "command": "python -m experiments.ablation --seed 2 --arms bf16,nvidia_nvfp4,tetrajet_v2 --resume"}])
  text = run_report(tmp_path, [seed0, seed2])
  assert "seed 2: nvidia_nvfp4, tetrajet_v2, tetrajet_v2_full missing or not completed" in text
  rows = {(r["arm"], r["seed"]): r for r in table_rows(section(text, "Main table"))}
  assert rows["tetrajet_v2", "seed 2"]["status"] == "missing"
  assert ("tetrajet_v2_oscireset", "seed 2") not in rows


def test_output_is_deterministic(tmp_path, folders):
  assert run_report(tmp_path, folders) == run_report(tmp_path, folders)


def test_whole_run_rate_beats_a_short_probe_when_arms_trained_alone(tmp_path, folders):
  """Arms trained one at a time: final.json's median over the whole run is the
  speed, also where a short probe exists (a probe of a few dozen steps sees only
  an OutControl arm's first phase); the probe fills in an arm without final.json."""
  seed0, seed1 = folders
  _write_json(seed0 / "provenance.json", [{"commit": "abc", "device": "NVIDIA H200", "concurrent_processes": 1}])
  _write_json(seed0 / "throughput_alone.json", {"bf16": {"steps": 30, "tokens_per_s": 5000.0},
                                                "tetrajet_v2": {"steps": 30, "tokens_per_s": 2000.0}})
  rows = {(r["arm"], r["seed"]): r for r in table_rows(section(run_report(tmp_path, [seed0, seed1]), "Main table"))}
  assert rows[("tetrajet_v2", "seed 0")]["tokens/s"] == "800"
  assert rows[("tetrajet_v2", "seed 0")]["x bf16 tokens/s"] == "0.80x"
  assert rows[("nvidia_nvfp4", "seed 0")]["x bf16 tokens/s"] == "0.80x"


def test_speed_ratio_needs_the_baselines_gpu_model(tmp_path, folders):
  """Arms of one folder finished on different GPU models: an arm's ratio is never to a bf16
  of another GPU model (here it falls back to seed 1's H200 bf16), and the settings table
  names each arm's GPU."""
  seed0, seed1 = folders
  _write_json(seed0 / "provenance.json", [
      {"commit": "abc", "device": "NVIDIA H100 80GB HBM3", "concurrent_processes": 1,
       "finished_arms": ["bf16", "nvidia_nvfp4"]},
      {"commit": "def", "device": "NVIDIA H200", "concurrent_processes": 1,
       "finished_arms": ["bf16", "nvidia_nvfp4", "tetrajet_v2"]}])
  text = run_report(tmp_path, [seed0, seed1])
  rows = {(r["arm"], r["seed"]): r for r in table_rows(section(text, "Main table"))}
  assert rows[("nvidia_nvfp4", "seed 0")]["x bf16 tokens/s"] == "0.80x"
  assert rows[("tetrajet_v2", "seed 0")]["tokens/s"] == "800"  # its own speed stays
  assert rows[("tetrajet_v2", "seed 0")]["x bf16 tokens/s"] == "0.80x (bf16 of seed 1)"  # seed 1: H200
  start = text.index("| arm | status")  # seed 0's settings table, up to the blank line after it
  settings = {r["arm"]: r for r in table_rows(text[start:text.index("\n\n", start)])}
  assert settings["tetrajet_v2"]["device"] == "NVIDIA H200"
  assert settings["bf16"]["device"] == "NVIDIA H100 80GB HBM3"


def test_speed_ratio_falls_back_to_another_seeds_bf16_on_the_same_gpu_model(tmp_path, folders):
  """A repeat seed whose bf16 trained on another GPU model than its FP4 arm takes the
  first other seed's bf16 from the arm's GPU model, and names it; with none, n/a."""
  seed0, seed1 = folders
  _write_json(seed0 / "provenance.json", [{"commit": "abc", "device": "NVIDIA H100 80GB HBM3",
                                           "concurrent_processes": 1, "finished_arms": list(ARMS)}])
  _write_json(seed0 / "bf16" / "final.json",
              {**json.loads((seed0 / "bf16" / "final.json").read_text()), "tokens_per_s": 1600.0})
  _write_json(seed1 / "provenance.json", [
      {"commit": "def", "device": "NVIDIA H200", "concurrent_processes": 1, "finished_arms": ["bf16"]},
      {"commit": "fed", "device": "NVIDIA H100 80GB HBM3", "concurrent_processes": 1,
       "finished_arms": ["bf16", "tetrajet_v2_full"]}])
  rows = {(r["arm"], r["seed"]): r for r in table_rows(section(run_report(tmp_path, [seed0, seed1]), "Main table"))}
  assert rows[("tetrajet_v2_full", "seed 1")]["x bf16 tokens/s"] == "0.50x (bf16 of seed 0)"
  assert rows[("tetrajet_v2_full", "seed 0")]["x bf16 tokens/s"] == "0.50x"  # its own folder's bf16
  assert rows[("bf16", "seed 1")]["x bf16 tokens/s"] == "1.00x"
  _write_json(seed0 / "provenance.json", [{"commit": "abc", "device": "NVIDIA H200",
                                           "concurrent_processes": 1, "finished_arms": list(ARMS)}])
  rows = {(r["arm"], r["seed"]): r for r in table_rows(section(run_report(tmp_path, [seed0, seed1]), "Main table"))}
  assert rows[("tetrajet_v2_full", "seed 1")]["x bf16 tokens/s"] == "n/a"


def test_provenance_names_the_quantizer_kernels_where_recorded(tmp_path, folders):
  """A device run that recorded its quantizer kernels (same bits, different tokens/s) says so in
  its provenance line; an older record without them says nothing about kernels."""
  seed0, seed1 = folders
  _write_json(seed0 / "provenance.json", [
      {"commit": "abc", "device": "NVIDIA H100 80GB HBM3", "wall_s": 10.0, "concurrent_processes": 1},
      {"commit": "def", "device": "NVIDIA H100 80GB HBM3", "wall_s": 20.0, "concurrent_processes": 1,
       "quantizer_kernels": "triton"}])
  lines = [l for l in section(run_report(tmp_path, [seed0, seed1]), "Provenance").splitlines()
           if l.startswith("- device run:")]
  assert "commit `abc`" in lines[0] and "quantizer kernels" not in lines[0]
  assert "commit `def`" in lines[1] and "wall time 20 s, triton quantizer kernels: `" in lines[1]


def test_shared_gpu_rates_are_not_called_a_speed(tmp_path, folders):
  """Arms trained side by side (provenance concurrent_processes > 1) without a
  probe of each alone get no speed ratio: shared-GPU tokens/s only bound it."""
  seed0, seed1 = folders
  _write_json(seed0 / "provenance.json", [{"commit": "abc", "device": "NVIDIA H200", "concurrent_processes": 8}])
  _write_json(seed0 / "throughput_alone.json", {"bf16": {"steps": 30, "tokens_per_s": 5000.0},
                                                "tetrajet_v2": {"steps": 30, "tokens_per_s": 2000.0}})
  text = run_report(tmp_path, [seed0, seed1])
  rows = {(r["arm"], r["seed"]): r for r in table_rows(section(text, "Main table"))}
  assert rows[("tetrajet_v2", "seed 0")]["x bf16 tokens/s"] == "0.40x"
  assert rows[("nvidia_nvfp4", "seed 0")]["x bf16 tokens/s"] == "n/a"  # shared GPU, not probed
  assert "FP4 arms run at 0.40x to 0.40x bf16's tokens/s" in section(text, "Discussion")


def test_across_seeds_intervals_and_verdicts(tmp_path):
  """Three seeds with all six arms: per-arm spreads and each claim's paired 95% interval, recomputed here."""
  runs = [write_folder(tmp_path / f"seed{s}", s, list(ARMS)) for s in range(3)]
  text = section(run_report(tmp_path, runs), "Across seeds")
  t975_df2 = 4.302653  # Student t(0.975, 2)

  def interval(values):
    v = np.asarray(values, np.float64)
    half = t975_df2 * v.std(ddof=1) / math.sqrt(v.size)
    return v.mean(), v.mean() - half, v.mean() + half

  arms = {r["arm"]: r for r in table_rows(text)}
  losses = [math.log(PPL_THREE_SEEDS["tetrajet_v2", s]) for s in range(3)]
  assert arms["tetrajet_v2"]["seeds"] == "3"
  assert arms["tetrajet_v2"]["val loss"] == f"{np.mean(losses):.4f} ± {np.std(losses, ddof=1):.4f}"
  claims = {r["difference"]: r for r in table_rows(text[text.index("| claim"):])}

  def loss_claim(arm, base):
    return interval([math.log(PPL_THREE_SEEDS[arm, s]) - math.log(PPL_THREE_SEEDS[base, s]) for s in range(3)])

  for (arm, base), verdict in {("bf16", "nvidia_nvfp4"): "confirmed",
                               ("tetrajet_v2", "nvidia_nvfp4"): "confirmed",
                               ("tetrajet_v2_full", "nvidia_nvfp4"): "confirmed",
                               ("tetrajet_v2_oscireset", "tetrajet_v2"): "confirmed",
                               ("tetrajet_v2_outcontrol", "tetrajet_v2"): "unresolved"}.items():
    row = claims[f"{arm} - {base}"]
    mean, low, high = loss_claim(arm, base)
    assert row["mean [95% interval]"] == f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]"
    assert row["seeds"] == "3" and row["verdict"] == verdict
  ppl = PPL_THREE_SEEDS
  closures = [(ppl["nvidia_nvfp4", s] - ppl["tetrajet_v2_full", s]) / (ppl["nvidia_nvfp4", s] - ppl["bf16", s])
              for s in range(3)]
  mean, low, high = interval(closures)
  row = claims["gap closure"]
  assert row["mean [95% interval]"] == f"{mean:.3f} [{low:.3f}, {high:.3f}]"
  assert row["verdict"] == "refuted"  # about 76% in every seed: the interval excludes the paper's 51.3%
  assert claims["rebound with - without OsciReset"]["verdict"] == "confirmed"  # only tetrajet_v2 rebounds
  # The Discussion's single-seed bullets end with the verdict over seeds, the same figures.
  discussion = section(run_report(tmp_path, runs), "Discussion")
  for title, arm, base, verdict in (("OsciReset lowers the validation loss", "tetrajet_v2_oscireset", "tetrajet_v2",
                                     "confirmed"),
                                    ("OutControl lowers the validation loss", "tetrajet_v2_outcontrol", "tetrajet_v2",
                                     "unresolved")):
    bullet = next(l for l in discussion.splitlines() if l.startswith(f"- **{title}**"))
    mean, low, high = loss_claim(arm, base)
    assert bullet.endswith(f" Over 3 seeds: **{verdict}**, {mean:+.4f} [{low:+.4f}, {high:+.4f}]."), bullet
  figures = section(run_report(tmp_path, runs), "Figures")
  for name in ("loss_seeds.png", "latent.png"):
    assert f"(results/{name})" in figures and (tmp_path / "docs" / "results" / name).stat().st_size > 0


def test_across_seeds_with_one_seed_per_claim_is_unresolved(tmp_path, folders):
  text = section(run_report(tmp_path, folders), "Across seeds")
  claims = {r["difference"]: r for r in table_rows(text[text.index("| claim"):])}
  assert claims["tetrajet_v2 - nvidia_nvfp4"]["seeds"] == "1"
  assert claims["tetrajet_v2 - nvidia_nvfp4"]["mean [95% interval]"] == "n/a"
  assert all(r["verdict"] == "unresolved" for r in claims.values())
  arms = {r["arm"]: r for r in table_rows(text)}
  assert arms["bf16"]["seeds"] == "2" and arms["nvidia_nvfp4"]["seeds"] == "1"
  assert "±" not in arms["nvidia_nvfp4"]["val loss"]  # one seed: no spread
  assert " Over " not in section(run_report(tmp_path, folders), "Discussion")  # no verdict over one seed


def test_committed_results_page_is_rendered_from_the_committed_raw_files(tmp_path):
  """docs/RESULTS.md is what `python -m experiments.report` writes from the committed results folders
  today: a raw file or report change without a regenerated page fails here."""
  committed = report.REPO_ROOT / "docs" / "RESULTS.md"
  out = tmp_path / "docs" / "RESULTS.md"
  text = report.render(report.load_folders(list(report.DEFAULT_RUNS)), command="python -m experiments.report",
                       out=out, figures=tmp_path / "docs" / "results")
  assert text == committed.read_text(encoding="utf-8"), "docs/RESULTS.md is stale: re-run `python -m experiments.report`"
