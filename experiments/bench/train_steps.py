"""Train-step section: tokens/s, compile time and peak memory of whole train steps per arm vs bf16.

    python -m experiments.bench train [--models 20m,70m] [--arms bf16,nvidia_nvfp4,tetrajet_v2,tetrajet_v2_full]
                                      [--backend auto] [--scan-blocks default|on|off]
                                      [--batch-size 32] [--seq-len 1024] [--steps 20] [--out FILE.json]
                                      [--no-oscillation-monitor] [--quantizer-semantics warpgroup,lane]
                                      [--lowering-cache on,off] [--quantizer-kernels mosaic,triton]

Each (model, arm) runs in its own process, one after the other, through the
real `Trainer` (its data pipeline, its one-step-ahead loop, its attention
default) on random tokens: a fresh process per arm means no arm inherits
another's compiled kernels or autotuning results, and the device's peak
memory is that arm's own. Per arm it reports

- compile: wall time of `Trainer.precompile(evaluation=False)`, every train
  step the arm's run compiles (an OutControl arm: its calibrating and frozen
  steps, side by side, as a run does), and where it went by JAX's own
  compile events: tracing, lowering to MLIR (which includes emitting each
  Pallas kernel's Mosaic module) and XLA's backend compile (summed over
  functions compiled in parallel);
- tokens/s and model TFLOP/s over ``--steps`` steady-state steps, after
  ``--warmup`` steps (OutControl arms calibrate on update 0 and are frozen
  from update 1, the phase a run spends nearly all its steps in);
- peak device memory (where the device reports it).

Quantized arms without OsciReset run its oscillation monitor by default, as a
run does (`TrainConfig.monitor_oscillation`): like OsciReset itself, the
second of the two functions of a split update (docs/TRAINING.md), compiled
in parallel with the first and timed with it; `--no-oscillation-monitor`
measures the arm without it.

Per-process variants (`VARIANTS`), each set through the environment of the
arm's worker process, run every quantized arm once per value, so the compile
time and speed of each are measured against the same bf16 row:
`--quantizer-semantics warpgroup,lane` (the lowering semantics of the Mosaic
quantizer kernels, `kernels._platform`), `--lowering-cache on,off` (the
process's Mosaic lowering cache, `kernels/_lowering_cache.py`) and
`--quantizer-kernels mosaic,triton` (the kernels the block-scaled quantizers
run on), `--gemm-tiling` (the tiles of the layer's NVFP4 GEMMs) and
`--backward-operands codes,bf16` (codes, or the bf16 operands the backward
quantizers write for the backward GEMMs).

The bf16 arm is always measured first, with the same model, shapes, attention
and block layout; every ratio is to it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import time
import typing
from typing import Callable

import jax
import jax.monitoring
import numpy as np

from experiments.bench.timing import commit_id, device_name, write_result
from tetrajet_jax.kernels import _lowering_cache, _platform
from tetrajet_jax.linear import recipes
from tetrajet_jax.model import CONFIGS
from tetrajet_jax.train import TrainConfig, TrainData, Trainer
from tetrajet_jax.train.arms import ARMS

RESULT_TAG = "BENCH_TRAIN_RESULT "
SCAN_CHOICES = {"default": None, "on": True, "off": False}
# Long enough that no arm's schedule refuses its OsciReset windows; only the first steps run.
NOMINAL_TOTAL_STEPS = 10_000
# JAX's compile-stage events (jax._src.dispatch) -> the row's key for their summed seconds.
COMPILE_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
                  "/jax/core/compile/backend_compile_duration": "backend_compile_s"}


@dataclasses.dataclass(frozen=True)
class Variant:
  """A setting the kernels read from the environment at import: set in the arm's worker process."""
  key: str  # the spec's, the row's and the settings' key; the CLI flag is --key-with-dashes
  values: tuple[str, ...]
  env: str
  env_value: Callable[[str], str]  # what the environment variable holds for a value
  current: Callable[[], str]  # the value the kernels took in this process
  label: str  # how a row names its value, e.g. "{} semantics"
  help: str

  @property
  def flag(self) -> str:
    return "--" + self.key.replace("_", "-")


