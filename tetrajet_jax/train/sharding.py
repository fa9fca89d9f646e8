"""Where every array of a training run lives: the mesh and the sharding rules.

All placement decisions are here so that scaling out (data parallel, FSDP)
changes this file only. The mesh has named axes ``("data", "fsdp")``; the
batch is split over both (every device gets different sequences), and the
train step is always jitted with explicit in/out shardings on a mesh, even
when the mesh has one device.

Current rules: parameters, the model's other variables and the optimizer
state are replicated; batches are split along their leading (batch) axis.
FSDP (sharding parameters and optimizer state along ``fsdp``) adds a rule in
`param_spec`; it must never split a 1x128 quantization block along a
kernel's K axis (axis 0 of a ``[K, N]`` kernel): see `check_block_aligned`.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp")
BATCH_AXES = ("data", "fsdp")


def make_mesh(*, data: int | None = None, fsdp: int = 1,
              devices: list[jax.Device] | None = None) -> Mesh:
  """A ``(data, fsdp)`` mesh over ``devices`` (default: all); ``data`` defaults to the rest."""
  devices = list(devices if devices is not None else jax.devices())
  if fsdp < 1 or len(devices) % fsdp:
    raise ValueError(f"fsdp={fsdp} must divide the {len(devices)} devices.")
  data = len(devices) // fsdp if data is None else data
  if data * fsdp != len(devices):
    raise ValueError(f"mesh data={data} x fsdp={fsdp} = {data * fsdp} devices, but there are "
                     f"{len(devices)}; choose sizes whose product is the device count.")
  return Mesh(np.asarray(devices).reshape(data, fsdp), MESH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def param_spec(path: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh) -> P:
  """PartitionSpec of one parameter (or of optimizer state shaped like it)."""
  del path, shape, mesh  # replicated until FSDP lands (issue 8)
  return P()


def check_block_aligned(shape: tuple[int, ...], spec: P, mesh: Mesh, block: int = 128) -> None:
  """Raises if ``spec`` would cut axis 0 (K of a [K, N] kernel) inside a quantization block."""
  if not spec or spec[0] is None:
    return
  axes = spec[0] if isinstance(spec[0], tuple) else (spec[0],)
  shards = int(np.prod([mesh.shape[a] for a in axes]))
  if shape[0] % (shards * block):
    raise ValueError(f"sharding K={shape[0]} over {shards} devices gives {shape[0] // shards} per "
                     f"shard, not a multiple of the {block}-element quantization block.")


def _path_names(path) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def tree_shardings(tree: Any, mesh: Mesh) -> Any:
  """A NamedSharding for every leaf of a state pytree (params, opt state, ...)."""
  def one(path, leaf):
    shape = tuple(np.shape(leaf))
    return NamedSharding(mesh, param_spec(_path_names(path), shape, mesh) if shape else P())
  return jax.tree_util.tree_map_with_path(one, tree)


def check_batch(batch_size: int, mesh: Mesh) -> None:
  n = int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
  if batch_size % n:
    raise ValueError(f"batch_size={batch_size} is not divisible by the {n} batch shards of the mesh "
                     f"{dict(mesh.shape)}; use a multiple of {n}.")
