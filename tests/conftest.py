"""Shared pytest fixtures: per-test seeds derived from the test's name, a small
learnable token stream for trainer tests, GPU-only tests skipped where no
GPU is present, and the longest module scheduled first."""

from __future__ import annotations

import hashlib

import jax
import numpy as np
import pytest

from tetrajet_jax.train import TrainData


def _seed_from_name(name: str) -> int:
  return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


@pytest.fixture
def seed(request) -> int:
  return _seed_from_name(request.node.nodeid)


@pytest.fixture
def rng(seed) -> np.random.Generator:
  return np.random.default_rng(seed)


@pytest.fixture
def key(seed) -> jax.Array:
  return jax.random.key(seed)


@pytest.fixture
def fresh_lowering_cache():
  """For tests that count Mosaic module lowerings: nothing an earlier test lowered is reused."""
  from tetrajet_jax.kernels import _lowering_cache  # pylint: disable=import-outside-toplevel
  _lowering_cache.clear()
  yield
  _lowering_cache.clear()


@pytest.fixture(scope="module")
def data():
  """A learnable stream for trainer tests: a fixed random 97-token pattern, repeated (a module
  that needs other data defines its own `data`)."""
  pattern = np.random.default_rng(0).integers(2, 256, size=97)
  return TrainData(train_tokens=np.tile(pattern, 60).astype(np.uint16),
                   val_tokens=np.tile(pattern, 6).astype(np.uint16), vocab_size=256)


# Modules whose single items run for minutes (one subprocess, many compiles) go first, so that
# under pytest-xdist the other worker is not left idle at the end waiting for them.
LONG_FIRST = ("tests/test_distributed.py",)


def pytest_collection_modifyitems(config, items):
  items.sort(key=lambda item: not item.nodeid.startswith(LONG_FIRST))  # stable: order kept otherwise
  if jax.default_backend() == "gpu":
    return
  skip = pytest.mark.skip(reason="GPU-only test (needs a CUDA GPU; run on the H200)")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)
