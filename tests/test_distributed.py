"""Data parallel + FSDP through JAX's SPMD: sharded steps equal the single-device step.

The multi-device checks run once, in a subprocess with 8 simulated CPU
devices (`tests/_distributed_worker.py`); pytest's own process may already
hold a 1-device JAX. The run is a 1-block ``tiny`` model, ``tetrajet_v2_full``,
8 x 128 tokens per step, OutControl calibrating on steps 0-3 and OsciReset's
first window on update 0 (reset at update 1), on the meshes
1, (8 data), (2 data x 4 fsdp), (1 data x 8 fsdp).

Tolerances (why not bitwise): the forward is row-local, but the loss is a
mean whose per-device partial sums are added in another order than on one
device (the step-0 loss within 1e-6 relative). The backward adds
partial sums across devices (dW contracts over tokens, the gradient norm, the
OutControl channel norms) in another order than one device does: ~1 ulp.
Two effects then enlarge a few elements: stochastic rounding of dY / X_hat
can flip one FP4 code when its input moved by an ulp (a ~1e-4 relative change
of a handful of gradient elements), and Adam divides by sqrt(v) + eps, so
gradient elements near eps turn ulp differences into a visible fraction of
the step. Hence: loss, gradient norm and later-step metrics within 1e-5
relative; each step-0 gradient leaf within 5e-3 of its largest magnitude
(changed SR decisions, not reduction order, set this); at least 99.9% of the
parameters' elements within 1e-6 of their leaf's largest magnitude after the
update (a parameter's own difference is no bound: Adam divides each element
by its own gradient's magnitude, so a small gradient that an SR decision
moved moves its update by a fraction of the LR); OutControl statistics within
1e-6 relative; the OsciReset reset counts and the frozen OutControl channels
exactly equal. Measured on CPU: gradients within 1.2e-3 of their leaf's
largest (qkv, and through its dX the embedding), 8 of 230k parameter
elements beyond 1e-6, the largest 0.19 lr (a qkv element whose gradient was
6e-7, 60 x Adam's eps, on one device and 4e-8 on the meshes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from tetrajet_jax.linear import outlier_count
from tetrajet_jax.train import TrainConfig, distributed
from tetrajet_jax.train import sharding as sh

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  work = tmp_path_factory.mktemp("distributed")
  out = work / "out.json"
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": str(REPO)}
  # No wall-clock timeout of its own: on a loaded machine the FP4 steps take minutes each to compile, and
  # CI's job limit is the one that should stop a hung run. A failure shows the worker's own output.
  proc = subprocess.run([sys.executable, "-m", "tests._distributed_worker", str(out), str(work)], cwd=REPO,
                        env=env, capture_output=True, text=True, check=False)
  assert proc.returncode == 0, (f"worker exited with {proc.returncode}\n--- stdout (tail) ---\n"
                                f"{proc.stdout[-3000:]}\n--- stderr (tail) ---\n{proc.stderr[-6000:]}")
  return json.loads(out.read_text())


@pytest.mark.parametrize("mesh", ["8x1", "2x4", "1x8"])
def test_one_step_matches_single_device(results, mesh):
  ref, got = results["meshes"]["1"], results["meshes"][mesh]
  # Forward: the per-token losses are row-local; their mean adds per-device partial sums in another
  # order than one device does (a few ulp of the mean).
  assert got["metrics"][0]["train/loss"] == pytest.approx(ref["metrics"][0]["train/loss"], rel=1e-6, abs=0)
  for a, b in zip(got["metrics"], ref["metrics"]):
    for k in ("train/loss", "train/ce", "train/grad_norm", "train/param_norm"):
      assert a[k] == pytest.approx(b[k], rel=1e-5), (mesh, k)
  assert got["grad_max_rel_after0"] <= 5e-3, got["grad_max_rel_after0"]
  assert got["param_frac_beyond_1e-6_after0"] <= 1e-3, got["param_frac_beyond_1e-6_after0"]
  assert got["stats_diff_after1"] <= 1e-6


@pytest.mark.parametrize("mesh", ["8x1", "2x4", "1x8"])
def test_outcontrol_channels_and_osci_resets_equal_single_device(results, mesh):
  ref, got = results["meshes"]["1"], results["meshes"][mesh]
  assert all(n > 0 for n in ref["num_reset"].values()), ref["num_reset"]  # the window really reset elements
  assert got["num_reset"] == ref["num_reset"]
  # round(0.1 K) MXFP8 channels in every block linear of tiny (K = 128, and 256 for mlp/down).
  ks = {"layers_0/attn/qkv": 128, "layers_0/attn/out": 128, "layers_0/mlp/up_gate": 128, "layers_0/mlp/down": 256}
  assert {name: len(c) for name, c in ref["channels"].items()} == {n: outlier_count(k, 0.1) for n, k in ks.items()}
  assert got["channels"] == ref["channels"]
  for a, b in zip(got["metrics"], ref["metrics"]):
    for k in b:
      if k.startswith("osci/"):
        assert a[k] == b[k], (mesh, k)


def test_fsdp_shards_params_and_optimizer_state_alike(results):
  specs = results["meshes"]["1x8"]["shardings"]
  kernel = "['layers_0']['mlp']['up_gate']['kernel']"
  for prefix in ("['params']", "['opt'][1][0].mu", "['opt'][1][0].nu", "['opt'][2].d_q", "['opt'][2].d_w"):
    assert specs[prefix + kernel] == str(P(None, "fsdp")), prefix  # along N: K blocks stay whole
  assert specs["['params']['embed']['embedding']"] == str(P("fsdp"))
  assert specs["['params']['final_norm']['weight']"] == str(P())
  assert specs["['opt'][2].num_reset" + kernel] == str(P())
  assert all(s == str(P()) for s in results["meshes"]["8x1"]["shardings"].values())


@pytest.mark.parametrize("which,src", [("ckpt_8_to_1", "8x1"), ("ckpt_1_to_8", "1")])
def test_checkpoint_restores_on_another_mesh_and_continues(results, which, src):
  r = results[which]
  assert r["restored_bitwise"]  # every array of the step-2 state, gathered, equals what was saved
  assert r["devices"] == ([1] if which == "ckpt_8_to_1" else [8])
  assert r["placed_example"] == (str(P()) if which == "ckpt_8_to_1" else str(P(None, "fsdp")))
  uninterrupted = results[f"uninterrupted_{src}"][2]
  cont = r["history"][0]
  assert cont["step"] == 2
  # Same state, same batch (the grain position is restored): the step-2 loss is the same forward on
  # another mesh. Only the order of the float32 reductions may differ (per-device partial sums, and
  # XLA's fusion choices): for a mean of 1024 positive token losses, reordering moves it by at most
  # ~log2(1024) * 2^-24 = 6e-7 relative (seen: 0-3 ulp, 7e-8 to 3.2e-7, depending on the
  # commit). One different quantized value would move it by ~1e-4.
  assert cont["train/loss"] == pytest.approx(uninterrupted["train/loss"], rel=1e-6, abs=0)
  for k in ("train/grad_norm", "train/param_norm"):
    assert cont[k] == pytest.approx(uninterrupted[k], rel=1e-5), k


def test_nvidia_per_tensor_amax_is_global_under_a_batch_split(results):
  r = results["nvidia_amax"]
  assert r["y_equal"] and r["dx_equal"] and r["dw_rel"] <= 1e-6
  assert r["local_amax_rel"] > 1e-2  # what a per-shard amax would have produced: clearly different


def test_sharded_evaluation_and_no_local_views(results):
  ours, ref = results["eval"]["ours"], results["eval"]["ref"]
  assert ours["tokens"] == ref["tokens"] and ours["bytes"] == ref["bytes"]
  for k in ("loss", "ppl", "bits_per_byte"):
    assert ours[k] == pytest.approx(ref[k], rel=1e-6), k
  prims = results["eval"]["primitives"]
  # The quantized linears' nested jaxprs are in the text (their SR bits, the FSDP constraints).
  assert prims["random_bits"] and prims["dot_general"] and prims["sharding_constraint"]
  assert not (prims["shard_map"] or prims["pmap"] or prims["pallas_call"])


# ---- bad input, before compute (abstract meshes: no devices needed) ------------------------

def test_mesh_that_splits_tokens_blocks_or_batch_is_rejected():
  mesh = AbstractMesh((2, 4), ("data", "fsdp"))
  with pytest.raises(ValueError, match=r"64 tokens per device, not a multiple of 128.*batch_size a multiple "
                                       r"of 16, or seq_len a multiple of 128"):
    sh.check_batch(8, mesh, seq_len=64, quantized=True)
  sh.check_batch(8, mesh, seq_len=64, quantized=False)  # bf16: no blocks along tokens
  sh.check_batch(16, mesh, seq_len=64, quantized=True)
  with pytest.raises(ValueError, match="batch_size=6 is not divisible by the 8 batch shards"):
    sh.check_batch(6, mesh)


def test_mesh_that_does_not_divide_model_dims_is_rejected():
  mesh = AbstractMesh((1, 8), ("data", "fsdp"))
  with pytest.raises(ValueError, match=r"fsdp=8 does not divide dim 1 \(size 388\) of parameter "
                                       r"layers_0/attn/qkv/kernel \[128, 388\].*e\.g\. \[1, 2, 4\]"):
    sh.param_spec(("layers_0", "attn", "qkv", "kernel"), (128, 388), mesh)
  assert sh.param_spec(("layers_0", "attn", "qkv", "kernel"), (128, 384), mesh) == P(None, "fsdp")
  assert sh.param_spec(("embed", "embedding"), (256, 128), mesh) == P("fsdp")
  assert sh.param_spec(("final_norm", "weight"), (128,), mesh) == P()
  with pytest.raises(ValueError, match=r"K=128, quantized in 1x128 blocks\) over mesh axis fsdp \(8 shards\) "
                                       r"gives 16 elements per shard.*span two devices"):
    sh.check_block_aligned((128, 384), P("fsdp", None), mesh, name="quantized kernel qkv")
  sh.check_block_aligned((1024, 384), P("fsdp", None), mesh)  # 128 per shard: whole blocks


def test_mesh_config_and_cli_spec():
  assert sh.parse_mesh("data=2,fsdp=4") == {"data": 2, "fsdp": 4}
  assert sh.parse_mesh("fsdp=8") == {"fsdp": 8}
  for bad, msg in (("tensor=2", "not AXIS=SIZE"), ("data=2,data=2", "given twice"), ("fsdp=0", "must be >= 1"),
                   ("data=x", "not an integer")):
    with pytest.raises(ValueError, match=msg):
      sh.parse_mesh(bad)
  n = jax.device_count()
  with pytest.raises(ValueError, match=f"fsdp={n + 1} must divide the {n} devices"):
    sh.make_mesh(fsdp=n + 1)
  with pytest.raises(ValueError, match="choose sizes whose product"):
    sh.make_mesh(data=n + 1, fsdp=1)
  cfg = TrainConfig(model="tiny", arm="bf16", batch_size=2, seq_len=64, total_steps=10, mesh_fsdp=2)
  assert "mesh_fsdp" not in cfg.run_identity()  # placement: a checkpoint restores onto any mesh


def test_distributed_settings_from_args_env_and_cluster(monkeypatch):
  for v in ("TETRAJET_COORDINATOR", "TETRAJET_NUM_PROCESSES", "TETRAJET_PROCESS_ID", "JAX_COORDINATOR_ADDRESS",
            "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
    monkeypatch.delenv(v, raising=False)
  assert distributed.resolve().source == "single"
  s = distributed.resolve("10.0.0.1:1234", 2, 1)
  assert (s.coordinator, s.num_processes, s.process_id, s.source) == ("10.0.0.1:1234", 2, 1, "args/env")
  monkeypatch.setenv("TETRAJET_COORDINATOR", "host0:5555")
  monkeypatch.setenv("TETRAJET_NUM_PROCESSES", "4")
  monkeypatch.setenv("TETRAJET_PROCESS_ID", "3")
  assert distributed.resolve() == distributed.DistributedSettings(
      coordinator="host0:5555", num_processes=4, process_id=3, source="args/env")
  assert distributed.resolve(process_id=0).process_id == 0  # the CLI wins over the environment
  with pytest.raises(ValueError, match=r"process_id=4 must be in \[0, num_processes=4\)"):
    distributed.resolve(process_id=4)
  monkeypatch.delenv("TETRAJET_PROCESS_ID")
  with pytest.raises(ValueError, match="--process-id missing and no cluster launcher"):
    distributed.resolve()
  monkeypatch.setenv("SLURM_NTASKS", "2")  # srun: JAX fills in what is missing
  assert distributed.resolve().source == "args/env"
  for v in ("TETRAJET_COORDINATOR", "TETRAJET_NUM_PROCESSES"):
    monkeypatch.delenv(v)
  assert distributed.resolve().source == "cluster"
  monkeypatch.setenv("SLURM_NTASKS", "1")
  assert distributed.resolve().source == "single"
  assert distributed.initialize(num_processes=1).source == "single"  # a no-op on one process
