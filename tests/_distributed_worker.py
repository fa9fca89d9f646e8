"""Multi-device checks for tests/test_distributed.py, run in a fresh process.

``python -m tests._distributed_worker OUT.json WORKDIR`` with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``: trains the same tiny
``tetrajet_v2_full`` run on one device and on the meshes (8 data), (2 data x
4 fsdp), (1 data x 8 fsdp), writes/restores checkpoints across mesh shapes,
and prints raw measurements as JSON (the test asserts on them). One process
so every mesh compiles once and pytest's own JAX (1 device) is untouched.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tetrajet_jax import nn as qnn
from tetrajet_jax.train import TrainConfig, TrainData, Trainer
from tetrajet_jax.train import sharding as sh
from tetrajet_jax.train import step as step_lib
from tetrajet_jax.optim import find_osci_reset_state

MESHES = {"1": (1, 1), "8x1": (8, 1), "2x4": (2, 4), "1x8": (1, 8)}
MU = "['opt'][1][0].mu"  # AdamW's first moment (clip -> adamw -> OsciReset)


def data() -> TrainData:
  rng = np.random.default_rng(0)
  pattern = rng.integers(2, 256, size=97)
  return TrainData(train_tokens=np.tile(pattern, 60).astype(np.uint16),
                   val_tokens=np.tile(pattern, 6).astype(np.uint16), vocab_size=256,
                   token_bytes=np.arange(256) % 3 + 1, name="pattern")


def config(**kw) -> TrainConfig:
  # Steps 0-3 calibrate OutControl statistics; OsciReset's first window is update 0 and its
  # reset update 1 (threshold 2 so that one early update already flags elements).
  base = dict(model="tiny", arm="tetrajet_v2_full", layers=1, batch_size=8, seq_len=128, total_steps=12,
              warmup_steps=1, peak_lr=3e-3, calib_start=0, calib_steps=4, osci_start=0, osci_period=3,
              osci_window=1, osci_threshold=2.0, checkpoint_every=2)
  base.update(kw)
  return TrainConfig(**base)


def host(tree):
  return jax.tree.map(lambda x: np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
                                           else x), tree)


def flat(tree) -> dict[str, np.ndarray]:
  return {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(host(tree))}


def max_diffs(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, float]:
  """Per leaf: max |a - b| / max(|b|) (0 = bitwise equal values)."""
  out = {}
  for k in b:
    x, y = a[k].astype(np.float64), b[k].astype(np.float64)
    out[k] = float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30)) if y.size else 0.0
  return out


def param_diffs(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, float]:
  """After update 0: the fraction of parameter elements beyond 1e-6 x max|leaf|, and the largest
  difference of any leaf's gradient relative to max|leaf gradient| (Adam's first moment after
  one update is (1 - b1) x the clipped gradient)."""
  beyond, total = 0, 0
  for k in b:
    if k.startswith("['params']"):
      x, y = a[k].astype(np.float64), b[k].astype(np.float64)
      beyond += int((np.abs(x - y) > 1e-6 * np.abs(y).max()).sum())
      total += y.size
  grad = max(max_diffs({k: v for k, v in a.items() if k.startswith(MU)},
                       {k: v for k, v in b.items() if k.startswith(MU)}).values())
  return {"param_frac_beyond_1e-6_after0": beyond / total, "grad_max_rel_after0": grad}


def channels(trainer: Trainer) -> dict[str, list[int]]:
  model = trainer.model()
  qnn.freeze_outlier_channels(model)  # on a copy of the state: what the next phase will use
  return {"/".join(map(str, p)): np.asarray(l.oc_channels[...]).tolist()
          for p, l in qnn.iter_quant_linears(model) if l.has_outcontrol}


def run_mesh(name: str, workdir: Path, d: TrainData) -> dict:
  data_n, fsdp = MESHES[name]
  mesh = sh.make_mesh(data=data_n, fsdp=fsdp, devices=jax.devices()[: data_n * fsdp])
  print(f"mesh {name}: compiling and training 2 steps", file=sys.stderr, flush=True)
  t0 = time.time()
  tr = Trainer(config(), d, workdir / name, mesh=mesh, progress=False, tensorboard=False,
               async_checkpoints=False)
  tr.train(num_steps=1)
  after0 = flat(tr.state)
  tr.train(num_steps=1)  # update 1: OsciReset's reset; checkpoint at step 2
  st = find_osci_reset_state(tr.state["opt"])
  out = {
      "compile_and_2_steps_s": time.time() - t0,
      "history": tr.history,
      "after0": after0,
      "after1": flat(tr.state),
      "num_reset": {k: int(v) for k, v in flat(st.num_reset).items()},
      "channels": channels(tr),
      "shardings": {jax.tree_util.keystr(p): str(s.spec) for p, s in
                    jax.tree_util.tree_leaves_with_path(tr._state_shardings)},
  }
  tr.close()
  return out


def continue_on(src: str, name: str, workdir: Path, d: TrainData, saved: dict) -> dict:
  """Restores checkpoint step 2 of run ``src`` onto mesh ``name`` and trains one more step."""
  data_n, fsdp = MESHES[name]
  mesh = sh.make_mesh(data=data_n, fsdp=fsdp, devices=jax.devices()[: data_n * fsdp])
  tr = Trainer(config(), d, workdir / src, resume=True, mesh=mesh, progress=False, tensorboard=False,
               async_checkpoints=False)
  restored = flat(tr.state)
  same = all(np.array_equal(restored[k], saved[k]) for k in saved)
  placed = {jax.tree_util.keystr(p): str(x.sharding.spec) for p, x in
            jax.tree_util.tree_leaves_with_path(tr.state) if hasattr(x, "sharding")}
  devices = sorted({len(x.sharding.device_set) for x in jax.tree.leaves(tr.state)})
  tr.train(num_steps=1)
  out = {"restored_step": 2, "restored_bitwise": same, "history": tr.history, "devices": devices,
         "placed_example": placed.get("['params']['layers_0']['mlp']['up_gate']['kernel']")}
  tr.close()
  return out


def nvidia_amax() -> dict:
  """NVIDIA's per-tensor amax under a batch split: global (== 1 device) vs what per-shard amax would give.

  Shard 0's rows carry a 100x outlier, so a per-shard amax would scale the
  other shards' rows differently (the "local" result below).
  """
  from tetrajet_jax.linear.layer import linear  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(1)
  x = rng.standard_normal((1024, 256)).astype(np.float32)
  x[3, 5] = 100.0  # on shard 0 only
  w = (0.02 * rng.standard_normal((256, 128))).astype(np.float32)
  key = jax.random.key(3)

  def f(x, w):
    y, vjp = jax.vjp(lambda a, b: linear(a, b, recipe="nvidia_nvfp4", key=key), x, w)
    dx, dw = vjp(jnp.ones_like(y) * jnp.linspace(-1, 1, y.shape[1], dtype=y.dtype))
    return y.astype(jnp.float32), dx, dw

  one = jax.jit(f)(x, w)
  mesh = sh.make_mesh(data=8, fsdp=1)
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(sh.BATCH_AXES))
  rep = sh.replicated(mesh)
  many = jax.jit(f, in_shardings=(rows, rep), out_shardings=(rows, rows, rep))(x, w)
  local = np.concatenate([np.asarray(jax.jit(f)(x[i * 128:(i + 1) * 128], w)[0]) for i in range(8)])
  return {"y_equal": bool(np.array_equal(np.asarray(one[0]), np.asarray(many[0]))),
          "dx_equal": bool(np.array_equal(np.asarray(one[1]), np.asarray(many[1]))),
          "dw_rel": float(np.max(np.abs(np.asarray(one[2]) - np.asarray(many[2]))) / np.max(np.abs(np.asarray(one[2])))),
          "local_amax_rel": float(np.max(np.abs(local[128:] - np.asarray(one[0])[128:])) / np.max(np.abs(np.asarray(one[0])[128:])))}


def step_text(tr: Trainer) -> dict[str, bool]:
  """Which primitives the jitted train step's jaxpr (nested ones included) names."""
  params, rest = step_lib.without_params(tr.state)  # the arm runs OsciReset: the update is split
  text = str(tr._step_fn().trace(params, rest, tr._next_batch()).jaxpr)
  return {name: name in text for name in ("shard_map", "pmap", "pallas_call", "random_bits",
                                          "sharding_constraint", "dot_general")}


