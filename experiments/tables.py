"""The ablation's comparison tables (results.md / results.csv), shared by the
runner (`experiments.ablation`) and the report (`experiments.report`)."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

from tetrajet_jax.train.metrics import METRICS_FILE, read_jsonl

# Per arm folder: the FP4 latent-weight histogram at the end of training (quantized arms
# without OutControl), written by the runner, drawn by the report.
LATENT_HISTOGRAM = "latent_histogram.json"


def write_json_atomic(path: Path, obj: Any) -> None:
  """Writes JSON through a temporary file and a rename: the runners of other
  arms (scripts/h200_ablation.sh starts one per arm) read these files while
  they run and must never see half a file."""
  tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
  tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
  os.replace(tmp, path)


def median_tokens_per_s(arm_dir: Path) -> float | None:
  """Median of the per-step tokens/s in the arm's metrics (robust to the compile step)."""
  recs = read_jsonl(arm_dir / METRICS_FILE)
  rates = sorted(r["perf/tokens_per_s"] for r in recs if not math.isnan(r.get("perf/tokens_per_s", math.nan)))
  return rates[len(rates) // 2] if rates else None


def fmt(v: Any, spec: str) -> str:
  if v is None or (isinstance(v, float) and not math.isfinite(v)):
    return "n/a"
  return format(v, spec)


def gap_closure(ppl_arm: float | None, ppl_nvidia: float | None, ppl_bf16: float | None) -> float | None:
  """(PPL_nvidia - PPL_arm) / (PPL_nvidia - PPL_bf16); None without a positive gap."""
  if None in (ppl_arm, ppl_nvidia, ppl_bf16) or ppl_nvidia <= ppl_bf16:
    return None
  return (ppl_nvidia - ppl_arm) / (ppl_nvidia - ppl_bf16)


def comparison(finals: dict[str, dict[str, Any]], tasks: list[str]) -> tuple[list[str], list[list[str]], list[str]]:
  """Header, rows and footnotes of the results table."""
  notes = []
  ppl = {a: f["val"]["ppl"] for a, f in finals.items() if f.get("status") == "completed"}
  gap = None
  if "bf16" in ppl and "nvidia_nvfp4" in ppl:
    gap = ppl["nvidia_nvfp4"] - ppl["bf16"]
    if gap <= 0:
      notes.append(f"gap closure n/a: PPL(nvidia_nvfp4) {ppl['nvidia_nvfp4']:.3f} <= PPL(bf16) {ppl['bf16']:.3f}.")
      gap = None
  else:
    notes.append("gap closure needs both bf16 and nvidia_nvfp4 arms: (PPL_nvidia - PPL_arm) / "
                 "(PPL_nvidia - PPL_bf16).")
  header = (["arm", "status", "val loss", "val PPL", "bits/byte"] + [f"{t} acc" for t in tasks]
            + ["mean acc", "gap closure", "tokens/s"])
  rows = []
  for arm, f in finals.items():
    if f.get("status") != "completed":
      rows.append([arm, f.get("status", "?")] + ["n/a"] * (len(header) - 2))
      continue
    ds = f.get("downstream", {})
    accs = [ds[t]["accuracy"] for t in tasks if t in ds]
    closure = None if gap is None or arm in ("bf16", "nvidia_nvfp4") else gap_closure(
        ppl[arm], ppl["nvidia_nvfp4"], ppl["bf16"])
    rows.append([arm, "ok", fmt(f["val"]["loss"], ".4f"), fmt(f["val"]["ppl"], ".3f"),
                 fmt(f["val"]["bits_per_byte"], ".4f")]
                + [(fmt(ds[t]["accuracy"], ".3f") + f" ({ds[t]['chance']:.2f})") if t in ds else "n/a"
                   for t in tasks]
                + [fmt(sum(accs) / len(accs), ".3f") if accs else "n/a",
                   fmt(closure * 100, ".1f") + "%" if closure is not None else "n/a",
                   fmt(f.get("tokens_per_s"), ",.0f")])
  if tasks:
    notes.append("downstream: accuracy (chance level in parentheses), zero-shot, "
                 "task headline metric (data/eval_requests.TASKS).")
  return header, rows, notes


def fmt_ratio(v: float | None) -> str:
  """``0.42x``, or n/a."""
  return fmt(v, ".2f") + ("x" if v is not None else "")


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
  """The lines of a Markdown table."""
  return (["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
          + ["| " + " | ".join(r) + " |" for r in rows])


def throughput_table(finals: dict[str, dict[str, Any]]) -> str:
  """Markdown table of a --stop-after probe: median tokens/s per arm and its ratio to bf16."""
  ref = finals.get("bf16", {}).get("tokens_per_s")
  rows = []
  for arm, f in finals.items():
    rate = f.get("tokens_per_s")
    rows.append([arm, str(f.get("step", f.get("steps", "n/a"))), fmt(rate, ",.0f"),
                 fmt_ratio(rate / ref if rate and ref else None)])
  return "\n".join(markdown_table(["arm", "steps", "tokens/s", "vs bf16"], rows))


def write_tables(out: Path, header: list[str], rows: list[list[str]], notes: list[str]) -> str:
  text = "\n".join(markdown_table(header, rows)) + "\n" + "".join(f"\n{n}" for n in notes) + "\n"
  (out / "results.md").write_text(text, encoding="utf-8")
  with open(out / "results.csv", "w", newline="", encoding="utf-8") as f:
    w = csv.writer(f)
    w.writerow(header)
    w.writerows(rows)
  return text
