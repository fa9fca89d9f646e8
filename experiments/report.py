"""docs/RESULTS.md, regenerated from the committed raw ablation metrics.

Why a generator: a results page typed by hand drifts from the measurements
and invites numbers nobody can trace. This module reads only the raw files
of the ablation's results folders (`experiments/ablation.py`) that are
committed under ``experiments/results/<set>/seed<N>/`` and writes every number of
RESULTS.md, and its figures, from them. The only numbers it does not read
from those files are the paper's reference figures (the ``PAPER_*``
constants). The Discussion's statements come from explicit rules
(`loss_verdict`, `rebound_verdict`, ...) that weigh each difference between
arms against the seed-to-seed difference of the same arm, because a single
small run cannot tell apart effects smaller than that.

    python -m experiments.report                      # the defaults below
    python -m experiments.report --runs SEED0_DIR SEED1_DIR --out docs/RESULTS.md --figures docs/results

The first ``--runs`` folder is the reference (seed 0, all six arms; gap
closure is computed within it); the others repeat some arms with another
seed and give the seed-noise figure. The "Across seeds" section treats every
folder as one seed: per-arm means and spreads, and each claim's difference
paired by seed with its 95% interval and verdict (`experiments.report_seeds`),
which is what a run with three or more seeds per arm is read by. Files read
per folder::

    run.json                shared settings (seed, data seed, data)
    <arm>/config.json       the arm's config and derived schedule windows
    <arm>/metrics.jsonl.xz  per-step metrics (train/loss, val/*, osci/*), or metrics.jsonl
    <arm>/final.json        final validation, downstream accuracy, tokens/s
    provenance.json         optional: {"commit", "device", "command", "wall_s", "date"} or a list of them

A missing folder, arm or file gives "n/a" and is named in the page, never a crash.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


from experiments import plots, report_seeds
from experiments.tables import fmt  # the runner's n/a-aware number format
from experiments.tables import LATENT_HISTOGRAM, comparison, fmt_ratio, gap_closure, markdown_table
from experiments.report_data import (ABLATION_ARMS, NOISE_MARGIN, SEED_NOISE_ARMS, ArmRun, RunFolder, SeedNoise,
                                     accuracy_standard_error, downstream_num_docs, downstream_tasks,
                                     in_units, late_mean, late_rebound, load_folders, speed_ratio_on_its_gpu,
                                     loss_delta, loss_verdict, rebound_verdict, seed_noise, display,
                                     REPO_ROOT)

DEFAULT_RUNS = tuple(REPO_ROOT / f"experiments/results/stage1_20m/seed{s}" for s in range(3))
DEFAULT_OUT = REPO_ROOT / "docs/RESULTS.md"
DEFAULT_FIGURES = REPO_ROOT / "docs/results"

# The paper's reference figures: TetraJet-v2, Chen et al., arXiv 2510.27527
# (summarised in docs/SPEC.md, section 6).
PAPER = "TetraJet-v2 (Chen et al., arXiv 2510.27527)"
PAPER_MODEL = "370M"
PAPER_PPL = {"bf16": 23.70, "tetrajet_v2_full": 25.11, "nvidia_nvfp4": 26.20}  # at PAPER_MODEL
PAPER_MEAN_GAP_CLOSURE = 0.513  # TetraJet-v2 full, average over the paper's models
PAPER_SPEEDUP_RTX5090_VS_FP8 = 1.67  # end to end, on FP4 tensor cores (the H200 has none)

# Method comparisons of the seed-0 folder beyond "each arm vs bf16": (arm, baseline).
METHOD_COMPARISONS = (("tetrajet_v2", "nvidia_nvfp4"), ("tetrajet_v2_full", "nvidia_nvfp4"),
                      ("tetrajet_v2_outcontrol", "tetrajet_v2"), ("tetrajet_v2_oscireset", "tetrajet_v2"),
                      ("tetrajet_v2_full", "tetrajet_v2_oscireset"), ("tetrajet_v2_full", "tetrajet_v2"))

WHAT_WOULD_TELL = (
    "What would be needed to tell: the paper measures its gaps between recipes on larger models trained on "
    "far more tokens than a small ablation, where FP4 rounding error accumulates over a long "
    "low-learning-rate tail and OsciReset has many rounds to act. Claims left unresolved above need (1) a "
    "bigger model (the paper's smallest size or more), (2) more tokens per parameter, so that a late-training "
    "rebound has room to appear, and (3) more seeds per arm (at least three, for every arm, not just bf16 and "
    "the full method) to turn the single seed difference above into a standard deviation and a confidence "
    "interval.")


# ---- loading ---------------------------------------------------------------------------------

def _percent(v: float | None, spec: str = ".1f") -> str:
  return fmt(None if v is None else 100 * v, spec) + ("%" if v is not None else "")


def _short_commit(commit: str | None) -> str:
  """A commit as the tables print it: the first 7 hex digits of whatever provenance recorded."""
  return (commit or "n/a")[:7]


def _span(values: list[int]) -> str:
  lo, hi = min(values), max(values)
  return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"


# Runs whose config has no ``t_max_steps`` predate the settings that follow the reference code
# (docs/SPEC.md sections 1, 3, 4 and 6); the report says so instead of presenting them as current.
PRE_FIDELITY_NOTE = (
    "**These results were produced before the current settings of docs/SPEC.md**: OsciReset ran with "
    "a window of 2 and a period of 8 updates, the outlier channel count was rounded up to a multiple of "
    "128, outlier and FP4 channels were in ascending index order, the LR decayed to 0.1x at the last "
    "step with no flat tail and no weight decay on norm weights, and elements were rounded from the "
    "float32 quotient x / s instead of being multiplied by the block's reciprocal. They stay as history "
    "until a reproduction with the current settings replaces them.")


def header_section(command: str, folders: list[RunFolder]) -> list[str]:
  ref = folders[0]
  lines = ["# Results: the NVFP4 training ablation", "",
           f"<!-- GENERATED FILE: do not edit by hand. Regenerate with `{command}` (experiments/report.py). -->",
           "",
           f"Generated by `{command}` from the raw files of "
           + ", ".join(f"`{display(f.path)}`" for f in folders)
           + "; every number below is computed from them, except the paper's reference figures, from "
           f"{PAPER}. Do not edit by hand: change `experiments/report.py` or the raw files and re-run.", ""]
  missing = []
  for folder in folders:
    if not folder.exists:
      missing.append(f"{folder.label} folder `{display(folder.path)}` not found (all its numbers are n/a)")
    elif folder.missing_arms:
      missing.append(f"{folder.label}: {', '.join(folder.missing_arms)} missing or not completed")
  lines.append("Missing: " + ("; ".join(missing) + "." if missing else "nothing (every expected arm completed)."))
  lines.append("")
  if ref.exists:
    cfg = next((a for a in ref.arms.values() if a.config), ArmRun("")).config or {}
    derived = cfg.get("derived", {})
    lines.append(f"Model `{cfg.get('model', {}).get('name', 'n/a')}`, "
                 f"{fmt(derived.get('total_tokens'), ',')} training tokens per arm; "
                 f"reference folder {ref.label}.")
    lines.append("")
    if "t_max_steps" not in cfg.get("train", {}):
      lines += [PRE_FIDELITY_NOTE, ""]
  return lines


# Runs written before the backend was a recipe field recorded a "gemm" mode.
_GEMM_TO_BACKEND = {"exact": "reference", "fast": "xla", "pallas": "auto"}


def _backend(train_cfg: dict) -> str:
  if "backend" in train_cfg:
    return str(train_cfg["backend"])
  return _GEMM_TO_BACKEND.get(train_cfg.get("gemm"), "n/a")


def provenance_section(folders: list[RunFolder]) -> list[str]:
  lines = ["## Provenance", ""]
  for folder in folders:
    lines += [f"### {folder.label}: `{display(folder.path)}`", ""]
    if not folder.exists:
      lines += ["Folder not found: n/a.", ""]
      continue
    run = folder.run or {}
    train = run.get("train", {})
    lines.append(f"- run.json: seed {fmt(train.get('seed'), 'd')}, data seed {fmt(train.get('data_seed'), 'd')}, "
                 f"data `{run.get('data', 'n/a')}`" if folder.run else "- run.json: not found (n/a)")
    first = next((folder.arm(a) for a in folder.listed_arms if folder.arm(a).config), None)
    if first is not None:
      model, derived, cfg = first.config.get("model", {}), first.derived, first.train
      params = derived.get("param_counts", {})
      total_tokens, non_embedding = derived.get("total_tokens"), params.get("non_embedding")
      per_param = total_tokens / non_embedding if total_tokens and non_embedding else None
      lines.append(f"- model `{model.get('name', 'n/a')}`: {fmt(model.get('num_layers'), 'd')} layers, "
                   f"d_model {fmt(model.get('d_model'), 'd')}, {fmt(non_embedding, ',')} non-embedding / "
                   f"{fmt(params.get('total'), ',')} total parameters, vocabulary "
                   f"{fmt(model.get('vocab_size'), ',')}")
      lines.append(f"- schedule: {fmt(cfg.get('total_steps'), ',')} steps x {fmt(derived.get('tokens_per_step'), ',')} "
                   f"tokens per step ({fmt(cfg.get('batch_size'), 'd')} x {fmt(cfg.get('seq_len'), 'd')}) = "
                   f"{fmt(total_tokens, ',')} tokens per arm ({fmt(per_param, '.3g')} tokens per non-embedding "
                   f"parameter); warmup {fmt(cfg.get('warmup_steps'), ',')} steps, peak LR "
                   f"{fmt(cfg.get('peak_lr'), 'g')}, cosine to {fmt(cfg.get('final_lr_ratio'), 'g')}x peak; "
                   f"backend `{_backend(cfg)}`")
    if folder.provenance:
      for rec in folder.provenance:
        lines.append(f"- device run: commit `{_short_commit(rec.get('commit'))}`, device {rec.get('device', 'n/a')}, "
                     f"date {rec.get('date', 'n/a')}, wall time {fmt(rec.get('wall_s'), ',.0f')} s"
                     + (f", {rec['quantizer_kernels']} quantizer kernels" if "quantizer_kernels" in rec else "")
                     + (f", {rec['gemm_tiling']} GEMM tiles" if "gemm_tiling" in rec else "")
                     + ": "
                     f"`{rec.get('command', 'n/a')}`"
                     + (f" ({rec['concurrent_processes']} arms trained side by side on one GPU)"
                        if rec.get("concurrent_processes", 1) > 1 else ""))
    else:
      lines.append("- device runs (commit, device, command, date, wall time): not recorded (no provenance.json)")
    lines.append("")
    rows = []
    for name in folder.listed_arms:
      arm = folder.arm(name)
      osci, calib = arm.derived.get("osci_reset"), arm.derived.get("outcontrol_calibration")
      final = arm.final or {}
      rows.append([name, arm.status, fmt(final.get("steps"), ","), fmt(final.get("tokens"), ","),
                   fmt(arm.train.get("warmup_steps"), ","),
                   f"{osci['start_step']} / {osci['period']} / {osci['window']} / {osci['threshold']:g}"
                   if osci else "-",
                   f"[{calib['start']}, {calib['start'] + calib['length']})" if calib else "-",
                   fmt(final.get("val", {}).get("tokens"), ",.0f"),
                   fmt(final.get("wall_s_this_session"), ",.0f"),
                   f"`{_short_commit(folder.trained_at(name))}`" if folder.trained_at(name) else "n/a",
                   folder.trained_on(name) or "n/a"])
    lines += markdown_table(["arm", "status", "steps", "tokens", "warmup", "OsciReset S / P / T / tau",
                             "OutControl calibration steps", "final-eval tokens", "wall s (last session)",
                             "trained at commit", "device"], rows)
    lines += ["", "OsciReset S / P / T / tau: first reset step, period, window, threshold (config.json "
              "`derived.osci_reset`; arms without OsciReset monitor oscillation on the same windows). "
              "Wall time: final.json `wall_s_this_session` (the last runner session of that arm only). "
              "Trained at commit: the first device run whose provenance lists the arm as finished; arms "
              "trained at different commits ran different code (see docs/notes/training.md for what "
              "changed between them).", ""]
  return lines


def main_table_section(folders: list[RunFolder]) -> list[str]:
  tasks = downstream_tasks(folders)
  out_header, out_rows = None, []
  for folder in folders:
    finals = {a: folder.arm(a).final or {"status": folder.arm(a).status} for a in folder.listed_arms}
    header, rows, _ = comparison(finals, tasks)
    for name, row in zip(finals, rows):
      closure = row[-2] if folder is folders[0] else "n/a"
      out_rows.append([row[0], folder.label] + row[1:-2]
                      + [closure, _speed_cell(folder.speed(name), folder.arm(name).tokens_per_s),
                         _ratio_cell(folders, folder, name)])
    out_header = [header[0], "seed"] + header[1:] + ["x bf16 tokens/s"]
  docs = downstream_num_docs([arm for f in folders for arm in f.arms.values()])
  lines = ["## Main table", ""] + markdown_table(out_header, out_rows) + [""]
  lines.append("Final validation loss (nats/token), perplexity and bits per byte from final.json. Downstream: "
               "zero-shot accuracy, chance level in parentheses"
               + (f"; {_span(docs)} questions per task, so one accuracy has a binomial standard "
                  f"error up to {accuracy_standard_error(min(docs)):.3f}" if docs else "") + ". "
               f"Gap closure = (PPL_nvidia - PPL_arm) / (PPL_nvidia - PPL_bf16), computed within "
               f"{folders[0].label} only. Tokens/s: median over the training steps of the arm alone on the "
               "GPU (final.json of a run with no other arm beside it, else the short probe in "
               "throughput_alone.json); an arm "
               "that only trained side by side with others shows final.json's figure marked '(shared GPU)', "
               "a lower bound, and no ratio. The ratio is to bf16 of the same folder trained on the same GPU "
               "model (the device column of the settings table); where that bf16 trained on another GPU "
               "model, to the bf16 of the first other seed that trained on the arm's GPU model (named in "
               "the cell: the model and step are the same, the seed changes only the numbers drawn); "
               "else n/a.")
  return lines + [""]


def seed_noise_section(folders: list[RunFolder], noise: SeedNoise) -> list[str]:
  ref = folders[0]
  lines = ["## Seed noise", "",
           f"The same arm trained with another seed (same data order when the data seeds match) gives the "
           f"difference that the arm-to-arm differences must exceed. Noise figure used below: the largest "
           f"|difference| over {', '.join(SEED_NOISE_ARMS)}.", ""]
  rows = []
  for d in noise.differences:
    a, b = d.reference.arm(d.arm), d.other.arm(d.arm)
    same_data = d.reference.data_seed == d.other.data_seed
    rows.append([d.arm, f"{d.reference.label} -> {d.other.label}", "same" if same_data else "different",
                 f"{a.val('loss'):.4f}", f"{b.val('loss'):.4f}", f"{d.loss:+.4f}",
                 f"{a.val('ppl'):.3f}", f"{b.val('ppl'):.3f}", f"{d.ppl:+.3f}"])
  if rows:
    lines += markdown_table(["arm", "seeds", "data order", "val loss A", "val loss B", "Δ loss", "PPL A",
                             "PPL B", "Δ PPL"], rows) + [""]
  lines += [f"- {n}" for n in noise.notes]
  lines += [f"- seed noise: |Δ loss| = {fmt(noise.loss, '.4f')}, |Δ PPL| = {fmt(noise.ppl, '.3f')}", ""]
  rows = []
  comparisons = [(a, "bf16") for a in ABLATION_ARMS if a != "bf16"] + list(METHOD_COMPARISONS)
  for arm, base in comparisons:
    delta = loss_delta(ref, arm, base)
    ppl_a, ppl_b = ref.arm(arm).val("ppl"), ref.arm(base).val("ppl")
    rows.append([f"{arm} - {base}", fmt(delta, "+.4f"),
                 fmt(None if ppl_a is None or ppl_b is None else ppl_a - ppl_b, "+.3f"),
                 in_units(delta, noise.loss)])
  lines += [f"Differences between arms ({ref.label}), next to the seed noise they must exceed:", ""]
  lines += markdown_table(["arms", "Δ val loss", "Δ PPL", "Δ loss / seed noise"], rows) + [""]
  return lines


# Arms whose end-of-training latent weights the report compares (OsciReset's effect).
LATENT_ARMS = ("tetrajet_v2", "tetrajet_v2_oscireset")


def figures_section(folders: list[RunFolder], figures: Path, out: Path) -> list[str]:
  figures.mkdir(parents=True, exist_ok=True)
  ref = folders[0]
  lines = ["## Figures", ""]

  def link(title: str, path: Path | None, missing: str) -> None:
    if path is None:
      lines.extend([f"{title}: n/a ({missing}).", ""])
    else:
      lines.extend([f"![{title}]({Path(os.path.relpath(path, out.parent)).as_posix()})", ""])

  losses = {a: ref.arm(a).records for a in ref.listed_arms if ref.arm(a).records}
  link(f"Loss curves, {ref.label}", plots.plot_loss(losses, figures / "loss.png", title=f"loss ({ref.label})")
       if losses else None, "no metrics.jsonl")
  lines.extend(["Training loss smoothed by a trailing moving average over about 1/"
                f"{plots.SMOOTHING_POINTS} of the steps; validation points where the run evaluated "
                "periodically. Right: the last third.", ""])
  repeated = [a for a in SEED_NOISE_ARMS if sum(bool(f.arm(a).records) for f in folders) > 1]
  seeds = {f"{a} ({f.label})": f.arm(a).records for a in repeated for f in folders if f.arm(a).records}
  link("Seed-to-seed loss curves", plots.plot_loss(seeds, figures / "seeds.png", title="loss, both seeds")
       if seeds else None, "needs the same arm in two folders")
  banded = {a: [f.arm(a).records for f in folders if f.arm(a).records] for a in ref.listed_arms}
  banded = {a: r for a, r in banded.items() if len(r) > 1}
  link("Loss over seeds", plots.plot_loss_bands(banded, figures / "loss_seeds.png") if banded else None,
       "needs an arm with metrics in two or more folders")
  if banded:
    lines.extend(["Mean over seeds of the smoothed training loss, band from the lowest to the highest seed. "
                  "Right: the last third.", ""])
  hists = {}
  for a in LATENT_ARMS:
    found = [f.arm(a).latent_histogram for f in folders if f.arm(a).latent_histogram]
    if found:  # summed over seeds (same edges: the runner's default bins)
      hists[f"{a} ({len(found)} seed{'s' * (len(found) > 1)})"] = (
          found[0]["edges"], [sum(c) for c in zip(*(h["counts"] for h in found))])
  link("Latent weights at the end", plots.plot_latent_histograms(hists, figures / "latent.png") if hists
       else None, f"no {LATENT_HISTOGRAM} for {' or '.join(LATENT_ARMS)}")
  if hists:
    lines.extend(["Latent weights w / s of the FP4 layers (grid units, s the element's scale) at the last step. "
                  "Weights that keep flipping between two FP4 values sit at the dotted rounding thresholds; "
                  "OsciReset moves them onto grid values.", ""])
  osci = {f"{a} ({'OsciReset' if ref.arm(a).derived.get('osci_reset') else 'no reset, monitored'})":
          ref.arm(a).records for a in ref.listed_arms if ref.arm(a).records}
  link("Oscillating weights", plots.plot_oscillation(osci, figures / "oscillation.png"), "no osci/risk_frac "
       "in any metrics.jsonl")
  lines.extend(["Left: `osci/risk_frac`, the fraction of FP4 weights with oscillation ratio R >= tau at the end "
                "of each OsciReset window (arms without OsciReset measure it with the monitor on the same "
                "windows). Right: `osci/reset_frac`, the fraction reset at the last reset.", ""])
  return lines


def _claim(title: str, verdict: str, detail: str) -> str:
  return f"- **{title}**: {verdict}. {detail}"


def discussion_section(folders: list[RunFolder], noise: SeedNoise) -> list[str]:
  ref = folders[0]
  noise_text = f"seed noise {fmt(noise.loss, '.4f')}"
  lines = ["## Discussion", "",
           f"Rules: a difference in validation loss between two arms of {ref.label} is called resolved when it "
           f"exceeds {NOISE_MARGIN:g}x the seed noise (the largest seed-to-seed |Δ loss| above); otherwise the "
           "claim is not resolved at this scale, whatever its sign. One pair of seeds is one sample of the "
           "noise, so these are indications, not tests. Where two or more seeds have both arms, the "
           "verdict over seeds (section Across seeds) follows and is the one that counts.", ""]

  def loss_claim(title: str, arm: str, base: str) -> str:
    delta = loss_delta(ref, arm, base)
    n, cell, verdict = report_seeds.loss_claim(folders, arm, base)
    over_seeds = f" Over {n} seeds: **{verdict}**, {cell}." if n >= 2 else ""
    return _claim(title, loss_verdict(delta, noise.loss),
                  f"Δ val loss {arm} - {base} = {fmt(delta, '+.4f')} (PPL {fmt(ref.arm(arm).val('ppl'), '.3f')} vs "
                  f"{fmt(ref.arm(base).val('ppl'), '.3f')}), {noise_text}, ratio {in_units(delta, noise.loss)}."
                  + over_seeds)

  lines.append(loss_claim("TetraJet-v2 beats NVIDIA's recipe", "tetrajet_v2", "nvidia_nvfp4"))
  lines.append(loss_claim("TetraJet-v2 full beats NVIDIA's recipe", "tetrajet_v2_full", "nvidia_nvfp4"))
  lines.append(_gap_closure_claim(ref, noise))
  lines += _oscireset_claims(ref)
  lines.append(loss_claim("OsciReset lowers the validation loss", "tetrajet_v2_oscireset", "tetrajet_v2"))
  lines.append(loss_claim("OutControl lowers the validation loss", "tetrajet_v2_outcontrol", "tetrajet_v2"))
  lines.append(loss_claim("OutControl helps on top of OsciReset", "tetrajet_v2_full", "tetrajet_v2_oscireset"))
  lines.append(_speed_claim(ref))
  lines.append(_downstream_claim(ref))
  return lines + ["", WHAT_WOULD_TELL, ""]


def _gap_closure_claim(ref: RunFolder, noise: SeedNoise) -> str:
  ppl = {a: ref.arm(a).val("ppl") for a in ("bf16", "nvidia_nvfp4", "tetrajet_v2_full")}
  closure = gap_closure(ppl["tetrajet_v2_full"], ppl["nvidia_nvfp4"], ppl["bf16"])
  paper_closure = gap_closure(PAPER_PPL["tetrajet_v2_full"], PAPER_PPL["nvidia_nvfp4"], PAPER_PPL["bf16"])
  gap = None if None in (ppl["nvidia_nvfp4"], ppl["bf16"]) else ppl["nvidia_nvfp4"] - ppl["bf16"]
  closure_noise = noise.ppl / gap if noise.ppl is not None and gap else None
  if closure is None:
    verdict = "n/a (needs bf16, nvidia_nvfp4 and tetrajet_v2_full with PPL_nvidia > PPL_bf16)"
  elif noise.ppl is None:
    verdict = "no seed-noise figure to compare it with the paper"
  elif gap <= NOISE_MARGIN * noise.ppl:
    verdict = (f"not meaningful at this scale: the bf16-NVIDIA gap itself ({gap:.3f} PPL) is within "
               f"{NOISE_MARGIN:g}x the seed noise ({noise.ppl:.3f} PPL)")
  elif abs(closure - PAPER_MEAN_GAP_CLOSURE) <= NOISE_MARGIN * closure_noise:
    verdict = f"consistent with the paper's average within {NOISE_MARGIN:g}x the seed noise"
  else:
    side = "above" if closure > PAPER_MEAN_GAP_CLOSURE else "below"
    verdict = f"{side} the paper's average by more than {NOISE_MARGIN:g}x the seed noise"
  return _claim("Gap closure of the full method vs the paper", verdict,
                      f"Measured {_percent(closure)} ({ref.label}; the seed noise is about "
                      f"{fmt(None if closure_noise is None else 100 * closure_noise, '.1f')} percentage points of "
                      f"closure); {PAPER}: {_percent(PAPER_MEAN_GAP_CLOSURE)} on average, "
                      f"{_percent(paper_closure)} at {PAPER_MODEL} (PPL {PAPER_PPL['bf16']:.2f} bf16, "
                      f"{PAPER_PPL['tetrajet_v2_full']:.2f} full, {PAPER_PPL['nvidia_nvfp4']:.2f} NVIDIA).")


def _oscireset_claims(ref: RunFolder) -> list[str]:
  lines = []
  rebounds = {a: late_rebound(ref.arm(a).records) for a in ref.listed_arms}
  r_without, r_with = rebounds.get("tetrajet_v2"), rebounds.get("tetrajet_v2_oscireset")

  def rebound_text(arm: str) -> str:
    r = rebounds.get(arm)
    if r is None:
      return f"{arm} n/a"
    return f"{arm} {r.rebound:.4f} (minimum at step {r.min_step:,.0f}, noise {r.smoothing_error:.4f})"

  lines.append(_claim("Without OsciReset the loss rebounds late in training", rebound_verdict(r_without, r_with),
                      "Rebound = final minus minimum of the smoothed training loss over the last third: "
                      f"{rebound_text('tetrajet_v2')}, {rebound_text('tetrajet_v2_oscireset')}; control "
                      f"{rebound_text('bf16')} (a noisy curve's minimum sits below its trend, so small rebounds "
                      "appear without any effect)."))
  risk = {a: late_mean(ref.arm(a).records, "osci/risk_frac") for a in ("tetrajet_v2", "tetrajet_v2_oscireset")}
  if None in risk.values():
    verdict = "n/a (osci/risk_frac missing)"
  else:
    verdict = ("holds in this run" if risk["tetrajet_v2_oscireset"] < risk["tetrajet_v2"]
               else "does not hold in this run") + " (one seed, no noise figure for this metric)"
  lines.append(_claim("OsciReset lowers the fraction of oscillating weights", verdict,
                      f"Mean osci/risk_frac over the last third: tetrajet_v2 {_percent(risk['tetrajet_v2'], '.3f')}, "
                      f"tetrajet_v2_oscireset {_percent(risk['tetrajet_v2_oscireset'], '.3f')}."))
  return lines


def _speed_claim(ref: RunFolder) -> str:
  devices = ", ".join(sorted({str(r.get("device")) for r in ref.provenance or []})) or "not recorded"
  fp4 = [r for r in (ref.speed_ratio(a) for a in ref.listed_arms if a != "bf16") if r]
  speed = (f"FP4 arms run at {fmt_ratio(min(fp4))} to {fmt_ratio(max(fp4))} bf16's tokens/s here" if fp4
           else "n/a (needs bf16 and an FP4 arm with tokens/s measured alone on the GPU)")
  return _claim("Speed", speed,
                      f"Device: {devices}. Hopper GPUs (H100/H200) have no FP4 tensor cores (FP4 is decoded to "
                      "bf16 before the MMA), so there this is not comparable with the paper's "
                      f"{PAPER_SPEEDUP_RTX5090_VS_FP8:g}x end-to-end speedup over FP8 on an RTX 5090.")


def _downstream_claim(ref: RunFolder) -> str:
  accs = {a: sum(t["accuracy"] for t in ref.arm(a).downstream.values()) / len(ref.arm(a).downstream)
          for a in ref.listed_arms if ref.arm(a).downstream}
  docs = downstream_num_docs([ref.arm(a) for a in accs])
  if accs and docs:
    spread, error = max(accs.values()) - min(accs.values()), accuracy_standard_error(min(docs))
    verdict = ("differences between arms are within the questions' sampling noise"
               if spread <= NOISE_MARGIN * error else "arms differ by more than the questions' sampling noise")
    return _claim("Downstream accuracy", verdict,
                        f"Mean accuracy spans {spread:.3f} across the arms of {ref.label}; one task's accuracy has "
                        f"a binomial standard error up to {error:.3f} with {min(docs):,} questions, and all arms "
                        "share the questions, so small models near chance mostly measure noise.")
  return _claim("Downstream accuracy", "n/a", "no downstream results in final.json.")


def render(folders: list[RunFolder], *, command: str, out: Path, figures: Path) -> str:
  noise = seed_noise(folders)
  sections = (header_section(command, folders) + provenance_section(folders) + main_table_section(folders)
              + seed_noise_section(folders, noise) + report_seeds.section(folders, PAPER_MEAN_GAP_CLOSURE)
              + figures_section(folders, figures, out)
              + discussion_section(folders, noise))
  return "\n".join(sections).rstrip("\n") + "\n"


# ---- command line ----------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="python -m experiments.report", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--runs", type=Path, nargs="+", default=list(DEFAULT_RUNS),
                 help="results folders; the first is the reference (seed 0, all arms)")
  p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the Markdown page to write")
  p.add_argument("--figures", type=Path, default=DEFAULT_FIGURES, help="folder for the PNG figures")
  return p.parse_args(argv)


def command_line(args: argparse.Namespace) -> str:
  """The command that regenerates the page (flags only where they differ from the defaults)."""
  parts = ["python -m experiments.report"]
  if [Path(p).resolve() for p in args.runs] != [p.resolve() for p in DEFAULT_RUNS]:
    parts += ["--runs"] + [display(p) for p in args.runs]
  if args.out.resolve() != DEFAULT_OUT.resolve():
    parts += ["--out", display(args.out)]
  if args.figures.resolve() != DEFAULT_FIGURES.resolve():
    parts += ["--figures", display(args.figures)]
  return " ".join(parts)


def _ratio_cell(folders: list[RunFolder], folder: RunFolder, arm: str) -> str:
  ratio, baseline = speed_ratio_on_its_gpu(folders, folder, arm)
  return fmt_ratio(ratio) + (f" (bf16 of {baseline.label})" if baseline is not folder and ratio else "")


def _speed_cell(alone: float | None, final: float | None) -> str:
  if alone:
    return fmt(alone, ",.0f")
  return f"{fmt(final, ',.0f')} (shared GPU)" if final else "n/a"


def main(argv: list[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  folders = load_folders(list(args.runs))
  text = render(folders, command=command_line(args), out=args.out, figures=args.figures)
  args.out.parent.mkdir(parents=True, exist_ok=True)
  args.out.write_text(text, encoding="utf-8")
  print(f"wrote {display(args.out)} and figures in {display(args.figures)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
