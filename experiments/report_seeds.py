"""The report's "Across seeds" section: every results folder is one seed.

Per arm, the mean and sample standard deviation of the final validation
figures over the seeds that completed it (overall and per source group); per
claim, the difference arm - baseline in each seed that has both, with its
95% Student interval and the verdict of `experiments.seed_stats`. This is how
a run with three or more seeds per arm is read (experiments/report.py renders
it beside the single-seed sections).
"""

from __future__ import annotations

from experiments import seed_stats
from experiments.report_data import RunFolder, late_rebound, loss_delta
from experiments.tables import gap_closure, markdown_table
from tetrajet_jax.train.arms import ARMS

# Claims weighed seed by seed: (title, arm, baseline), each "arm's validation loss is lower".
SEED_CLAIMS = (("bf16 beats NVIDIA's FP4 recipe (the gap the method closes)", "bf16", "nvidia_nvfp4"),
               ("TetraJet-v2 beats NVIDIA's recipe", "tetrajet_v2", "nvidia_nvfp4"),
               ("TetraJet-v2 full beats NVIDIA's recipe", "tetrajet_v2_full", "nvidia_nvfp4"),
               ("OsciReset lowers the validation loss", "tetrajet_v2_oscireset", "tetrajet_v2"),
               ("OutControl lowers the validation loss", "tetrajet_v2_outcontrol", "tetrajet_v2"))


def _val_metrics(folders: list[RunFolder]) -> list[str]:
  """loss, ppl, bits/byte, then per source group (`<group>/loss`, ...) where final.json has them."""
  keys = ["loss", "ppl", "bits_per_byte"]
  groups = sorted({k for f in folders for a in f.arms.values() if a.completed for k in a.final["val"]
                   if "/" in k and k.split("/", 1)[1] in keys})
  return keys + groups


def _interval_cell(iv: seed_stats.Interval | None, spec: str) -> str:
  return "n/a" if iv is None else f"{iv.mean:{spec}} [{iv.low:{spec}}, {iv.high:{spec}}]"


def loss_claim(folders: list[RunFolder], arm: str, base: str) -> tuple[int, str, str]:
  """The claim "arm's validation loss is lower than base's" over the seed folders: how many seeds
  have both arms, the mean paired difference with its 95% interval, and the verdict."""
  deltas = [loss_delta(f, arm, base) for f in folders if f.exists]
  iv = seed_stats.interval(deltas)
  return sum(d is not None for d in deltas), _interval_cell(iv, "+.4f"), seed_stats.lower_verdict(iv)


def section(folders: list[RunFolder], paper_gap_closure: float) -> list[str]:
  """Per-arm means and spreads over the seed folders, and every claim's paired interval and verdict."""
  seeds = [f for f in folders if f.exists]
  lines = ["## Across seeds", "",
           f"Each results folder is one seed (the same initialisation and data order for all its arms). Per arm: "
           f"mean ± sample standard deviation over the seeds that completed it. Per claim: the difference arm - "
           f"baseline in each seed that has both, its mean and 95% Student interval (t with n - 1 degrees of "
           f"freedom), and the verdict: **{seed_stats.CONFIRMED}** if the interval lies on the claimed side of 0, "
           f"**{seed_stats.REFUTED}** if it lies on the other side, **{seed_stats.UNRESOLVED}** if it contains 0 "
           f"or fewer than two seeds have both arms. For the gap closure: confirmed if its interval lies inside "
           f"(0, 1) and contains the paper's {paper_gap_closure:.1%}, refuted if it excludes it.", ""]
  metrics = _val_metrics(seeds)
  rows = []
  for arm in sorted({a for f in seeds for a in f.listed_arms}, key=lambda a: (list(ARMS).index(a) if a in ARMS
                                                                             else len(ARMS), a)):
    cells = []
    for key in metrics:
      sp = seed_stats.spread([f.arm(arm).val(key) if key in (f.arm(arm).final or {}).get("val", {}) else None
                              for f in seeds])
      cells.append("n/a" if sp is None else f"{sp.mean:.4f}" + ("" if sp.std is None else f" ± {sp.std:.4f}"))
    n = sum(f.arm(arm).completed for f in seeds)
    rows.append([arm, str(n)] + cells)
  lines += markdown_table(["arm", "seeds"] + [f"val {k}" for k in metrics], rows) + [""]

  rows = []
  for title, arm, base in SEED_CLAIMS:
    n, cell, verdict = loss_claim(seeds, arm, base)
    rows.append([title, f"{arm} - {base}", str(n), cell, verdict])
  closures = [gap_closure(*(f.arm(a).val("ppl") for a in ("tetrajet_v2_full", "nvidia_nvfp4", "bf16")))
              for f in seeds]
  iv = seed_stats.interval(closures)
  rows.append([f"TetraJet-v2 full closes about {paper_gap_closure:.1%} of NVIDIA's PPL gap to bf16",
               "gap closure", str(sum(c is not None for c in closures)), _interval_cell(iv, ".3f"),
               seed_stats.share_verdict(iv, paper_gap_closure)])
  rebounds = []
  for f in seeds:
    without, with_reset = (late_rebound(f.arm(a).records) for a in ("tetrajet_v2", "tetrajet_v2_oscireset"))
    rebounds.append(None if without is None or with_reset is None else with_reset.rebound - without.rebound)
  iv = seed_stats.interval(rebounds)
  rows.append(["OsciReset removes the late rebound of the training loss",
               "rebound with - without OsciReset", str(sum(r is not None for r in rebounds)),
               _interval_cell(iv, "+.4f"), seed_stats.lower_verdict(iv)])
  lines += markdown_table(["claim", "difference", "seeds", "mean [95% interval]", "verdict"], rows) + [""]
  lines.append("Rebound: the smoothed training loss's rise from its minimum over the last third to its end "
               "(see the Discussion).")
  return lines + [""]
