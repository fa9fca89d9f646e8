"""Every benchmark in one command: each section in its own process, then the performance document.

    python -m experiments.bench all --out-dir docs/results/<host>_<date> [--sections quant,...,train]
                                    [--limit-s 900] [--args SECTION="..."] [--doc docs/PERFORMANCE.md]

Sections, in order (each writes <out-dir>/<section>.json and <section>.log):
  quant, bwdquant   quantizer kernels against a copy of the same bytes (`kernels --only ...`);
  gemm              the FP4 GEMM against XLA's bf16 dot;
  linear            the linear layer's forward + backward against the bf16 layer, and its parts;
  recipes           forward + backward per recipe at 16384x1024x4096 and 16384x4096x1024, XLA
                    and auto backends (`recipes`);
  train             20m and 70m train steps per arm against bf16 (`train --scan-blocks on`).
A section that fails or passes its time limit is reported and the next one runs: one process per
section, so a crash or a hung compile costs only its own rows. `--args SECTION="..."` appends
options to one section's command (e.g. `--args train="--models 20m --steps 10"`). With `--doc`,
the document is rendered from the JSON files the run produced (`performance_doc`); nothing in it
is typed in.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from experiments.bench import performance_doc

SECTIONS = {
    "quant": ["kernels", "--only", "quant"],
    "bwdquant": ["kernels", "--only", "bwdquant"],
    "gemm": ["kernels", "--only", "gemm"],
    "linear": ["kernels", "--only", "linear"],
    "recipes": ["recipes", "--backends", "xla,auto"],
    "train": ["train", "--models", "20m,70m", "--arms", "bf16,nvidia_nvfp4,tetrajet_v2,tetrajet_v2_full",
              "--scan-blocks", "on"],
}
TAIL_LINES = 30  # of each section's output, echoed after it ends


def section_command(name: str, out_json: Path, extra: list[str]) -> list[str]:
  """The section's `python -m experiments.bench ...` command line."""
  return [sys.executable, "-m", "experiments.bench", *SECTIONS[name], *extra, "--out", str(out_json)]


def run_section(name: str, out_dir: Path, limit_s: float, extra: list[str]) -> dict:
  """Runs one section; its output goes to <out_dir>/<name>.log. Returns {section, rc, seconds, json}."""
  out_json, log = out_dir / f"{name}.json", out_dir / f"{name}.log"
  t0 = time.perf_counter()
  with open(log, "w", encoding="utf-8") as f:
    try:
      rc = subprocess.run(section_command(name, out_json, extra), stdout=f, stderr=subprocess.STDOUT,
                          timeout=limit_s, check=False).returncode
    except subprocess.TimeoutExpired:
      rc = "timeout"
  seconds = time.perf_counter() - t0
  tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-TAIL_LINES:]
  print(f"=== {name}: rc {rc} in {seconds:.0f} s ({log})", *tail, sep="\n", flush=True)
  return dict(section=name, rc=rc, seconds=seconds, json=str(out_json) if out_json.is_file() else None)


def _parse_extra(p: argparse.ArgumentParser, items: list[str]) -> dict[str, list[str]]:
  extra: dict[str, list[str]] = {}
  for item in items:
    name, sep, args = item.partition("=")
    if not sep or name not in SECTIONS:
      p.error(f"--args {item!r}: expected SECTION=\"options\" with SECTION in {', '.join(SECTIONS)}")
    extra[name] = extra.get(name, []) + shlex.split(args)
  return extra


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(prog="python -m experiments.bench all", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out-dir", required=True, help="folder for each section's JSON and log")
  p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma subset of {','.join(SECTIONS)}")
  p.add_argument("--limit-s", type=float, default=900.0, help="time limit per section")
  p.add_argument("--args", action="append", default=[], metavar='SECTION="OPTIONS"',
                 help="extra options for one section's command (repeatable)")
  p.add_argument("--doc", default=None, help="render this performance document from the run's JSON files")
  a = p.parse_args(argv)
  sections = a.sections.split(",")
  bad = [s for s in sections if s not in SECTIONS]
  if bad:
    p.error(f"--sections: unknown {bad}; known: {', '.join(SECTIONS)}")
  if a.limit_s <= 0:
    p.error("--limit-s must be > 0")
  extra = _parse_extra(p, a.args)
  out_dir = Path(a.out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  results = [run_section(s, out_dir, a.limit_s, extra.get(s, [])) for s in sections]
  print("=== summary", *(f"{r['section']}: rc {r['rc']}, {r['seconds']:.0f} s, {r['json'] or 'no JSON'}"
                        for r in results), sep="\n")
  files = [r["json"] for r in results if r["json"]]
  if a.doc and files:
    root = performance_doc.REPO_ROOT
    # Paths inside the repository are recorded relative to it (the document names its sources).
    names = [os.path.relpath(Path(f).resolve(), root) if Path(f).resolve().is_relative_to(root)
             else str(Path(f).resolve()) for f in files]
    Path(a.doc).write_text(performance_doc.render(names), encoding="utf-8")
    print(f"wrote {a.doc} from {len(files)} files")
  return results
