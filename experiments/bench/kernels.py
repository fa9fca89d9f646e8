"""Checks and times the Pallas NVFP4 kernels against same-run baselines (H200).

  PYTHONPATH=. python -m experiments.bench kernels [--only quant,bwdquant,gemm,linear] [--out results/kernels_bench.json]

Prints one table of ratios (median of repeats, one run; each sample times N
calls inside one jitted lax.fori_loop, so host dispatch gaps between short
kernels do not count): quantizer bandwidth vs a TMA copy of the same input
(`copy_kernel`, the memory roofline; XLA's elementwise negate where no
Hopper GPU runs it) and vs
the jitted XLA quantizer; NVFP4 GEMM TFLOP/s vs XLA's bf16 dot and vs
jax.nn.scaled_dot_general(nvfp4) where it runs; the TetraJet-v2 linear
fwd+bwd vs a bf16 linear. Attribution rows say where the time goes: the
default quantizers with the plain hardware division per element (timing
only: not bitwise) and with no tile math (the load+store ceiling); the
linear's forward alone, its six quantizers alone and its three GEMMs alone,
each vs the same bf16 fwd+bwd. Every timed kernel is first checked against
its reference on the same inputs (bitwise for the quantizer, FP32-accumulation
tolerance for the GEMM); a variant that fails its check is reported and not
timed. Each section runs in waves (`run_jobs`): a wave's timing loops
compile side by side, then its rows are measured. Writes the table as JSON with the commit and device name;
`--table FILES` renders saved JSON as markdown.
"""


from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

import jax

from experiments.bench.gemms import GEMM_CONFIGS, GEMM_SHAPES, gemm_jobs
from experiments.bench.jobs import Rows, format_table, markdown_tables, run_jobs
from experiments.bench.layer_parts import DEFAULT_LINEAR_BACKENDS, LINEAR_BACKENDS, LINEAR_SHAPES, linear_jobs
from experiments.bench.quantizers import (QUANT_BASELINES, QUANT_INPUTS, QUANT_SHAPES, backward_quantizer_jobs,
                                         quantizer_jobs)
from experiments.bench.timing import commit_id

def _subset(p: argparse.ArgumentParser, flag: str, value: str, valid: tuple) -> tuple:
  out = tuple(value.split(","))
  bad = sorted(set(out) - set(valid))
  if bad:
    p.error(f"{flag}: unknown {bad}; expected a comma-separated subset of {','.join(valid)}")
  return out


def _shapes(p: argparse.ArgumentParser, flag: str, value: str | None, default: list, dims: int) -> list:
  if not value:
    return default
  try:
    out = [tuple(int(d) for d in s.split("x")) for s in value.split(",")]
  except ValueError:
    out = []
  if not out or any(len(t) != dims for t in out):
    p.error(f"{flag}: expected {dims} sizes joined by 'x', comma-separated, got {value!r}")
  return out


SECTIONS = ("quant", "bwdquant", "gemm", "linear")


def select_rows(jobs: list, pattern: re.Pattern) -> list:
  """--quant-rows: the jobs whose row name matches, and every baseline and check."""
  return [j for j in jobs if pattern.search(j.name) or j.name.startswith(QUANT_BASELINES)
          or j.name.endswith(" check")]


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m experiments.bench kernels", description=__doc__.splitlines()[0])
  p.add_argument("--out", default="results/kernels_bench.json")
  p.add_argument("--log", default=None, help="traceback log (default: next to --out)")
  p.add_argument("--quick", action="store_true", help="first shapes only")
  p.add_argument("--quant-shapes", default=None, help="quantizer shapes, e.g. 16384x4096,16384x1024")
  p.add_argument("--quant-inputs", default=QUANT_INPUTS[0],
                 help=f"quantizer input kinds, comma-separated subset of {','.join(QUANT_INPUTS)}")
  p.add_argument("--quant-tilings", default="",
                 help="quantizer kernels also under these tilings ROWSxSTEPS (rows per tile x TMA pipeline depth; "
                      "the default is 64x2), each checked bitwise against the default, e.g. 64x4,128x2")
  p.add_argument("--quant-rows", default=None, metavar="REGEX",
                 help="quantizer sections: only the kernel rows whose name matches REGEX (re.search); the "
                      "copy and XLA baselines and the kernels' checks always run, e.g. 'triton|rows64_s2$'")
  p.add_argument("--gemm-shapes", default=None, help="GEMM shapes MxKxN (out [M, N]), e.g. 16384x1024x1024")
  p.add_argument("--gemm-configs", default=",".join(GEMM_CONFIGS),
                 help=f"GEMM tilings to check and time, a subset of {','.join(GEMM_CONFIGS)}")
  p.add_argument("--linear-shapes", default=None, help="linear shapes MxKxN, e.g. 16384x1024x4096")
  p.add_argument("--linear-parts-shapes", default=None,
                 help="shapes of the linear's attribution rows (default: --linear-shapes), a subset of them")
  p.add_argument("--linear-backends", default=",".join(DEFAULT_LINEAR_BACKENDS),
                 help=f"backends of the tetrajet_v2 linear rows, a subset of {','.join(LINEAR_BACKENDS)}")
  p.add_argument("--linear-parts-only", action="store_true",
                 help="skip the tetrajet_v2 whole-layer rows (the bf16 baseline stays): attribution only")
  p.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(SECTIONS)}")
  p.add_argument("--table", nargs="+", metavar="JSON", default=None,
                 help="print saved results (JSON files written by --out) as markdown tables and exit")
  return p