VARIANTS = (
    Variant("quantizer_semantics", typing.get_args(_platform.Semantics), _platform.SEMANTICS_ENV, str,
            lambda: _platform.DEFAULT_SEMANTICS, "{} semantics",
            "the Mosaic quantizer kernels' lowering semantics (kernels._platform)"),
    Variant("lowering_cache", ("on", "off"), _lowering_cache.ENV, lambda v: "1" if v == "on" else "0",
            lambda: "on" if _lowering_cache.enabled() else "off", "lowering cache {}",
            "the process's Mosaic lowering cache (kernels/_lowering_cache.py)"),
    Variant("quantizer_kernels", typing.get_args(_platform.QuantizerKernels), _platform.QUANTIZER_KERNELS_ENV, str,
            _platform.quantizer_kernels, "{} quantizers",
            "the kernels the block-scaled quantizers run on (kernels._platform)"),
    Variant("gemm_tiling", typing.get_args(_platform.GemmTiling), _platform.GEMM_TILING_ENV, str,
            _platform.gemm_tiling, "{} GEMM tiles", "the tiles of the layer's NVFP4 GEMMs (kernels._platform)"),
    Variant("backward_operands", typing.get_args(_platform.BackwardOperands), _platform.BACKWARD_OPERANDS_ENV, str,
            _platform.backward_operands, "{} backward operands",
            "what the backward quantizers hand the backward GEMMs (kernels._platform)"),
)


def bench_config(spec: dict) -> TrainConfig:
  """The run an arm is timed in: OutControl calibrates on update 0 and is frozen from update 1."""
  return TrainConfig(model=spec["model"], arm=spec["arm"], batch_size=spec["batch_size"], seq_len=spec["seq_len"],
                     total_steps=NOMINAL_TOTAL_STEPS, backend=spec["backend"], scan_blocks=spec["scan_blocks"],
                     layers=spec["layers"], calib_start=0, calib_steps=1,
                     monitor_oscillation=spec.get("monitor_oscillation", True))


def bench_trainer(spec: dict) -> Trainer:
  """A `Trainer` for the arm on random tokens, enough for its warmup and timed steps."""
  b, t = spec["batch_size"], spec["seq_len"]
  n_tokens = (spec["warmup"] + spec["steps"] + 4) * b * t + 1
  rng = np.random.default_rng(0)
  data = TrainData(train_tokens=rng.integers(0, spec["vocab"], n_tokens, dtype=np.uint16),
                   val_tokens=rng.integers(0, spec["vocab"], 2 * b * t + 1, dtype=np.uint16),
                   vocab_size=spec["vocab"])
  return Trainer(bench_config(spec), data, progress=False, tensorboard=False)


def measure(spec: dict) -> dict:
  """One arm's figures, in this process (the worker side)."""
  for v in VARIANTS:
    want = spec.get(v.key)
    if want and v.current() != want:
      raise RuntimeError(f"{v.key} is {v.current()!r} in this process, not {want!r}: {v.env} did not reach it")
  trainer = bench_trainer(spec)
  stages = dict.fromkeys(COMPILE_EVENTS.values(), 0.0)

  def on_event(event: str, seconds: float, **kwargs) -> None:
    if event in COMPILE_EVENTS:
      stages[COMPILE_EVENTS[event]] += seconds

  jax.monitoring.register_event_duration_secs_listener(on_event)
  t0 = time.perf_counter()
  phases = trainer.precompile(evaluation=False)
  compile_s = time.perf_counter() - t0
  jax.monitoring.unregister_event_duration_listener(on_event)
  t0 = time.perf_counter()
  trainer.train(spec["warmup"])
  warmup_s = time.perf_counter() - t0
  trainer.train(spec["steps"])
  last = trainer.history[-1]
  stats = jax.devices()[0].memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  return dict(kind="train", model=spec["model"], arm=spec["arm"], **_variant_values(spec),
              phases=phases, compile_s=compile_s,
              compile_stages=stages, warmup_s=warmup_s,
              tokens_per_s=last["perf/tokens_per_s"], model_tflops_per_s=last["perf/model_tflops_per_s"],
              step_ms=last["perf/step_time_s"] * 1e3, peak_gib=None if peak is None else peak / 2**30,
              loss=last["train/loss"], attention=trainer.model_config.attention,
              scan_blocks=trainer.model().scan_blocks, device=device_name())


