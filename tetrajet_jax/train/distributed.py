"""Multi-process (multi-host) start-up: `jax.distributed.initialize` from CLI/env settings.

One process per host (each sees its local GPUs), all running the same
command. Settings, first found wins per field:

1. explicit arguments (the CLI's ``--coordinator``, ``--num-processes``,
   ``--process-id``);
2. environment variables ``TETRAJET_COORDINATOR`` (``host:port`` of process
   0), ``TETRAJET_NUM_PROCESSES``, ``TETRAJET_PROCESS_ID`` (JAX's own
   ``JAX_COORDINATOR_ADDRESS`` is honoured by JAX too);
3. a cluster launcher JAX detects by itself (SLURM ``srun``, Open MPI
   ``mpirun``, Kubernetes/TPU pods): when one is present with more than one
   process, JAX fills in whatever is missing.

With none of them (a plain ``python ...`` on one machine) nothing is
initialized: a single process uses all its local devices. Must run before
any other JAX call that touches devices.
"""

from __future__ import annotations

import dataclasses
import os

import jax

ENV_COORDINATOR = "TETRAJET_COORDINATOR"
ENV_NUM_PROCESSES = "TETRAJET_NUM_PROCESSES"
ENV_PROCESS_ID = "TETRAJET_PROCESS_ID"

# Variables whose presence with a size > 1 means a launcher started several processes.
_CLUSTER_SIZE_VARS = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributedSettings:
  """Resolved settings (None fields are left to JAX's cluster detection)."""

  coordinator: str | None
  num_processes: int | None
  process_id: int | None
  source: str  # "args/env", "cluster", or "single" (nothing to initialize)


def _env_int(name: str) -> int | None:
  v = os.environ.get(name)
  if v in (None, ""):
    return None
  try:
    return int(v)
  except ValueError:
    raise ValueError(f"${name}={v!r} is not an integer.") from None


def resolve(coordinator: str | None = None, num_processes: int | None = None,
            process_id: int | None = None) -> DistributedSettings:
  """Combines arguments, environment and cluster detection (module docstring); validates them."""
  coordinator = coordinator or os.environ.get(ENV_COORDINATOR) or os.environ.get("JAX_COORDINATOR_ADDRESS")
  num_processes = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
  process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
  given = (coordinator, num_processes, process_id)
  if any(v is not None for v in given):
    if num_processes is not None and num_processes < 1:
      raise ValueError(f"num_processes={num_processes} must be >= 1.")
    if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
      raise ValueError(f"process_id={process_id} must be in [0, num_processes={num_processes}).")
    if coordinator is not None and ":" not in coordinator:
      raise ValueError(f"coordinator {coordinator!r} must be host:port of process 0 (e.g. 10.0.0.1:1234).")
    if num_processes == 1:
      return DistributedSettings(coordinator=None, num_processes=1, process_id=0, source="single")
    if None in given and not _cluster_size():
      missing = [n for n, v in zip(("--coordinator", "--num-processes", "--process-id"), given) if v is None]
      raise ValueError(f"multi-process settings are incomplete: {', '.join(missing)} missing and no "
                       "cluster launcher (SLURM, Open MPI) detected; give all three (or "
                       f"${ENV_COORDINATOR}, ${ENV_NUM_PROCESSES}, ${ENV_PROCESS_ID}).")
    return DistributedSettings(coordinator=coordinator, num_processes=num_processes, process_id=process_id,
                               source="args/env")
  if _cluster_size() > 1:
    return DistributedSettings(coordinator=None, num_processes=None, process_id=None, source="cluster")
  return DistributedSettings(coordinator=None, num_processes=1, process_id=0, source="single")


def _cluster_size() -> int:
  for name in _CLUSTER_SIZE_VARS:
    v = _env_int(name)
    if v is not None:
      return v
  return 0


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> DistributedSettings:
  """Initializes `jax.distributed` when several processes are asked for (idempotent).

  Returns:
    The resolved settings; after it, `jax.process_count()` /
    `jax.process_index()` describe the run.
  """
  settings = resolve(coordinator, num_processes, process_id)
  if settings.source == "single" or jax.distributed.is_initialized():
    return settings
  jax.distributed.initialize(coordinator_address=settings.coordinator, num_processes=settings.num_processes,
                             process_id=settings.process_id)
  return settings
