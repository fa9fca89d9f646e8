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
the last ``keep`` steps.

Integrity: once a step is on disk, process 0 writes ``checksums.json`` into
its folder (SHA-256 and size of every file orbax wrote). A restore verifies
them first, so flipped bytes, truncated or emptied files are caught before
any array is read. Restoring the latest step (``step=None``) falls back to
the newest intact checkpoint, with a `DamagedCheckpointWarning` naming what
was damaged; an explicitly requested step never falls back. Restoring never
falls back to a fresh start: no intact checkpoint, or an incompatible one,
raises `CheckpointError`.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
  """A checkpoint cannot be used (missing, corrupt or from another run)."""


class DamagedCheckpointWarning(UserWarning):
  """A damaged checkpoint was skipped in favour of an older intact one."""


CHECKSUMS_FILE = "checksums.json"


def _file_digests(step_dir: Path) -> dict[str, list]:
  """{relative path: [size, sha256]} of every file under ``step_dir`` but the checksum file."""
  out = {}
  for f in sorted(step_dir.rglob("*")):
    if f.is_file() and f.name != CHECKSUMS_FILE:
      h = hashlib.sha256()
      with f.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
          h.update(chunk)
      out[f.relative_to(step_dir).as_posix()] = [f.stat().st_size, h.hexdigest()]
  return out


def write_checksums(step_dir: Path) -> None:
  """Records the digests of a finished step folder (atomically: temp file, then rename)."""
  tmp = step_dir / (CHECKSUMS_FILE + ".tmp")
  tmp.write_text(json.dumps({"files": _file_digests(step_dir)}, indent=1) + "\n", encoding="utf-8")
  tmp.replace(step_dir / CHECKSUMS_FILE)


