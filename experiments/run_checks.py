"""The ablation runner's checks of its command line and of this machine, made
before anything is written: each failure is one `UsageError` that the runner
prints as a single ``error: ...`` line and exit code 2."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import jax


class UsageError(ValueError):
  """Bad command-line input, found before any compute."""


class ArgumentParser(argparse.ArgumentParser):
  """argparse whose errors are `UsageError`s (one ``error:`` line from the runner, not usage text)."""

  def error(self, message: str):  # argparse's hook; never returns
    raise UsageError(f"{message} (see --help)")


def check_out_writable(out: Path) -> None:
  """``out`` (or the nearest folder above it that exists) must be a folder this process can write."""
  probe = Path(out)
  while not probe.exists():
    if probe.parent == probe:
      break
    probe = probe.parent
  if not probe.is_dir():
    raise UsageError(f"--out {out}: {probe} exists and is not a folder; choose another --out.")
  if not os.access(probe, os.W_OK | os.X_OK):
    raise UsageError(f"--out {out}: {probe} is not writable by this user; choose another --out.")


def check_execution(args: argparse.Namespace, configs: dict[str, Any]) -> None:
  """Settings the local devices must support: backend, attention, the mesh and the batch split.

  Raises:
    UsageError: naming the setting and what to use instead.
  """
  from tetrajet_jax.train import sharding  # pylint: disable=import-outside-toplevel

  platform = jax.default_backend()
  if args.backend == "pallas" and platform != "gpu":
    raise UsageError(f"--backend pallas runs the Pallas kernels, which need a Hopper GPU; this machine's JAX "
                     f"backend is {platform!r}. Use --backend auto (kernels where they run, else XLA) or xla.")
  if args.attention == "cudnn" and platform != "gpu":
    raise UsageError(f"--attention cudnn needs an NVIDIA GPU; this machine's JAX backend is {platform!r}. "
                     "Use --attention xla.")
  for name, config in configs.items():
    try:
      mesh = sharding.mesh_from_config(config)
      sharding.check_batch(config.batch_size, mesh, seq_len=config.seq_len, quantized=config.arm_spec.quantized)
    except ValueError as e:
      raise UsageError(f"--mesh {args.mesh or '(default)'} for arm {name} on {jax.device_count()} device(s): "
                       f"{e}") from None