def run_arm(spec: dict) -> dict:
  """`measure` in a fresh process; a failure becomes a row with its error (the other arms go on)."""
  env = dict(os.environ)
  for v in VARIANTS:  # the kernels read these at import, in the worker
    if spec.get(v.key):
      env[v.env] = v.env_value(spec[v.key])
  proc = subprocess.run([sys.executable, "-m", "experiments.bench.train_steps", json.dumps(spec)],
                        capture_output=True, text=True, check=False, env=env)
  for line in proc.stdout.splitlines():
    if line.startswith(RESULT_TAG):
      return json.loads(line[len(RESULT_TAG):])
  tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
  return dict(kind="train", model=spec["model"], arm=spec["arm"], **_variant_values(spec),
              error=f"rc {proc.returncode}: {' | '.join(tail)}"[:400])


def with_ratios(rows: list[dict]) -> list[dict]:
  """Adds tokens/s and compile-time ratios to the same model's bf16 row."""
  base = {r["model"]: r for r in rows if r["arm"] == "bf16" and "error" not in r}
  for r in rows:
    b = base.get(r["model"])
    if b is not None and "error" not in r:
      r["vs_bf16_tokens_per_s"] = r["tokens_per_s"] / b["tokens_per_s"]
      r["vs_bf16_compile"] = r["compile_s"] / b["compile_s"]
  return rows


def _variant_values(spec: dict) -> dict:
  return {v.key: spec.get(v.key) for v in VARIANTS}


def _label(row: dict) -> str:
  """The arm, with each variant's value where the run chose one."""
  return row["arm"] + "".join(f" ({v.label.format(row[v.key])})" for v in VARIANTS if row.get(v.key))


