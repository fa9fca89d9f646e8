"""One Python lowering per Mosaic GPU kernel instance per process, across jitted functions.

JAX emits a Mosaic GPU kernel's module in Python (seconds each: the kernel
body's ops, then layout inference) every time a jitted function containing
it is lowered. `_platform.one_lowering_per_instance` shares one lowering
between the call sites of one function; a run lowers several functions that
hold the same instances (an OutControl run's two train steps, the validation
pass and the downstream forwards beside them), and each paid for them again.
Worse, each lowering names its kernel afresh (`kernel_<n>`, for debug dumps),
so equal kernels of two functions got different module hashes and the Mosaic
runtime, which keeps one binary per hash, built each again in XLA's compile.

This wraps JAX's lowering of a kernel jaxpr to its module: the first
lowering's module is kept as MLIR bytecode and later lowerings of the same
instance parse it into their own context, so they also share its hash and
binary. The key holds the kernel jaxpr object itself (the one JAX's trace
cache hands to every trace of the same kernel call), so a hit is the same
kernel by construction; its module is a fresh lowering's byte for byte but
for that name (tests/test_lowering_cache.py).

Set TETRAJET_MOSAIC_LOWERING_CACHE=0 to lower every time.
"""

from __future__ import annotations

import dataclasses
import io
import os
import threading

from jax._src.lib.mlir import ir

try:  # JAX's private lowering entry point for `plgpu.kernel` (mpmd_map); absent elsewhere.
  from jax._src.pallas.mosaic_gpu import lowering as _mgpu_lowering
except ImportError:  # pragma: no cover - a JAX without Mosaic GPU Pallas
  _mgpu_lowering = None

ENV = "TETRAJET_MOSAIC_LOWERING_CACHE"
_TARGET = "lower_unpipelined_jaxpr_to_module"

_lock = threading.Lock()
_modules: dict[tuple, tuple] = {}  # key -> (LoweringResult with module=None, module bytecode)
stats = {"hits": 0, "misses": 0}


def _key(gpu_mesh, jax_mesh, jaxpr, in_shapes, out_shapes, params) -> tuple:
  return (_Identity(jaxpr), gpu_mesh, jax_mesh, tuple(in_shapes), tuple(out_shapes), params)


class _Identity:
  """Hashes and compares by identity, and keeps the object alive (no id reuse)."""
  __slots__ = ("obj",)

  def __init__(self, obj):
    self.obj = obj

  def __hash__(self):
    return id(self.obj)

  def __eq__(self, other):
    return isinstance(other, _Identity) and other.obj is self.obj


def _cached(lower):
  def lower_cached(gpu_mesh, jax_mesh, jaxpr, in_shapes, out_shapes, params, **kwargs):
    key = _key(gpu_mesh, jax_mesh, jaxpr, in_shapes, out_shapes, params)
    try:
      with _lock:
        entry = _modules.get(key)
        stats["hits" if entry is not None else "misses"] += 1
    except TypeError:  # an unhashable option: lower as JAX would
      return lower(gpu_mesh, jax_mesh, jaxpr, in_shapes, out_shapes, params, **kwargs)
    if entry is not None:
      result, bytecode = entry
      return dataclasses.replace(result, module=ir.Module.parse(bytecode))
    result = lower(gpu_mesh, jax_mesh, jaxpr, in_shapes, out_shapes, params, **kwargs)
    buf = io.BytesIO()
    result.module.operation.write_bytecode(buf)
    with _lock:
      _modules[key] = (dataclasses.replace(result, module=None), buf.getvalue())
    return result

  lower_cached.uncached = lower
  return lower_cached


def clear() -> None:
  """Forgets every kept module (and zeroes the counters)."""
  with _lock:
    _modules.clear()
    stats.update(hits=0, misses=0)


def enabled() -> bool:
  return _mgpu_lowering is not None and hasattr(getattr(_mgpu_lowering, _TARGET), "uncached")


def install(on: bool = True) -> None:
  """Turns the cache on (or off) for this process; idempotent."""
  if _mgpu_lowering is None:
    return
  current = getattr(_mgpu_lowering, _TARGET)
  original = getattr(current, "uncached", current)
  setattr(_mgpu_lowering, _TARGET, _cached(original) if on else original)
  clear()


install(os.environ.get(ENV, "1") != "0")
