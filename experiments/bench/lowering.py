"""Lowering section: how long each Pallas kernel takes to lower for Hopper, on this host.

    python -m experiments.bench lowering [--kernels rtn_bf16,...] [--steps 20m/tetrajet_v2,...] [--out FILE.json]

A Mosaic GPU kernel is lowered in Python (its module emitted, layouts
inferred) every time a jitted function that contains it is lowered, and that
happens before JAX's persistent compilation cache is consulted: every run
pays it, warm cache or not, once per kernel instance in the step. Lowering
for CUDA needs no GPU, so this section runs on any host (the GPU machine's
CPUs or a laptop) and times each kernel at a training shape, beside XLA's
own quantizer lowered for CUDA as the reference. On a GPU host it also times
XLA's compile of the lowered function (where each Mosaic module becomes a
binary).

`--steps MODEL/ARM,...` lowers every function a run of that arm compiles
the same way (`Trainer.lower_run`: each OutControl phase's train step, a
split update's halves, with `--evaluation` the validation passes; blocks
scanned, batch 32 x 1024, backend auto, the kernels' dispatch told it runs
on a Hopper GPU: `kernels._platform.assume_hopper`): the lowering part of
an FP4 run's compile time, on any host, with the number of Mosaic modules
and of custom calls to them (one module can serve several calls; with the
process's lowering cache, `kernels/_lowering_cache.py`, also calls in
different functions; TETRAJET_MOSAIC_LOWERING_CACHE=0 times it without), and of
calls to Pallas Triton kernels (TETRAJET_QUANTIZER_KERNELS=triton puts the
block-scaled quantizers there; the row records which kernels ran). On a GPU
host it then compiles each function, and compiles it again from a fresh
lowering with the process's caches warm, which bounds the share of the
compile that builds the Mosaic kernels' binaries. `--trace-compile` runs the
first compile under `jax.profiler` and lists where the host's time went: each
function's compile seconds and the costliest events the trace names (XLA's
passes, LLVM and ptxas, the Mosaic and Triton kernels' builds, autotuning),
summed over threads.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import time

import jax
import jax.numpy as jnp

from experiments.bench.timing import commit_id, profiled, write_result
from tetrajet_jax import kernels
from tetrajet_jax.kernels import _lowering_cache, _platform
from tetrajet_jax.model import CONFIGS
from tetrajet_jax.numerics import quantize_nvfp4
from tetrajet_jax.train.arms import ARMS

SHAPE = (4096, 4096)  # rows x K: per-tile kernel bodies, so the size barely matters


def _rtn(dtype):
  return lambda x: kernels.quantize_nvfp4_rtn(x.astype(dtype)).codes


def _rht_sr(axis):
  signs = jnp.ones((16,), jnp.float32)
  return lambda x: kernels.quantize_nvfp4_backward(x.astype(jnp.bfloat16), signs, jnp.uint32(7), axis=axis).codes


def _gemm(x):
  a = quantize_nvfp4(x)  # XLA quantizers: the row is the GEMM kernel plus two XLA quantizers
  return kernels.nvfp4_gemm(a, a)


KERNELS = {
    "xla_quantizer": lambda x: quantize_nvfp4(x).codes,  # the reference: no kernel
    "rtn_bf16": _rtn(jnp.bfloat16),
    "rtn_f32": _rtn(jnp.float32),
    "rht_sr_bf16_axis-1": _rht_sr(-1),
    "rht_sr_bf16_axis0": _rht_sr(0),
    "gemm": _gemm,
}


def lower_seconds(name: str) -> dict:
  """Wall time to lower one instance of kernel `name` for CUDA, and the lowered text's size."""
  fn = jax.jit(lambda x: KERNELS[name](x))  # a fresh function: nothing cached from an earlier row
  t0 = time.perf_counter()
  lowered = fn.trace(jax.ShapeDtypeStruct(SHAPE, jnp.float32)).lower(lowering_platforms=("cuda",))
  seconds = time.perf_counter() - t0
  row = dict(kernel=name, lower_s=seconds, text_chars=len(lowered.as_text()))
  if jax.default_backend() == "gpu":  # XLA's compile, which builds each Mosaic module's binary
    t0 = time.perf_counter()
    lowered.compile()
    row["compile_s"] = time.perf_counter() - t0
  return row