def table(result: dict) -> str:
  """The rows as a markdown table (also what docs/PERFORMANCE.md shows)."""
  lines = ["| model | arm | tokens/s | vs bf16 | model TFLOP/s | compile s | vs bf16 | of which lowering s | peak GiB |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in result["rows"]:
    if "error" in r:
      lines.append(f"| {r['model']} | {_label(r)} | failed: {r['error']} | | | | | | |")
      continue
    peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
    lowering = r.get("compile_stages", {}).get("lower_s")  # absent in files written before it was measured
    lowering = "-" if lowering is None else f"{lowering:.1f}"
    lines.append(f"| {r['model']} | {_label(r)} | {r['tokens_per_s']:,.0f} | {r['vs_bf16_tokens_per_s']:.2f}x | "
                 f"{r['model_tflops_per_s']:.1f} | {r['compile_s']:.1f} | {r['vs_bf16_compile']:.1f}x | {lowering} | {peak} |")
  return "\n".join(lines)


def parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m experiments.bench train", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--models", default="20m,70m")
  p.add_argument("--arms", default="bf16,nvidia_nvfp4,tetrajet_v2,tetrajet_v2_full",
                 help="comma list; bf16 (the baseline) is always run first")
  p.add_argument("--backend", default="auto", choices=recipes.BACKENDS, help="backend of the quantized linears")
  p.add_argument("--scan-blocks", default="default", choices=SCAN_CHOICES,
                 help="blocks as one lax.scan (on), unrolled (off), or the trainer's default per platform")
  p.add_argument("--layers", type=int, default=None, help="override the model's number of blocks")
  p.add_argument("--no-oscillation-monitor", action="store_true",
                 help="quantized arms without OsciReset skip the oscillation monitor (TrainConfig."
                      "monitor_oscillation=False), which quantizes every weight twice in XLA inside the step")
  for v in VARIANTS:
    p.add_argument(v.flag, default="", help=f"comma list of {','.join(v.values)}: each quantized arm once per "
                                            f"value of {v.help} (default: the process default, unlabelled)")
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--seq-len", type=int, default=1024)
  p.add_argument("--vocab", type=int, default=16384, help="vocabulary of the random tokens (the BPE's size)")
  p.add_argument("--steps", type=int, default=20, help="timed steps per arm")
  p.add_argument("--warmup", type=int, default=3, help="steps before timing (>= 2: past OutControl's calibration)")
  p.add_argument("--out", default="")
  a = p.parse_args(argv)
  models, arms = a.models.split(","), a.arms.split(",")
  for name, given, known in (("--models", models, CONFIGS), ("--arms", arms, ARMS)):
    bad = [v for v in given if v not in known]
    if bad:
      p.error(f"{name}: unknown {bad}; known: {', '.join(known)}")
  if a.warmup < 2 or a.steps < 2:
    p.error("--warmup and --steps must be >= 2 (the first timed step only starts the clock)")
  if not 0 < a.vocab <= 2**16:
    p.error("--vocab must be in 1..65536 (tokens are stored as uint16)")
  choices = []  # per variant: the values asked for, or [None] (the process default)
  for v in VARIANTS:
    given = getattr(a, v.key)
    values = given.split(",") if given else [None]
    bad = [x for x in values if x not in v.values and x is not None]
    if bad:
      p.error(f"{v.flag}: unknown {bad}; known: {', '.join(v.values)}")
    choices.append(values)
  arms = ["bf16"] + [arm for arm in arms if arm != "bf16"]
  specs = [dict(model=model, arm=arm, backend=a.backend, scan_blocks=SCAN_CHOICES[a.scan_blocks], layers=a.layers,
                monitor_oscillation=not a.no_oscillation_monitor, **dict(zip((v.key for v in VARIANTS), values)),
                batch_size=a.batch_size, seq_len=a.seq_len, vocab=a.vocab, steps=a.steps, warmup=a.warmup)
           for model in models for arm in arms
           for values in ([[None] * len(VARIANTS)] if arm == "bf16" else itertools.product(*choices))]
  for spec in specs:  # every configuration is checked before any arm runs
    try:
      bench_config(spec)
    except ValueError as e:
      p.error(f"{spec['model']}/{spec['arm']}: {e}")
  return a, specs


def main(argv=None) -> dict:
  """Runs every (model, arm) in turn; this process never touches the device (the workers own it)."""
  a, specs = parse_args(argv)
  rows = []
  for spec in specs:
    rows.append(run_arm(spec))
    print(json.dumps(rows[-1]), flush=True)
  devices = [r["device"] for r in rows if "device" in r]
  result = dict(device=devices[0] if devices else "unknown", commit=commit_id(), date=time.strftime("%Y-%m-%d"),
                settings=dict(backend=a.backend, scan_blocks=a.scan_blocks, layers=a.layers,
                              **{v.key: getattr(a, v.key) or None for v in VARIANTS},
                              oscillation_monitor=not a.no_oscillation_monitor, batch_size=a.batch_size,
                              seq_len=a.seq_len, vocab=a.vocab, steps=a.steps, warmup=a.warmup),
                rows=with_ratios(rows))
  print(f"device {result['device']}, commit {result['commit']}; {a.batch_size} x {a.seq_len} tokens per step, "
        f"backend {a.backend}, scan blocks {a.scan_blocks}")
  print(table(result))
  write_result(a.out, result)
  return result


if __name__ == "__main__":  # the worker: one arm, its figures on one tagged line
  print(RESULT_TAG + json.dumps(measure(json.loads(sys.argv[1]))), flush=True)
