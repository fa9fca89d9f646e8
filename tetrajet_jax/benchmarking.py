"""Timing helpers shared by the benchmark scripts (never by tests).

Device work is asynchronous: every sample blocks on the outputs; compilation
and first-call effects are excluded by warm-up calls; the median of repeats
is reported. Speed is only ever reported as a ratio to a baseline timed in
the same process.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time

import jax


def time_fn(fn, *args, reps: int = 15, inner: int = 5) -> float:
  """Median seconds per call: `inner` back-to-back calls per sample, after warm-up."""
  jax.block_until_ready(fn(*args))
  jax.block_until_ready(fn(*args))
  samples = []
  for _ in range(reps):
    t0 = time.perf_counter()
    for _ in range(inner):
      out = fn(*args)
    jax.block_until_ready(out)
    samples.append((time.perf_counter() - t0) / inner)
  return statistics.median(samples)


def commit_id() -> str:
  """Short git commit of the working tree ($BENCH_COMMIT wins: the device copy has no .git)."""
  env = os.environ.get("BENCH_COMMIT")
  if env:
    return env
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
  except Exception:  # noqa: BLE001
    return "unknown"


def device_name() -> str:
  d = jax.devices()[0]
  return f"{d.platform}:{getattr(d, 'device_kind', 'unknown')}"
