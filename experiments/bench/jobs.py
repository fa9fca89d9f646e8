"""The bench harness: jobs checked then timed wave by wave, result rows and tables."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
import traceback
from collections.abc import Callable

import jax
import numpy as np

from experiments.bench.timing import compile_loops, time_fn


def _record_failure(rows: list, log, label: str, e: Exception, **row) -> None:
  """Logs the traceback and adds a failed row, so one broken variant does not stop the run."""
  log.write(f"{label}:\n{traceback.format_exc()}\n")
  rows.append(dict(row, ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"))


def _nbytes(tree) -> int:
  return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def _same_bits(a, b) -> bool:
  a, b = np.asarray(a), np.asarray(b)
  if a.dtype != b.dtype or a.shape != b.shape:
    return False
  return bool((a.view(np.uint8) == b.view(np.uint8)).all())


def _tensors_equal(t, r) -> bool:
  return (_same_bits(t.codes, r.codes) and _same_bits(t.scale_inner, r.scale_inner)
          and _same_bits(t.scale_outer, r.scale_outer))


def code_agreement(a, b) -> float:
  """Fraction of equal 4-bit codes of two packed code arrays (both nibbles)."""
  a, b = np.asarray(a), np.asarray(b)
  return float(((a & 0xF) == (b & 0xF)).mean() + ((a >> 4) == (b >> 4)).mean()) / 2


@dataclasses.dataclass
class Job:
  """One timed function of a section.

  key: (name, shape); later jobs' checks and rows read `outs` / `times` by
  key. check(out, outs) -> None or why the output is wrong (then the job
  is reported, not timed). row(dt, out, times) -> the result row, or None for a
  job that is only a baseline or a check. timed=False: run and check only
  (row, if any, is then called with dt=None).
  args_from: the key of an earlier job whose output is this job's arguments
  (args then only give their shapes, for compiling). wave: consecutive jobs
  with the same label compile together (`run_jobs`).
  """
  key: tuple
  fn: Callable
  args: tuple
  args_from: tuple | None = None
  row: Callable | None = None
  check: Callable | None = None
  timed: bool = True
  inner: int = 10
  reps: int = 15
  kind: str = "quant"
  wave: str = ""

  @property
  def name(self) -> str:
    return self.key[0]


def run_jobs(rows: list, log, jobs: list[Job]) -> None:
  """Runs the jobs wave by wave (consecutive jobs with the same `wave` label).

  Per wave: every timing loop compiles side by side (compile_loops), then
  each job runs, is checked and is timed, one at a time, in order. Each loop's
  output is its function's output (the arguments do not change between
  calls), so the checks read the very executable that is timed, and no kernel
  is compiled twice. Why waves: a wave's rows come only after all its
  compiles, and a layer on the Pallas kernels alone takes minutes to compile on the
  GPU host, so builders give expensive jobs a wave of their own, after the
  cheap ones, and a call cut off by its time limit keeps every earlier wave.
  """
  outs, times = {}, {}
  for label, wave in itertools.groupby(jobs, key=lambda j: j.wave):
    wave = list(wave)
    t0 = time.perf_counter()
    loops = compile_loops([(j.fn, j.args, j.inner) for j in wave])
    print(f"wave {label or '-'}: {len(wave)} timing loops compiled in {time.perf_counter() - t0:.0f} s", flush=True)
    for j, loop in zip(wave, loops):
      _run_job(rows, log, j, loop, outs, times)


def _run_job(rows: list, log, j: Job, loop, outs: dict, times: dict) -> None:
  shape = j.key[1]
  try:
    if isinstance(loop, Exception):
      raise loop
    args = j.args
    if j.args_from is not None:
      if j.args_from not in outs:
        raise RuntimeError(f"no arguments: {j.args_from[0]} did not run")
      args = outs[j.args_from]
    out = loop(*args)
    why = j.check(out, outs) if j.check else None
    if why:
      rows.append(dict(kind=j.kind, name=j.name, shape=shape, ok=False, error=why))
      return
    outs[j.key] = out
    if j.timed:
      times[j.key] = time_fn(j.fn, *args, reps=j.reps, loop=loop)
    row = j.row(times.get(j.key), out, times) if j.row else None
    if row is not None:
      rows.append(row)
  except Exception as e:  # noqa: BLE001 - report and keep measuring the rest
    _record_failure(rows, log, f"{j.name} {shape}", e, kind=j.kind, name=j.name, shape=shape)
  finally:
    log.flush()


def _label(jobs: list[Job], start: int, wave: str) -> None:
  """Puts the jobs from `start` on that have no wave yet into `wave`."""
  for j in jobs[start:]:
    j.wave = j.wave or wave


class Rows(list):
  """The result rows: each appended row is printed and the JSON file rewritten
  at once, so a run cut off by a time limit (each Mosaic compile takes tens of
  seconds on the GPU host) still leaves every row it measured."""

  def __init__(self, header: dict, out: str):
    super().__init__()
    self.header, self.out = header, out

  def append(self, row: dict) -> None:
    super().append(row)
    print(format_table([row]), flush=True)
    with open(self.out + ".tmp", "w") as f:
      json.dump(dict(self.header, rows=list(self)), f, indent=1, default=str)
    os.replace(self.out + ".tmp", self.out)


def format_table(rows: list) -> str:
  lines = []
  for r in rows:
    shape = "x".join(map(str, r.get("shape", ()))) or "-"
    if not r.get("ok"):
      lines.append(f"{r['kind']:<10} {r['name']:<48} {shape:<18} FAILED/SKIPPED {r.get('error', '')}"
                   f"{' rel_err=%.2e' % r['rel_err'] if 'rel_err' in r else ''}")
    elif r["kind"] == "quant":
      lines.append(f"quant      {r['name']:<48} {shape:<18} {r['ms']:8.3f} ms {r['gbps']:7.0f} GB/s "
                   f"vs_copy={r['vs_copy']:.2f} vs_xla={r['vs_xla']:.2f}")
    elif r["kind"] == "gemm":
      lines.append(f"gemm       {r['name']:<48} {shape:<18} {r['ms']:8.3f} ms {r['tflops']:6.0f} TFLOP/s "
                   f"vs_bf16={r['vs_bf16']:.2f}")
    elif r["kind"] == "linear":
      lines.append(f"linear     {r['name']:<48} {shape:<18} {r['ms']:8.3f} ms time/bf16={r['vs_bf16']:.2f}")
    elif r["kind"] == "gemm_check":
      lines.append(f"check      {r['name']:<48} ok rel_err={r['rel_err']:.2e}")
  return "\n".join(lines)


def markdown_tables(results: list) -> str:
  """Markdown tables (quantizers, GEMMs, linear layer) of saved bench results
  (the JSON files `main` writes), with each file's commit, device and date."""
  cols = {
      "quant": (["quantizer", "shape", "ms", "GB/s", "vs same-run copy", "vs XLA quantizer"],
                lambda r: [f"{r['ms']:.3f}", f"{r['gbps']:.0f}", f"{r['vs_copy']:.2f}", f"{r['vs_xla']:.2f}"]),
      "gemm": (["GEMM", "M x K x N", "ms", "TFLOP/s", "vs XLA bf16 dot"],
               lambda r: [f"{r['ms']:.3f}", f"{r['tflops']:.0f}", f"{r['vs_bf16']:.2f}"]),
      "linear": (["linear fwd+bwd", "M x K x N", "ms", "time / bf16 linear"],
                 lambda r: [f"{r['ms']:.3f}", f"{r['vs_bf16']:.2f}"]),
  }
  out = []
  for res in results:
    src = f"commit {res.get('commit')}, {res.get('device')}, jax {res.get('jax')}, {res.get('date')}"
    for kind, (header, cells) in cols.items():
      rows = [r for r in res["rows"] if r.get("kind") == kind]
      if not rows:
        continue
      out += [f"{kind} ({src}):", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
      for r in rows:
        shape = "x".join(map(str, r.get("shape", ()))) or "-"
        vals = cells(r) if r.get("ok") else ["-"] * (len(header) - 3) + [f"failed: {r.get('error', '')[:80]}"]
        out.append("| " + " | ".join([r["name"], shape] + vals) + " |")
      copies = [f"{'x'.join(map(str, r['shape']))} {r['name'].split()[-1]}: {r['copy_gbps']:.0f} GB/s"
                for r in rows if "copy_gbps" in r]
      out += ([""] + ["Same-run copy bandwidth: " + "; ".join(copies) + "."] if copies else []) + [""]
    def check_text(r):
      if "rel_err" not in r:  # the check itself raised
        return f"{r['name']}: failed: {r.get('error', '')[:80]}"
      return f"{r['name']}: {r['rel_err']:.1e}{'' if r.get('ok') else ' (FAILED)'}"
    checks = [check_text(r) for r in res["rows"] if r.get("kind") == "gemm_check"]
    if checks:
      out += ["GEMM checks before timing (max relative error vs f32 HIGHEST): " + "; ".join(checks) + ".", ""]
  return "\n".join(out)