def traced_compile(lowered: dict, top: int = 40) -> tuple[dict[str, float], list[dict]]:
  """Compiles each Lowered of `lowered` in turn under `jax.profiler`: ({key: compile seconds},
  the `top` host-trace events with the most summed time: name, count, seconds, threads). Events
  nest (a pass inside its pipeline), so their seconds overlap; threads run at once, so a name's
  seconds can exceed the wall time."""
  seconds = {}

  def compile_each():
    for key, low in lowered.items():
      seconds[str(key)] = _seconds(low.compile)
  _, data = profiled(compile_each, "tetrajet_compile_")
  total, count, threads = collections.Counter(), collections.Counter(), collections.defaultdict(set)
  for plane in data.planes:
    if not plane.name.startswith("/host:"):
      continue
    for line in plane.lines:
      for ev in line.events:
        total[ev.name] += ev.duration_ns
        count[ev.name] += 1
        threads[ev.name].add(line.name)
  events = [dict(name=name, count=count[name], seconds=ns / 1e9, threads=len(threads[name]))
            for name, ns in total.most_common(top)]
  return seconds, events


def step_lower_seconds(model: str, arm: str, layers: int | None = None, batch_size: int = 32,
                       seq_len: int = 1024, evaluation: bool = False, trace_compile: bool = False) -> dict:
  """Wall time to trace and lower for CUDA every function a run of `arm` compiles
  (`Trainer.lower_run`: the train step of each OutControl phase, a split update's halves in each
  OsciReset window phase, and with `evaluation` the validation passes), with the count of Mosaic
  GPU modules (distinct kernel hashes over all functions) and of calls to them."""
  from experiments.bench import train_steps  # pylint: disable=import-outside-toplevel
  spec = dict(model=model, arm=arm, backend="auto", scan_blocks=True, layers=layers, batch_size=batch_size,
              seq_len=seq_len, vocab=16384, steps=2, warmup=2)
  row = dict(step=f"{model}/{arm}", evaluation=evaluation, lowering_cache=_lowering_cache.enabled(),
             quantizer_kernels=_platform.quantizer_kernels())
  on_gpu = jax.default_backend() == "gpu"
  jax.clear_caches()  # each arm from nothing: no kernel lowered for an earlier row is reused
  _lowering_cache.clear()
  with _platform.assume_hopper():
    trainer = train_steps.bench_trainer(spec)
    t0 = time.perf_counter()
    done = []  # when each function's lowering ended: precompile starts its XLA compile then
    phases, lowered = trainer.lower_run(evaluation=evaluation, platforms=("cuda",),
                                        on_lowered=lambda _: done.append(time.perf_counter() - t0))
    row["lower_s"] = time.perf_counter() - t0
    row["lowered_at_s"] = [[key[0], t] for key, t in zip(lowered, done)]  # [kind, seconds], in lowering order
    # The critical path's Python part: the last train step (one per OutControl graph) is lowered.
    row["train_steps_lowered_s"] = max(t for key, t in zip(lowered, done) if key[0] == "train")
    text = [line for low in lowered.values() for line in low.as_text().splitlines()]
    calls = [line for line in text if "custom_call @mosaic_gpu" in line]
    row.update(phases=phases, functions=len(lowered), mosaic_calls=len(calls),
               mosaic_modules=len({re.search(r'kernel_hash = "(.*?)", module', line).group(1) for line in calls}),
               triton_calls=sum("xla.gpu.triton" in line for line in text))
    if on_gpu:
      # XLA's compile of each function, one after the other, then again from a fresh lowering with the
      # process's caches warm (Mosaic's kernel binaries by hash, XLA's autotuning results): the
      # difference is what those caches hold, so compile_s - recompile_s bounds the kernels' build time.
      if trace_compile:
        row["compile_s_per_function"], row["compile_events"] = traced_compile(lowered)
        row["compile_s"] = sum(row["compile_s_per_function"].values())
      else:
        row["compile_s"] = sum(_seconds(low.compile) for low in lowered.values())
      jax.clear_caches()
      again = trainer.lower_run(evaluation=evaluation, platforms=("cuda",))[1]
      row["recompile_s"] = sum(_seconds(low.compile) for low in again.values())
  return row