def eval_check(workdir: Path, d: TrainData) -> dict:
  """The sharded `Trainer.evaluate` vs `evaluate_perplexity` over the replicated `logits_fn`."""
  from tetrajet_jax.data.pipeline import make_val_dataset  # pylint: disable=import-outside-toplevel
  from tetrajet_jax.evaluation.perplexity import evaluate_perplexity  # pylint: disable=import-outside-toplevel

  tr = Trainer(config(), d, workdir / "2x4", resume=True, mesh=sh.make_mesh(data=2, fsdp=4), progress=False,
               tensorboard=False, async_checkpoints=False)
  ours = tr.evaluate()
  ds = make_val_dataset(d.val_tokens, seq_len=128, batch_size=8, shard_index=0, shard_count=1, pad_id=d.pad_id)
  ref = evaluate_perplexity(tr.logits_fn(), iter(ds), token_bytes=d.token_bytes)
  prims = step_text(tr)
  tr.close()
  return {"ours": ours, "ref": ref, "primitives": prims}


def main(out_path: str, workdir: str) -> None:
  assert jax.device_count() == 8, jax.devices()
  workdir = Path(workdir)
  d = data()
  runs = {name: run_mesh(name, workdir, d) for name in MESHES}
  ref = runs["1"]
  res: dict = {"meshes": {}}
  for name, r in runs.items():
    res["meshes"][name] = {
        "compile_and_2_steps_s": r["compile_and_2_steps_s"],
        "metrics": [{k: v for k, v in h.items() if k.startswith(("train/", "osci/"))} for h in r["history"]],
        **param_diffs(r["after0"], ref["after0"]),
        "stats_diff_after1": max(max_diffs({k: v for k, v in r["after1"].items() if "oc_stats" in k},
                                           {k: v for k, v in ref["after1"].items() if "oc_stats" in k}).values()),
        "num_reset": r["num_reset"],
        "channels": r["channels"],
        "shardings": r["shardings"],
    }
  # Checkpoints across mesh shapes: 8 devices -> 1, 1 -> 8 (fsdp), and the uninterrupted runs' step 2. The
  # target meshes are ones trained on above, so their compiled steps are reused.
  print("checkpoints across meshes", file=sys.stderr, flush=True)
  t0 = time.time()
  for src in ("8x1", "1"):  # continue the 8-device run on 1 device, and the 1-device run on 4 devices
    full = Trainer(config(), d, workdir / f"{src}-full", mesh=sh.make_mesh(
        data=MESHES[src][0], fsdp=MESHES[src][1], devices=jax.devices()[: MESHES[src][0] * MESHES[src][1]]),
        progress=False, tensorboard=False, async_checkpoints=False)
    full.train(num_steps=3)
    res[f"uninterrupted_{src}"] = [{k: v for k, v in h.items() if k.startswith(("train/", "osci/"))}
                                   for h in full.history]
    full.close()
  res["ckpt_8_to_1"] = continue_on("8x1", "1", workdir, d, runs["8x1"]["after1"])
  res["ckpt_1_to_8"] = continue_on("1", "1x8", workdir, d, runs["1"]["after1"])
  res["checkpoint_s"] = time.time() - t0
  print("per-tensor amax and sharded evaluation", file=sys.stderr, flush=True)
  t0 = time.time()
  res["nvidia_amax"] = nvidia_amax()
  res["eval"] = eval_check(workdir, d)
  res["extra_s"] = time.time() - t0
  Path(out_path).write_text(json.dumps(res, indent=1, default=float))


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
