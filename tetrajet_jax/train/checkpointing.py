"""Orbax checkpoints of a training run: model, optimizer, data iterator, step.

One `ocp.CheckpointManager` per run directory; each step is an
``ocp.args.Composite`` of three items:

* ``state``: the train-state pytree (parameters, the model's other variables
  (quantization key streams, OutControl statistics and frozen channels),
  optimizer state with OsciReset's, the step counter), saved with
  `ocp.args.StandardSave`. Typed PRNG keys are stored as their raw uint32
  key data and rewrapped on restore.
* ``data``: the grain iterator state (`grain.checkpoint.CheckpointSave`).
* ``meta``: JSON describing what the state belongs to (model config, arm,
  schedule, batch shape, seed). A restore compares it with the current run
  and refuses a mismatch, naming the fields that differ.

Sharded state: every array is a global `jax.Array`; orbax writes each
shard once (from the process that holds it; with several processes all of
them must call `save`/`restore` and see the same directory). Restoring reads
into the shardings of the *template* (the current run's state), so a
checkpoint written on one mesh restores onto any other (8 devices -> 1,
1 -> 4, data parallel <-> FSDP); tests/test_distributed.py checks both
directions bitwise. The grain iterator state is per process, so the number
of processes must match (recorded in ``meta``).

Saves are asynchronous (the device->host copy happens before `save`
returns, so the caller may donate the arrays afterwards); the manager keeps
the last ``keep`` steps. Restoring never falls back to a fresh start: a
missing, corrupt or incompatible checkpoint raises `CheckpointError`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
  """A checkpoint cannot be used (missing, corrupt or from another run)."""


def _is_key(x: Any) -> bool:
  return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def keys_to_data(tree: Any) -> Any:
  """Typed PRNG keys -> uint32 key data (orbax stores plain arrays)."""
  return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def data_to_keys(tree: Any, template: Any) -> Any:
  """Inverse of `keys_to_data`, using ``template`` to know which leaves were keys."""
  def wrap(x, t):
    if _is_key(t):
      return jax.random.wrap_key_data(x, impl=jax.random.key_impl(t))
    return x
  return jax.tree.map(wrap, tree, template)


def _abstract(tree: Any) -> Any:
  def spec(x):
    sharding = getattr(x, "sharding", None)
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)
  return jax.tree.map(spec, keys_to_data(tree))


def _diff(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
  out = []
  for k in sorted(set(saved) | set(current)):
    a, b = saved.get(k, "<missing>"), current.get(k, "<missing>")
    if isinstance(a, dict) and isinstance(b, dict):
      out += _diff(a, b, f"{prefix}{k}.")
    elif a != b:
      out.append(f"{prefix}{k}: checkpoint has {a!r}, this run has {b!r}")
  return out


class Checkpointer:
  """Saves and restores one run's checkpoints under ``directory``.

  Args:
    directory: the run's checkpoint folder (created if missing).
    meta: JSON-able description of the run; must match on restore.
    keep: how many recent steps to keep.
    async_save: write in a background thread.
    meta_defaults: values assumed for ``meta`` keys that an older checkpoint
      does not record.
  """

  def __init__(self, directory: str | Path, *, meta: dict[str, Any], keep: int = 2,
               async_save: bool = True, meta_defaults: dict[str, Any] | None = None):
    if keep < 1:
      raise ValueError(f"keep={keep} must be >= 1.")
    self.directory = Path(directory).absolute()
    self.meta = json.loads(json.dumps(meta))  # normalise tuples etc. as JSON would
    self.meta_defaults = json.loads(json.dumps(meta_defaults or {}))
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=("state", "data", "meta"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, data_iterator: grain.DatasetIterator | None) -> None:
    items = {"state": ocp.args.StandardSave(keys_to_data(state)),
             "meta": ocp.args.JsonSave({**self.meta, "step": int(step)})}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    self._manager.save(int(step), args=ocp.args.Composite(**items), force=True)

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

  def read_meta(self, step: int) -> dict[str, Any]:
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    except Exception as e:  # orbax raises many types for unreadable files
      raise CheckpointError(f"checkpoint {self.directory / str(step)}: cannot read its 'meta' item "
                            f"({type(e).__name__}: {e}); the checkpoint is corrupt or not from "
                            "this trainer. Delete that step folder to fall back to an older one.") from e
    return restored["meta"]

  def restore(self, state_template: Any, data_iterator: grain.DatasetIterator | None,
              step: int | None = None) -> tuple[int, Any]:
    """Restores ``step`` (default: the latest) into the structure of ``state_template``.

    Returns:
      (step, state); ``data_iterator`` is moved to its saved position.

    Raises:
      CheckpointError: no checkpoint, a different run's checkpoint (the
        differing fields are named), or unreadable/mismatching arrays.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no checkpoint in {self.directory}.")
    if step not in self.all_steps():
      raise CheckpointError(f"no checkpoint for step {step} in {self.directory}; "
                            f"available: {self.all_steps()}.")
    meta = {**self.meta_defaults, **self.read_meta(step)}
    saved_step = meta.pop("step", None)
    diffs = _diff(meta, self.meta)
    if diffs:
      raise CheckpointError(f"checkpoint {self.directory / str(step)} belongs to a different run:\n  "
                            + "\n  ".join(diffs)
                            + "\nUse a new output folder, or the settings it was written with.")
    if saved_step != step:
      raise CheckpointError(f"checkpoint folder {step} records step {saved_step}; it is corrupt.")
    items = {"state": ocp.args.StandardRestore(_abstract(state_template))}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:
      raise CheckpointError(f"checkpoint {self.directory / str(step)}: cannot restore the train state "
                            f"or data iterator ({type(e).__name__}: {e}). The arrays are missing, "
                            "truncated, or have other shapes than this model's.") from e
    state = restored["state"]
    want = jax.tree.structure(keys_to_data(state_template))
    if jax.tree.structure(state) != want:
      raise CheckpointError(f"checkpoint {self.directory / str(step)}: its state tree differs from "
                            f"this model's:\n  saved {jax.tree.structure(state)}\n  model {want}")
    for path, a, b in zip(jax.tree_util.tree_leaves_with_path(state),
                          jax.tree.leaves(state), jax.tree.leaves(keys_to_data(state_template))):
      if np.shape(a) != np.shape(b) or a.dtype != b.dtype:
        raise CheckpointError(f"checkpoint {self.directory / str(step)}: "
                              f"{jax.tree_util.keystr(path[0])} is {a.dtype}{list(np.shape(a))}, "
                              f"the model expects {b.dtype}{list(np.shape(b))}.")
    return step, data_to_keys(state, state_template)
