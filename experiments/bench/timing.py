"""Timing helpers shared by the benchmarks.

Device work is asynchronous: every sample blocks on the outputs; compilation
and first-call effects are excluded by warm-up calls; calls are timed inside
one jitted loop; the median of repeats is reported. Speed is only ever
reported as a ratio to a baseline timed in the same process.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

REPO_ROOT = Path(__file__).resolve().parents[2]


def _looped(fn, n: int):
  """jit of: n calls of fn(*args) inside one lax.fori_loop (one dispatch).

  Host dispatch gaps between short calls would otherwise inflate the timing
  of every short kernel. The arguments pass through an optimization barrier together
  with the loop index, so XLA cannot hoist the loop-invariant call out of the
  loop; the last call's output is the loop's result, so no call is dead code.
  """
  def run(*args):
    out0 = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(fn, *args))

    def body(i, _):
      a = lax.optimization_barrier((args, i))[0]
      return fn(*a)
    return lax.fori_loop(0, n, body, out0)
  return jax.jit(run)


def compile_loops(jobs: list, workers: int = 8) -> list:
  """AOT-compiles the timing loop of each job (fn, args, inner) side by side.

  Returns, per job, the compiled loop (pass it to `time_fn(..., loop=)`) or the
  exception its tracing or compilation raised. Why threads: a benchmark's
  compiles (XLA's, and Mosaic GPU's kernels inside them) take tens of seconds
  each on the GPU host, and XLA compiles
  outside the GIL, so loops compiled side by side finish well before the
  same loops one by one (docs/notes/kernels.md). One large program still
  compiles at its own pace. `args` may be ShapeDtypeStructs.
  """
  def one(job):
    fn, args, inner = job
    try:
      return _looped(fn, inner).lower(*args).compile()
    except Exception as e:  # noqa: BLE001 - the caller reports it per job
      return e
  with ThreadPoolExecutor(max(1, min(workers, len(jobs)))) as ex:
    return list(ex.map(one, jobs))


def time_fn(fn, *args, reps: int = 15, inner: int = 10, loop=None) -> float:
  """Median seconds per call: each sample runs `inner` calls in one jitted loop, after warm-up.

  loop: that loop already compiled by `compile_loops` for these args (fn and
  inner are then unused)."""
  loop = _looped(fn, inner) if loop is None else loop
  jax.block_until_ready(loop(*args))
  jax.block_until_ready(loop(*args))
  samples = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(loop(*args))
    samples.append((time.perf_counter() - t0) / inner)
  return statistics.median(samples)


def profiled(fn: Callable[[], object], prefix: str) -> tuple[float, jax.profiler.ProfileData]:
  """Runs fn() under `jax.profiler`, tracing into a scratch directory that is removed after:
  (fn's wall seconds, the trace)."""
  trace_dir = tempfile.mkdtemp(prefix=prefix)
  try:
    t0 = time.perf_counter()
    with jax.profiler.trace(trace_dir):
      fn()
    wall_s = time.perf_counter() - t0
    [xspace] = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    return wall_s, jax.profiler.ProfileData.from_file(xspace)
  finally:
    shutil.rmtree(trace_dir, ignore_errors=True)


def commit_id(tree: str | os.PathLike | None = None) -> str:
  """Short git commit of the working tree (default: this repository), "-dirty" when its tracked
  files differ from it (scripts/tree_commit.sh); $BENCH_COMMIT wins."""
  env = os.environ.get("BENCH_COMMIT")
  if env:
    return env
  script = REPO_ROOT / "scripts" / "tree_commit.sh"
  try:
    return subprocess.run(["bash", "-c", f'source "{script}" && tree_commit'], capture_output=True, text=True,
                          check=True, cwd=tree or REPO_ROOT).stdout.strip() or "unknown"
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def device_name() -> str:
  d = jax.devices()[0]
  return f"{d.platform}:{getattr(d, 'device_kind', 'unknown')}"


def write_result(path: str, result: dict) -> None:
  """A bench result as indented JSON at `path` (folders created); nothing when path is empty."""
  if not path:
    return
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
