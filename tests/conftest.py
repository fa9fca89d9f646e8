"""Shared pytest fixtures: per-test seeds derived from the test's name, and
GPU-only tests skipped where no GPU is present."""

from __future__ import annotations

import hashlib

import jax
import numpy as np
import pytest


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


def pytest_collection_modifyitems(config, items):
  if jax.default_backend() == "gpu":
    return
  skip = pytest.mark.skip(reason="GPU-only test (needs a CUDA GPU; run on the H200)")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)
