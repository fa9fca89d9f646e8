"""Where every array of a training run lives: the mesh and the sharding rules.

All placement decisions are here (the trainer only asks this module). The
mesh has named axes ``("data", "fsdp")`` and is built from the run's config
(`mesh_from_config`; CLI ``--mesh data=2,fsdp=4``). Everything runs through
JAX's own SPMD: global `jax.Array`s with `NamedSharding`s, one `jax.jit`
with explicit in/out shardings, collectives inserted by XLA. There is no
shard_map, pmap or per-device view anywhere in the step, so every reduction
in the numerics (NVIDIA's per-tensor amax, OutControl's per-channel norms,
the loss mean, the gradient norm) is a reduction over the *global* array:
the sharded step computes the same function as the single-device one.

Rules:

* Batches (and activations): split along the batch axis over ``data`` and
  ``fsdp`` together (every device sees different sequences).
* Parameters (FSDP storage): with ``fsdp > 1`` every matrix is split over
  ``fsdp`` along the axis that is not quantized in blocks when it is stored:
  kernels ``[in, out]`` along ``out`` (axis 1), the embedding ``[V, d]``
  along the vocabulary (axis 0). Vectors (norm weights) and scalars are
  replicated (a few KiB; splitting them costs more collectives than it saves).
  Inside the step the parameters are gathered for compute (`gather_for_compute`,
  the FSDP all-gather) and the gradients constrained back to the storage
  sharding (a reduce-scatter), so the forward/backward quantizers always see
  whole tensors.
* Optimizer state: every leaf shaped like a parameter and sitting under that
  parameter's path (Adam's ``mu``/``nu``, OsciReset's ``d_q``/``d_w``) gets
  the parameter's sharding, so OsciReset's Q(w) (1x128 blocks along axis 0,
  K) runs shard-locally on whole blocks; everything else is replicated.
* The model's other variables (quantization key streams, OutControl
  statistics and channel indices) are replicated.

Quantization blocks and shards: a 1x128 block along the reduction axis K of
a quantized GEMM operand must never span two shards. Kernels are never
split along K (above; `check_block_aligned` guards it). Activations are split
along tokens M, which is K of the weight-gradient GEMM (Q5 on dY^T, Q6 on
X_hat^T): `check_batch` requires every device's token count to be a multiple
of 128 for quantized arms.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tetrajet_jax.numerics.nvfp4 import OUTER_BLOCK
from tetrajet_jax.tree_paths import path_strs

MESH_AXES = ("data", "fsdp")
BATCH_AXES = ("data", "fsdp")


def parse_mesh(spec: str) -> dict[str, int]:
  """``"data=2,fsdp=4"`` -> ``{"data": 2, "fsdp": 4}``; ``-1`` (or a missing ``data``) = the rest.

  Raises:
    ValueError: unknown axis names, repeated axes, or sizes that are not
      positive integers (``data`` may be -1).
  """
  out: dict[str, int] = {}
  for part in (p.strip() for p in spec.split(",")):
    if not part:
      continue
    name, sep, value = part.partition("=")
    name = name.strip()
    if not sep or name not in MESH_AXES:
      raise ValueError(f"mesh {spec!r}: {part!r} is not AXIS=SIZE with AXIS in {', '.join(MESH_AXES)}; "
                       "e.g. --mesh data=2,fsdp=4.")
    if name in out:
      raise ValueError(f"mesh {spec!r}: axis {name!r} given twice.")
    try:
      size = int(value)
    except ValueError:
      raise ValueError(f"mesh {spec!r}: size {value!r} of axis {name!r} is not an integer.") from None
    if size < 1 and not (name == "data" and size == -1):
      raise ValueError(f"mesh {spec!r}: {name}={size} must be >= 1 (data=-1: all remaining devices).")
    out[name] = size
  return out


def make_mesh(*, data: int | None = None, fsdp: int = 1,
              devices: list[jax.Device] | None = None) -> Mesh:
  """A ``(data, fsdp)`` mesh over ``devices`` (default: all, of every process).

  ``data`` None or -1 takes the remaining devices. Devices are ordered by
  (process, id), so each process owns a contiguous run of the flattened
  batch axis (what `global_batch` relies on) and an ``fsdp`` group that
  fits in one host stays in it (its all-gathers use the host's NVLink).
  """
  devices = sorted(devices if devices is not None else jax.devices(),
                   key=lambda d: (d.process_index, d.id))
  n = len(devices)
  if fsdp < 1 or n % fsdp:
    raise ValueError(f"mesh fsdp={fsdp} must divide the {n} devices; choose fsdp in "
                     f"{[d for d in range(1, n + 1) if n % d == 0]}.")
  data = n // fsdp if data in (None, -1) else data
  if data * fsdp != n:
    raise ValueError(f"mesh data={data} x fsdp={fsdp} = {data * fsdp} devices, but there are {n}; "
                     f"choose sizes whose product is {n} (e.g. --mesh data={n // fsdp},fsdp={fsdp}).")
  return Mesh(np.asarray(devices, dtype=object).reshape(data, fsdp), MESH_AXES)


def mesh_from_config(config: Any, devices: list[jax.Device] | None = None) -> Mesh:
  """The mesh of a `TrainConfig` (``mesh_data``, ``mesh_fsdp``)."""
  return make_mesh(data=config.mesh_data, fsdp=config.mesh_fsdp, devices=devices)


def mesh_str(mesh: Mesh) -> str:
  return ",".join(f"{a}={s}" for a, s in mesh.shape.items())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_shards(mesh: Mesh) -> int:
  return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


# ---- parameters ------------------------------------------------------------------------------

def _storage_axis(path: tuple[str, ...], shape: tuple[int, ...]) -> int | None:
  """The axis FSDP splits a parameter along (None: replicated)."""
  if len(shape) < 2:
    return None
  if path and path[-1] == "embedding":
    return 0  # [V, d]: vocabulary rows
  if path and path[-1] == "kernel":
    return len(shape) - 1  # [in, out]: output features, never the quantized K
  return int(np.argmax(shape))


def param_spec(path: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh) -> P:
  """PartitionSpec of one parameter (and of optimizer state shaped like it).

  Raises:
    ValueError: the ``fsdp`` axis does not divide the dimension it splits.
  """
  fsdp = mesh.shape["fsdp"]
  axis = _storage_axis(path, shape)
  if fsdp == 1 or axis is None:
    return P()
  if shape[axis] % fsdp:
    raise ValueError(
        f"mesh axis fsdp={fsdp} does not divide dim {axis} (size {shape[axis]}) of parameter "
        f"{'/'.join(path)} {list(shape)}; FSDP splits every kernel [in, out] along out and the "
        f"embedding along the vocabulary. Use an fsdp size that divides {shape[axis]} "
        f"(e.g. {_divisors(shape[axis], limit=fsdp)}), or a model whose dims it divides.")
  return P(*([None] * axis + ["fsdp"]))


def _divisors(n: int, limit: int) -> list[int]:
  return [d for d in range(1, min(n, 4 * limit) + 1) if n % d == 0]


def check_block_aligned(shape: tuple[int, ...], spec: P, mesh: Mesh, *, axis: int = 0,
                        block: int = OUTER_BLOCK, name: str = "array") -> None:
  """Raises if ``spec`` cuts ``axis`` (K of a quantized operand) inside a 1x``block`` block.

  For a kernel ``[K, N]`` the quantized axis of the forward (Q2) and of
  OsciReset's Q(w) is 0.
  """
  entry = spec[axis] if len(spec) > axis else None
  if entry is None:
    return
  axes = entry if isinstance(entry, tuple) else (entry,)
  shards = int(np.prod([mesh.shape[a] for a in axes]))
  if shards > 1 and shape[axis] % (shards * block):
    fits = [s for s in range(1, shards + 1) if shape[axis] % (s * block) == 0]
    raise ValueError(
        f"{name} {list(shape)}: splitting dim {axis} (K={shape[axis]}, quantized in 1x{block} blocks) "
        f"over mesh axis {'x'.join(axes)} ({shards} shards) gives {shape[axis] / shards:g} elements per "
        f"shard, not a multiple of {block}: a quantization block would span two devices. Split it over "
        f"at most {max(fits)} shards ({fits}), or leave K unsplit.")


def param_specs(params: Any, mesh: Mesh, quantized: Callable[[tuple[str, ...], Any], bool] | None = None
                ) -> dict[tuple[str, ...], tuple[tuple[int, ...], P]]:
  """{path: (shape, spec)} of every parameter, validated (divisibility, whole K blocks)."""
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    names, shape = path_strs(path), tuple(np.shape(leaf))
    spec = param_spec(names, shape, mesh)
    if quantized is not None and quantized(names, leaf):
      check_block_aligned(shape, spec, mesh, axis=0, name=f"quantized kernel {'/'.join(names)}")
    out[names] = (shape, spec)
  return out


def state_shardings(state: dict[str, Any], mesh: Mesh,
                    quantized: Callable[[tuple[str, ...], Any], bool] | None = None) -> Any:
  """A NamedSharding for every leaf of the train state ``{"params", "model", "opt", "step"}``.

  Parameters get `param_spec`; an optimizer-state leaf whose path ends with
  a parameter's path and has its shape gets that parameter's spec; the rest
  is replicated.
  """
  specs = param_specs(state["params"], mesh, quantized)
  lengths = sorted({len(p) for p in specs}, reverse=True)

  def one(path, leaf):
    names, shape = path_strs(path), tuple(np.shape(leaf))
    if names[:1] in (("params",), ("opt",)):
      for n in lengths:
        hit = specs.get(names[-n:]) if len(names) > n else None
        if hit is not None and hit[0] == shape:
          return NamedSharding(mesh, hit[1])
    return NamedSharding(mesh, P())

  return jax.tree_util.tree_map_with_path(one, state)


def gather_for_compute(params: Any, mesh: Mesh) -> Any:
  """Inside the step: the FSDP all-gather (parameters replicated for the forward/backward).

  The quantizers then see whole weights, whatever the storage sharding; the
  transpose of this constraint is the gradients' reduce-scatter.
  """
  if mesh.shape["fsdp"] == 1:
    return params
  return jax.lax.with_sharding_constraint(params, replicated(mesh))


def constrain(tree: Any, shardings: Any) -> Any:
  return jax.lax.with_sharding_constraint(tree, shardings)


def constrain_activations(x: jax.Array, mesh: Mesh) -> jax.Array:
  """Batch-major activations ``[B, ...]`` split like the batch (e.g. the logits)."""
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(BATCH_AXES, *([None] * (x.ndim - 1)))))


# ---- batches ---------------------------------------------------------------------------------

def check_batch(batch_size: int, mesh: Mesh, *, seq_len: int | None = None, quantized: bool = False,
                what: str = "batch_size") -> None:
  """Raises before compute if the batch cannot be split over the mesh.

  ``batch_size`` must be divisible by the ``data x fsdp`` batch shards (and
  so by the process count). For quantized arms every device's tokens
  ``batch_size / shards * seq_len`` must be a multiple of 128: tokens are K
  of the weight-gradient GEMM (Q5/Q6 quantize along them in 1x128 blocks).
  """
  n = batch_shards(mesh)
  if batch_size % n:
    raise ValueError(f"{what}={batch_size} is not divisible by the {n} batch shards of the mesh "
                     f"{mesh_str(mesh)} (the batch is split over data x fsdp); use a multiple of {n}.")
  procs = jax.process_count()
  if batch_size % procs:
    raise ValueError(f"{what}={batch_size} is not divisible by the {procs} processes; use a multiple of {procs}.")
  if quantized and seq_len is not None:
    per_device = batch_size // n * seq_len
    if per_device % OUTER_BLOCK:
      step = n * OUTER_BLOCK // math.gcd(seq_len, OUTER_BLOCK)
      raise ValueError(
          f"{what}={batch_size} x seq_len={seq_len} over the {n} batch shards of mesh {mesh_str(mesh)} "
          f"leaves {batch_size // n} x {seq_len} = {per_device} tokens per device, not a multiple of "
          f"{OUTER_BLOCK}: the weight-gradient quantizers (Q5 on dY^T, Q6 on X_hat^T) quantize along "
          f"tokens in 1x{OUTER_BLOCK} blocks, so a block would span two devices. Use {what} a multiple "
          f"of {step}, or seq_len a multiple of {OUTER_BLOCK}.")


def global_batch(local: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """This process's rows of the batch -> global arrays split like the batch.

  Each process passes ``batch_size / process_count`` rows; `make_mesh`'s
  device order makes them the process's contiguous part of the global batch.
  """
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local.items()}


def replicated_input(x: np.ndarray, mesh: Mesh) -> jax.Array:
  """A host array that every process holds in full -> a replicated global array."""
  return jax.make_array_from_process_local_data(replicated(mesh), np.asarray(x))


def layer_backend(backend: str, mesh: jax.sharding.Mesh) -> str:
  """The backend the model's linears run: "auto" means XLA on a mesh of several
  devices (the Pallas kernels are custom calls XLA does not partition).

  Raises:
    ValueError: backend "pallas" on a mesh of several devices.
  """
  if mesh.devices.size == 1:
    return backend
  if backend == "pallas":
    raise ValueError(f"backend='pallas' on a mesh of {mesh.devices.size} devices: the Pallas kernels are custom "
                     "calls that XLA does not partition. Use backend 'auto' or 'xla' (XLA on a mesh).")
  return "xla" if backend == "auto" else backend