def verify_checksums(step_dir: Path) -> list[str]:
  """The problems found in ``step_dir`` against its checksums (empty: intact).

  A folder without a checksum file (written before checksums existed, or cut
  off between orbax's commit and the digests) reports nothing here; the
  restore itself then decides.
  """
  record = step_dir / CHECKSUMS_FILE
  if not record.exists():
    return []
  try:
    want = json.loads(record.read_text(encoding="utf-8"))["files"]
  except (ValueError, KeyError) as e:
    return [f"{CHECKSUMS_FILE} is unreadable ({type(e).__name__})"]
  have = _file_digests(step_dir)
  problems = [f"{name}: missing" for name in sorted(set(want) - set(have))]
  for name in sorted(set(want) & set(have)):
    (size_w, sha_w), (size_h, sha_h) = want[name], have[name]
    if size_w != size_h:
      problems.append(f"{name}: {size_h} bytes, {size_w} were written (truncated or grown)")
    elif sha_w != sha_h:
      problems.append(f"{name}: contents changed (SHA-256 differs)")
  problems += [f"{name}: not part of the checkpoint as written" for name in sorted(set(have) - set(want))]
  return problems


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
    self._unsummed: list[int] = []  # saved steps whose checksums are not written yet

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, data_iterator: grain.DatasetIterator | None) -> None:
    items = {"state": ocp.args.StandardSave(keys_to_data(state)),
             "meta": ocp.args.JsonSave({**self.meta, "step": int(step)})}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    self._write_pending_checksums()  # the previous save is finished by now or is waited for
    self._manager.save(int(step), args=ocp.args.Composite(**items), force=True)
    self._unsummed.append(int(step))

  def _write_pending_checksums(self) -> None:
    if not self._unsummed:
      return
    self._manager.wait_until_finished()
    if jax.process_index() == 0:
      for step in self._unsummed:
        step_dir = self.directory / str(step)
        if step_dir.is_dir():  # not already rotated out by max_to_keep
          write_checksums(step_dir)
    self._unsummed.clear()

  def wait(self) -> None:
    self._manager.wait_until_finished()
    self._write_pending_checksums()

  def close(self) -> None:
    self.wait()
    self._manager.close()

  def read_meta(self, step: int) -> dict[str, Any]:
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    except Exception as e:  # orbax raises many types for unreadable files
      raise _DamagedError(f"checkpoint {self.directory / str(step)}: cannot read its 'meta' item "
                          f"({type(e).__name__}: {_first_line(e)}); it is corrupt or not from this trainer") from e
    return restored["meta"]

  def restore(self, state_template: Any, data_iterator: grain.DatasetIterator | None,
              step: int | None = None) -> tuple[int, Any]:
    """Restores ``step`` into the structure of ``state_template``.

    With ``step=None`` the newest intact checkpoint is restored: a damaged
    one (checksums differ, or orbax cannot read it) is skipped with a
    `DamagedCheckpointWarning` and the next older one is tried.

    Returns:
      (step, state); ``data_iterator`` is moved to its saved position.

    Raises:
      CheckpointError: no checkpoint, a different run's checkpoint (the
        differing fields are named), the requested step is damaged, or no
        step is intact.
    """
    if step is not None:
      return self._restore_step(state_template, data_iterator, step)
    steps = sorted(self.all_steps(), reverse=True)
    if not steps:
      raise CheckpointError(f"no checkpoint in {self.directory}.")
    damaged = []
    for candidate in steps:
      try:
        return self._restore_step(state_template, data_iterator, candidate)
      except _DamagedError as e:
        damaged.append(str(e))
        warnings.warn(f"{e}; falling back to an older checkpoint.", DamagedCheckpointWarning, stacklevel=2)
    raise CheckpointError(f"no intact checkpoint in {self.directory}:\n  " + "\n  ".join(damaged))

  def _restore_step(self, state_template: Any, data_iterator: grain.DatasetIterator | None,
                    step: int) -> tuple[int, Any]:
    if step not in self.all_steps():
      raise CheckpointError(f"no checkpoint for step {step} in {self.directory}; "
                            f"available: {self.all_steps()}.")
    step_dir = self.directory / str(step)
    problems = verify_checksums(step_dir)
    if problems:
      raise _DamagedError(f"checkpoint {step_dir} is damaged: " + "; ".join(problems[:5])
                          + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""))
    meta = {**self.meta_defaults, **self.read_meta(step)}
    saved_step = meta.pop("step", None)
    diffs = _diff(meta, self.meta)
    if diffs:
      raise CheckpointError(f"checkpoint {step_dir} belongs to a different run:\n  "
                            + "\n  ".join(diffs)
                            + "\nUse a new output folder, or the settings it was written with.")
    if saved_step != step:
      raise _DamagedError(f"checkpoint folder {step_dir} records step {saved_step}; it is corrupt")
    items = {"state": ocp.args.StandardRestore(_abstract(state_template))}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # orbax and tensorstore raise many types for unreadable files
      raise _DamagedError(f"checkpoint {step_dir}: cannot restore the train state or data iterator "
                          f"({type(e).__name__}: {_first_line(e)}); the arrays are missing, truncated, "
                          "or have other shapes than this model's") from e
    state = restored["state"]
    _check_like(state, state_template, step_dir)
    return step, data_to_keys(state, state_template)


class _DamagedError(CheckpointError):
  """One step folder cannot be read; an older one may still be intact."""


def _first_line(e: Exception) -> str:
  text = str(e).strip().splitlines()
  return text[0][:300] if text else ""


def _check_like(state: Any, template: Any, step_dir: Path) -> None:
  """Raises CheckpointError unless ``state`` has the template's tree, shapes and dtypes."""
  want = jax.tree.structure(keys_to_data(template))
  if jax.tree.structure(state) != want:
    raise CheckpointError(f"checkpoint {step_dir}: its state tree differs from "
                          f"this model's:\n  saved {jax.tree.structure(state)}\n  model {want}")
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(state), jax.tree.leaves(keys_to_data(template))):
    if np.shape(a) != np.shape(b) or a.dtype != b.dtype:
      raise CheckpointError(f"checkpoint {step_dir}: {jax.tree_util.keystr(path)} is "
                            f"{a.dtype}{list(np.shape(a))}, the model expects {b.dtype}{list(np.shape(b))}.")