def table(result: dict) -> str:
  """The whole-run rows as a markdown table (what docs/PERFORMANCE.md shows)."""
  lines = ["| run | quantizer kernels | lowering cache | functions | trace + lower s | Mosaic modules | Mosaic calls "
           "| Triton calls |", "|---|---|---|---:|---:|---:|---:|---:|"]
  for r in result["rows"]:
    if "step" in r:
      cache = {True: "on", False: "off"}.get(r.get("lowering_cache"), "-")
      # Rows written before the Triton quantizers existed ran the Mosaic ones and called no Triton kernel.
      lines.append(f"| {r['step']}{' + validation' if r.get('evaluation') else ''} "
                   f"| {r.get('quantizer_kernels', 'mosaic')} | {cache} | {r.get('functions', '-')} "
                   f"| {r['lower_s']:.1f} | {r['mosaic_modules']} | {r['mosaic_calls']} | {r.get('triton_calls', 0)} |")
  return "\n".join(lines)


def _seconds(fn) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(prog="python -m experiments.bench lowering", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--kernels", default=",".join(KERNELS), help=f"comma list of {', '.join(KERNELS)}")
  p.add_argument("--steps", default="", help="comma list of MODEL/ARM train steps to lower (e.g. 20m/tetrajet_v2)")
  p.add_argument("--layers", type=int, default=None, help="--steps: blocks of the model (default: its own)")
  p.add_argument("--evaluation", action="store_true", help="--steps: lower the run's validation passes too")
  p.add_argument("--trace-compile", action="store_true",
                 help="--steps on a GPU host: trace the first compile and list its costliest host events")
  p.add_argument("--out", default="")
  a = p.parse_args(argv)
  names = a.kernels.split(",") if a.kernels else []
  bad = [n for n in names if n not in KERNELS]
  if bad:
    p.error(f"--kernels: unknown {bad}; known: {', '.join(KERNELS)}")
  steps = [s.split("/") for s in a.steps.split(",")] if a.steps else []
  bad = [s for s in steps if len(s) != 2 or s[0] not in CONFIGS or s[1] not in ARMS]
  if bad:
    p.error(f"--steps: {['/'.join(s) for s in bad]} are not MODEL/ARM with MODEL in {', '.join(CONFIGS)} and ARM "
            f"in {', '.join(ARMS)}")
  rows = []
  for name in names:
    rows.append(lower_seconds(name))
    print(json.dumps(rows[-1]), flush=True)
  for model, arm in steps:
    rows.append(step_lower_seconds(model, arm, layers=a.layers, evaluation=a.evaluation,
                                   trace_compile=a.trace_compile))
    print(json.dumps(rows[-1]), flush=True)
  result = dict(kind="lowering", host_cpus=os.cpu_count(), commit=commit_id(), date=time.strftime("%Y-%m-%d"),
                shape=list(SHAPE), rows=rows)
  print(f"lowering for CUDA on this host ({os.cpu_count()} CPUs), commit {result['commit']}, shape {SHAPE}:")
  for r in rows:
    if "step" in r:
      compiled = (f"; XLA compile {r['compile_s']:.1f} s, {r['recompile_s']:.1f} s again (lowered anew, caches warm)"
                  if "compile_s" in r else "")
      print(f"  {r['step'] + ' run':<28} {r['lower_s']:7.1f} s  {r['functions']} functions, {r['mosaic_modules']} "
            f"Mosaic modules in {r['mosaic_calls']} calls{compiled}; the train steps lowered at "
            f"{r['train_steps_lowered_s']:.1f} s")
      for key, sec in r.get("compile_s_per_function", {}).items():
        print(f"    compile {key}: {sec:.1f} s")
      for ev in r.get("compile_events", []):
        print(f"    {ev['seconds']:8.2f} s {ev['count']:6d}x {ev['threads']:3d} threads  {ev['name'][:90]}")
      continue
    compiled = f"  then {r['compile_s']:.1f} s XLA compile on the GPU" if "compile_s" in r else ""
    print(f"  {r['kernel']:<28} {r['lower_s']:7.1f} s  {r['text_chars']:>9,} chars{compiled}")
  write_result(a.out, result)
  return result
