"""Profile section: where one arm's train step spends its GPU time.

    python -m experiments.bench profile [--model 20m] [--arm tetrajet_v2] [--backend auto]
                                        [--scan-blocks on] [--no-oscillation-monitor]
                                        [--steps 5] [--top 30] [--out FILE.json]

A worker process builds the arm's `Trainer` as `python -m experiments.bench
train` does (random tokens, the same config), compiles it with XLA's
optimized-HLO dump on and XLA's command buffers (CUDA graphs) off, so that
the trace names each kernel's instruction, runs its warmup steps, then ``--steps`` steps under
`jax.profiler`. Every GPU kernel of the trace is matched to the HLO
instruction that launched it (the trace's `hlo_op` stat) and that
instruction to the innermost frame of this project (or optax / flax) in its
source location, so the time is reported

- per part: the Pallas kernels by name, cuDNN attention, cuBLAS GEMMs, and
  XLA-fused code by the source file it comes from (the XLA quantizer,
  OsciReset, the model, the optimizer, ...);
- per instruction: the ``--top`` costliest, with kind, result shape and
  source line.

Times are summed kernel durations per step (streams may overlap; the busy
time, the union of kernel intervals, is given as well). GPU only: the CPU
backend has no device trace to read.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from experiments.bench import train_steps
from experiments.bench.timing import commit_id, device_name, profiled, write_result
from tetrajet_jax.linear import recipes
from tetrajet_jax.model import CONFIGS
from tetrajet_jax.train.arms import ARMS

RESULT_TAG = "BENCH_PROFILE_RESULT "
# The functions an update runs (`tetrajet_jax.train.step`): whole, or split around OsciReset.
STEP_FUNCTIONS = ("train_step", "update_step", "oscillation_step")
# Innermost source frame -> part of the step, first match wins (paths relative to site-packages or the repo).
PARTS = (("tetrajet_jax/kernels/nvfp4_gemm.py", "FP4 GEMM (Pallas)"),
         ("tetrajet_jax/kernels/nvfp4_quantize_backward.py", "backward quantizer (Pallas)"),
         ("tetrajet_jax/kernels/nvfp4_quantize.py", "RTN quantizer (Pallas)"),
         ("tetrajet_jax/optim/", "OsciReset / oscillation monitor"),
         ("tetrajet_jax/numerics/", "XLA numerics (quantize, decode)"),
         ("tetrajet_jax/linear/", "linear layer, XLA part"),
         ("tetrajet_jax/nn/", "linear layer, XLA part"),
         ("tetrajet_jax/model/", "model (embedding, norms, attention glue, MLP, loss)"),
         ("tetrajet_jax/train/", "train step (loss, metrics, OutControl)"),
         ("optax/", "optimizer (optax)"),
         ("flax/", "flax"))
PARTS_BY_PREFIX = dict(PARTS)
# jit names in a Pallas call's op name -> part.
PALLAS_KERNELS = (("nvfp4_gemm", "FP4 GEMM (Pallas)"), ("_backward_instance", "backward quantizer (Pallas)"),
                  ("quantize_nvfp4_rtn", "RTN quantizer (Pallas)"))
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")


def _stack_tables(text: str) -> tuple[dict, dict, dict]:
  """(file names, file locations, stack frames) of an HLO text dump's header tables, by id."""
  files, locations, frames = {}, {}, {}
  section = None
  for line in text.splitlines():
    if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      section = line
      continue
    if not line.strip():
      if section == "StackFrames":
        break
      continue
    m = re.match(r"^(\d+) (.*)$", line)
    if not m or section is None:
      continue
    key, rest = int(m.group(1)), m.group(2)
    if section == "FileNames":
      files[key] = rest.strip('"')
    elif section == "FileLocations":
      loc = dict(re.findall(r"(\w+)=(\d+)", rest))
      locations[key] = (int(loc["file_name_id"]), int(loc.get("line", 0)))
    elif section == "StackFrames":
      fr = dict(re.findall(r"(\w+)=(\d+)", rest))
      frames[key] = (int(fr["file_location_id"]), int(fr["parent_frame_id"]))
  return files, locations, frames


def _short_path(path: str) -> str:
  for marker in ("site-packages/", "/tetrajet_jax/", "/experiments/"):
    i = path.find(marker)
    if i >= 0:
      return path[i + len("site-packages/"):] if marker == "site-packages/" else path[i + 1:]
  return path