def main(argv=None) -> int:
  p = _parser()
  args = p.parse_args(argv)
  if args.table:
    print(markdown_tables([json.loads(Path(f).read_text()) for f in args.table]))
    return 0
  quant_shapes = _shapes(p, "--quant-shapes", args.quant_shapes, QUANT_SHAPES, 2)
  gemm_shapes = _shapes(p, "--gemm-shapes", args.gemm_shapes, GEMM_SHAPES, 3)
  linear_shapes = _shapes(p, "--linear-shapes", args.linear_shapes, LINEAR_SHAPES, 3)
  linear_parts_shapes = _shapes(p, "--linear-parts-shapes", args.linear_parts_shapes, linear_shapes, 3)
  if not set(linear_parts_shapes) <= set(linear_shapes):
    p.error("--linear-parts-shapes: every shape must also be in --linear-shapes (the ratios need its bf16 row)")
  quant_tilings = _shapes(p, "--quant-tilings", args.quant_tilings, [], 2)
  if any(rows % 64 or steps < 1 for rows, steps in quant_tilings):
    p.error("--quant-tilings: rows must be a multiple of 64 and steps at least 1")
  only = None if args.only is None else _subset(p, "--only", args.only, SECTIONS)
  try:
    quant_rows = re.compile(args.quant_rows or "")
  except re.error as e:
    p.error(f"--quant-rows: not a regular expression: {e}")
  keep = lambda jobs: select_rows(jobs, quant_rows)
  quant_inputs = _subset(p, "--quant-inputs", args.quant_inputs, QUANT_INPUTS)
  linear_backends = _subset(p, "--linear-backends", args.linear_backends, LINEAR_BACKENDS)
  gemm_names = _subset(p, "--gemm-configs", args.gemm_configs, tuple(GEMM_CONFIGS))
  gemm_configs = {name: GEMM_CONFIGS[name] for name in gemm_names}
  if args.quick:
    quant_shapes = quant_shapes[:1]
  dev = jax.devices()[0]
  header = dict(commit=commit_id(), device=getattr(dev, "device_kind", str(dev)), jax=jax.__version__,
                date=time.strftime("%Y-%m-%d %H:%M:%S"))
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  rows = Rows(header, args.out)
  with open(args.log or os.path.splitext(args.out)[0] + ".log", "w") as log:
    for section, fn in (("quant", lambda: run_jobs(rows, log, keep(quantizer_jobs(quant_shapes, quant_inputs,
                                                                                    quant_tilings)))),
                        ("bwdquant", lambda: run_jobs(rows, log, keep(backward_quantizer_jobs(
                            quant_shapes, quant_inputs, quant_tilings)))),
                        ("gemm", lambda: run_jobs(rows, log, gemm_jobs(args.quick, gemm_shapes, gemm_configs))),
                        ("linear", lambda: run_jobs(rows, log, linear_jobs(
                            linear_shapes, linear_parts_shapes, linear_backends, not args.linear_parts_only)))):
      if only is None or section in only:
        print(f"--- {section}", flush=True)
        fn()
  print("=" * 30, "summary")
  print(json.dumps(header))
  print(format_table(rows))
  return 0
