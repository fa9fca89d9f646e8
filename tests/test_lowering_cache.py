"""The per-process Mosaic lowering cache (kernels/_lowering_cache.py), lowered for Hopper on the CPU."""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from tetrajet_jax import kernels
from tetrajet_jax.kernels import _lowering_cache, _platform

SPEC = jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16)


def _two_functions():
  """Two different jitted functions that hold the same RTN kernel instance."""
  first = jax.jit(lambda x: kernels.quantize_nvfp4_rtn(x).codes)
  second = jax.jit(lambda x: kernels.quantize_nvfp4_rtn(x * 2).codes.astype(jnp.int32) + 1)
  return first, second


def _modules(fn) -> list[tuple[str, str]]:
  """(kernel hash, module bytes) of every Mosaic custom call in fn's lowering for CUDA."""
  text = fn.trace(SPEC).lower(lowering_platforms=("cuda",)).as_text()
  return re.findall(r'kernel_hash = "(.*?)", module = "(.*?)"', text)


def _lower_both(on: bool):
  _lowering_cache.install(on)
  jax.clear_caches()
  with _platform.assume_hopper():
    return [_modules(fn) for fn in _two_functions()]


@pytest.fixture
def restore_cache():
  was_on = _lowering_cache.enabled()
  yield
  _lowering_cache.install(was_on)


def test_second_function_reuses_the_first_lowering(restore_cache):
  """With the cache, the second function's kernel is a hit and carries the first's module and hash (so
  the Mosaic runtime builds one binary); without it, every function lowers its own, which differs only
  in the kernel's dump name, and so in its hash."""
  (a_off,), (b_off,) = _lower_both(False)
  assert _lowering_cache.stats == {"hits": 0, "misses": 0}
  assert a_off[0] != b_off[0]  # two hashes for one kernel
  (a_on,), (b_on,) = _lower_both(True)
  assert _lowering_cache.stats == {"hits": 1, "misses": 1}
  assert a_on == b_on  # one module, one hash
  unnamed = lambda module: re.sub(r"kernel_\d+\\00", "kernel\\\\00", module)
  assert unnamed(a_on[1]) == unnamed(a_off[1]) == unnamed(b_off[1])  # a fresh lowering but for the name


def test_install_is_idempotent_and_reversible(restore_cache):
  from jax._src.pallas.mosaic_gpu import lowering  # pylint: disable=import-outside-toplevel
  original = lowering.lower_unpipelined_jaxpr_to_module.uncached
  _lowering_cache.install(True)
  _lowering_cache.install(True)
  assert lowering.lower_unpipelined_jaxpr_to_module.uncached is original
  assert _lowering_cache.enabled()
  _lowering_cache.install(False)
  assert lowering.lower_unpipelined_jaxpr_to_module is original
  assert not _lowering_cache.enabled()


def test_environment_turns_the_cache_off():
  probe = "from tetrajet_jax.kernels import _lowering_cache as c; print(c.enabled())"
  run = lambda value: subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                     env={**os.environ, _lowering_cache.ENV: value}).stdout.strip()
  assert (run("0"), run("1")) == ("False", "True")