def hlo_sources(text: str) -> dict[str, dict]:
  """{instruction name: {kind, target, source, part}} of an optimized HLO text dump.

  `source` is the innermost frame in this project, optax or flax ("file:line"),
  `part` its entry in PARTS; custom calls are named by their target.
  """
  files, locations, frames = _stack_tables(text)

  def frame_chain(fid: int):
    seen = set()
    while fid in frames and fid not in seen:
      seen.add(fid)
      loc_id, parent = frames[fid]
      file_id, line = locations.get(loc_id, (0, 0))
      yield _short_path(files.get(file_id, "?")), line
      fid = parent

  out = {}
  for line in text.splitlines():
    m = _INSTRUCTION.match(line)
    if not m:
      continue
    name, rest = m.groups()
    kind = re.search(r"\b(fusion|custom-call|copy|transpose|all-reduce|reduce|sort|scatter|gather|while|"
                     r"conditional|convolution|dot)\(", rest)
    target = re.search(r'custom_call_target="([^"]+)"', rest)
    frame = re.search(r"stack_frame_id=(\d+)", rest)
    op_name = re.search(r'op_name="([^"]+)"', rest)
    source, part = "", None
    if frame:
      for path, ln in frame_chain(int(frame.group(1))):
        hit = next((p for prefix, p in PARTS if path.startswith(prefix)), None)
        if hit and part is None:
          source, part = f"{path}:{ln}", hit
    if op_name and "/osci_reset/" in op_name.group(1):  # its named scope: the quantizers it calls too
      part = PARTS_BY_PREFIX["tetrajet_jax/optim/"]
    if target and target.group(1).startswith("mosaic_gpu"):
      # A Pallas call's frames end at its caller; the kernel is named in the op name (its jit).
      name_stack = op_name.group(1) if op_name else ""
      part = next((p for key, p in PALLAS_KERNELS if key in name_stack), "Pallas kernel (other)")
    elif target and "cudnn" in target.group(1):
      part = "attention (cuDNN)"
    elif target and "cublas" in target.group(1):
      part = "GEMM (cuBLAS)"
    shape = rest[:kind.start()].strip() if kind else ""
    out[name] = dict(kind=kind.group(1) if kind else "", target=target.group(1) if target else "",
                     shape=shape if len(shape) <= 120 else shape[:117] + "...", source=source,
                     part=part or "other XLA")
  return out


def _busy_ns(intervals: list[tuple[float, float]]) -> float:
  """Length of the union of [start, end) intervals."""
  total, end = 0.0, float("-inf")
  for s, e in sorted(intervals):
    if e <= end:
      continue
    total += e - max(s, end)
    end = e
  return total


def kernel_times(data) -> tuple[dict[str, float], float, list[str]]:
  """({hlo op or kernel name: summed ns}, busy ns, GPU plane's line names) of a profiler trace
  (`jax.profiler.ProfileData`)."""
  plane = next((p for p in data.planes if p.name.startswith("/device:GPU")), None)
  if plane is None:
    raise RuntimeError(f"no GPU plane in the trace: planes {[p.name for p in data.planes]}")
  by_op: dict[str, float] = collections.defaultdict(float)
  intervals, line_names = [], []
  for line in plane.lines:
    line_names.append(line.name)
    if not line.name.startswith("Stream"):
      continue
    for ev in line.events:
      stats = dict(ev.stats)
      op = stats.get("hlo_op") or ev.name
      by_op[str(op)] += ev.duration_ns
      intervals.append((ev.start_ns, ev.end_ns))
  return dict(by_op), _busy_ns(intervals), line_names


def attribute(by_op: dict[str, float], modules: dict[str, dict[str, dict]], steps: int
              ) -> tuple[str | None, dict[str, float], list[dict]]:
  """(modules that ran, {part: ms per step} costliest first, instructions costliest first) of the
  traced {instruction: ns}. Of the modules of one step function (`STEP_FUNCTIONS`, read off the
  module's name), the one that ran is the one naming most of the traced time: instruction names
  repeat across modules (an OutControl arm compiles a step per phase). A split update runs two
  functions; an instruction name both of theirs hold goes to the one naming more traced time."""
  traced = lambda m: sum(ns for op, ns in by_op.items() if op in modules[m])
  groups: dict[str | None, list[str]] = collections.defaultdict(list)
  for m in modules:
    groups[next((f for f in STEP_FUNCTIONS if f"jit_{f}" in m), None)].append(m)
  ran = sorted((max(g, key=traced) for g in groups.values()), key=traced, reverse=True)
  sources: dict[str, dict] = {}
  for m in reversed(ran):  # the costliest module's entries win
    sources.update(modules[m])
  parts: dict[str, float] = collections.defaultdict(float)
  ops = []
  for op, ns in by_op.items():
    info = sources.get(op, dict(kind="", target="", shape="", source="", part="unattributed (not in the step's HLO)"))
    parts[info["part"]] += ns / steps / 1e6
    ops.append(dict(op=op, ms_per_step=ns / steps / 1e6, **info))
  ops.sort(key=lambda o: -o["ms_per_step"])
  return ", ".join(ran) or None, dict(sorted(parts.items(), key=lambda kv: -kv[1])), ops


def measure(spec: dict) -> dict:
  """The worker: compile with the HLO dump on (set by the parent), profile the steps, attribute the time."""
  trainer = train_steps.bench_trainer(spec)
  trainer.precompile(evaluation=False)
  trainer.train(spec["warmup"])
  wall_s, trace = profiled(lambda: trainer.train(spec["steps"]), "tetrajet_profile_")
  by_op, busy_ns, line_names = kernel_times(trace)
  modules = {}
  paths = [p for name in STEP_FUNCTIONS
           for p in glob.glob(os.path.join(spec["dump_dir"], f"*jit_{name}*after_optimizations.txt"))]
  for path in sorted(paths):
    with open(path, encoding="utf-8") as f:  # every compiled step function (OutControl: one per phase)
      modules[os.path.basename(path)] = hlo_sources(f.read())
  steps = spec["steps"]
  ran, parts, ops = attribute(by_op, modules, steps)
  last = trainer.history[-1]
  return dict(kind="profile", device=device_name(), model=spec["model"], arm=spec["arm"], backend=spec["backend"],
              scan_blocks=spec["scan_blocks"], oscillation_monitor=spec["monitor_oscillation"], steps=steps,
              step_ms=last["perf/step_time_s"] * 1e3, profiled_wall_ms_per_step=wall_s / steps * 1e3,
              kernel_ms_per_step=sum(by_op.values()) / steps / 1e6, busy_ms_per_step=busy_ns / steps / 1e6,
              parts=parts, ops=ops[:spec["top"]], gpu_lines=line_names, hlo_module=ran,
              variants={v.key: v.current() for v in train_steps.VARIANTS})


def table(result: dict) -> str:
  # The kernels' environment settings (e.g. the GEMM tiles); files written before they were recorded have none.
  labels = {v.key: v.label for v in train_steps.VARIANTS}
  variants = "".join(f", {labels[k].format(v)}" for k, v in result.get("variants", {}).items() if k in labels)
  lines = [f"{result['model']} {result['arm']} (backend {result['backend']}, oscillation monitor "
           f"{'on' if result['oscillation_monitor'] else 'off'}{variants}): step {result['step_ms']:.1f} ms, kernels "
           f"{result['kernel_ms_per_step']:.1f} ms summed, GPU busy {result['busy_ms_per_step']:.1f} ms per step",
           "", "| part | ms/step | share of kernel time |", "|---|---:|---:|"]
  total = result["kernel_ms_per_step"] or 1.0
  lines += [f"| {k} | {v:.2f} | {v / total:.0%} |" for k, v in result["parts"].items()]
  lines += ["", "| instruction | kind | result | ms/step | part | source |", "|---|---|---|---:|---|---|"]
  lines += [f"| {o['op']} | {o['target'] or o['kind']} | `{o.get('shape', '')}` | {o['ms_per_step']:.3f} | "
            f"{o['part']} | {o['source']} |" for o in result["ops"]]
  return "\n".join(lines)


def parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m experiments.bench profile", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", default="20m", choices=sorted(CONFIGS))
  p.add_argument("--arm", default="tetrajet_v2", choices=sorted(ARMS))
  p.add_argument("--backend", default="auto", choices=recipes.BACKENDS)
  p.add_argument("--scan-blocks", default="on", choices=train_steps.SCAN_CHOICES)
  p.add_argument("--no-oscillation-monitor", action="store_true")
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--seq-len", type=int, default=1024)
  p.add_argument("--vocab", type=int, default=16384)
  p.add_argument("--steps", type=int, default=5, help="profiled steps")
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--top", type=int, default=30, help="instructions listed")
  p.add_argument("--out", default="")
  a = p.parse_args(argv)
  if a.steps < 1 or a.warmup < 2:
    p.error("--steps must be >= 1 and --warmup >= 2")
  spec = dict(model=a.model, arm=a.arm, backend=a.backend, scan_blocks=train_steps.SCAN_CHOICES[a.scan_blocks],
              layers=None, monitor_oscillation=not a.no_oscillation_monitor, batch_size=a.batch_size,
              seq_len=a.seq_len, vocab=a.vocab, steps=a.steps, warmup=a.warmup, top=a.top)
  try:
    train_steps.bench_config(spec)
  except ValueError as e:
    p.error(str(e))
  return a, spec


def main(argv=None) -> dict:
  a, spec = parse_args(argv)
  spec["dump_dir"] = tempfile.mkdtemp(prefix="tetrajet_hlo_")
  env = dict(os.environ)
  # Without command buffers: inside a CUDA graph the trace names the graph, not the instruction.
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_dump_to={spec['dump_dir']} --xla_dump_hlo_as_text"
                      f" --xla_dump_hlo_module_re=.*({'|'.join(STEP_FUNCTIONS)}).*"
                      " --xla_gpu_enable_command_buffer=").strip()
  try:
    proc = subprocess.run([sys.executable, "-m", "experiments.bench.step_profile", json.dumps(spec)],
                          capture_output=True, text=True, check=False, env=env)
  finally:
    shutil.rmtree(spec["dump_dir"], ignore_errors=True)
  found = [line[len(RESULT_TAG):] for line in proc.stdout.splitlines() if line.startswith(RESULT_TAG)]
  if not found:
    sys.stderr.write(proc.stderr[-4000:])
    raise SystemExit(f"profile worker failed (rc {proc.returncode})")
  result = dict(commit=commit_id(), date=time.strftime("%Y-%m-%d"), **json.loads(found[0]))
  print(table(result))
  write_result(a.out, result)
  return result


if __name__ == "__main__":  # the worker
  print(RESULT_TAG + json.dumps(measure(json.loads(sys.argv[1]))), flush=True)
