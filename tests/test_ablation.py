"""The ablation runner end to end on a synthetic corpus: table, CSV, plots, errors."""

from __future__ import annotations

import csv
import json
import os
import types

import jax
import pytest

from experiments import ablation, arm_run, run_checks, tables
from tetrajet_jax.data import build as build_lib
from tetrajet_jax.data import corpus, sources
from tetrajet_jax.evaluation.downstream import length_buckets
from tetrajet_jax.train.arms import get_arm
from tetrajet_jax.train.config import TrainConfig
from tetrajet_jax.train.evaluate_run import DOWNSTREAM_BATCH


@pytest.fixture
def cache(tmp_path, monkeypatch):
  folder = tmp_path / "src"
  folder.mkdir()
  words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing".split()
  for i in range(40):
    text = " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(400))
    (folder / f"d{i:02d}.txt").write_text(text + ".")
  monkeypatch.setattr(sources, "SOURCES", {**sources.SOURCES, "syn": sources.directory_source("syn", folder)})
  root = tmp_path / "cache"
  build_lib.build(build_lib.BuildConfig(
      corpus=corpus.CorpusConfig(sources=("syn",), cache_dir=root, val_fraction=0.2),
      vocab_size=300, eval_tasks=()))
  monkeypatch.setenv("TETRAJET_CACHE", str(root))
  monkeypatch.setenv("TETRAJET_BUNDLE", str(tmp_path / "no-bundle"))
  return root


def _argv(out, *extra):
  return ["--model", "tiny", "--layers", "1", "--arms", "bf16,tetrajet_v2", "--steps", "8",
          "--batch-size", "2", "--seq-len", "64", "--data", "bpe300", "--downstream", "none",
          "--eval-every", "4", "--eval-batches", "1", "--out", str(out), "--no-progress",
          "--no-compile-cache", *extra]


def test_runner_writes_table_and_plots(cache, tmp_path, capsys):
  out = tmp_path / "res"
  assert ablation.main(_argv(out)) == 0
  printed = capsys.readouterr().out
  assert "| bf16 | ok |" in printed and "| tetrajet_v2 | ok |" in printed
  rows = list(csv.DictReader(open(out / "results.csv", encoding="utf-8")))
  assert [r["arm"] for r in rows] == ["bf16", "tetrajet_v2"]
  assert all(float(r["val PPL"]) > 1.0 for r in rows)
  for name in ("results.md", "loss.png", "oscillation.png", "bf16/metrics.jsonl", "tetrajet_v2/final.json"):
    assert (out / name).is_file() and (out / name).stat().st_size > 0, name
  # Running again without --resume refuses; with --resume it reuses the finished arms.
  assert ablation.main(_argv(out)) == 2
  assert "pass --resume" in capsys.readouterr().err
  assert ablation.main(_argv(out, "--resume")) == 0
  printed = capsys.readouterr().out
  assert "finished earlier" in printed
  # The verdict follows the table; final.json keeps the per-batch validation losses it pairs.
  assert "verdict:" in printed and "evaluation noise" in printed
  val = json.loads((out / "tetrajet_v2" / "final.json").read_text(encoding="utf-8"))["val"]
  assert len(val["batch_losses"]) == len(val["batch_tokens"]) >= 1
  # The FP4 arm's latent weights at the end: every element of its FP4 kernels in one bin (|w / s| < 6.5).
  hist = json.loads((out / "tetrajet_v2" / tables.LATENT_HISTOGRAM).read_text(encoding="utf-8"))
  derived = json.loads((out / "tetrajet_v2" / "config.json").read_text(encoding="utf-8"))["derived"]
  fp4_blocks = 1 - len(derived["bf16_blocks"])
  per_block = derived["param_counts"]["quantized"]  # --layers 1: one block
  assert len(hist["edges"]) == len(hist["counts"]) + 1 and hist["step"] == 8
  assert sum(hist["counts"]) == fp4_blocks * per_block > 0
  assert not (out / "bf16" / tables.LATENT_HISTOGRAM).exists()


def test_stop_after_is_a_throughput_probe(cache, tmp_path, capsys):
  """--stop-after N trains N steps of the same schedule, writes throughput.json
  and no final.json (the arm is not finished), and prints the tokens/s table."""
  out = tmp_path / "probe"
  argv = _argv(out, "--stop-after", "3")
  argv[argv.index("bf16,tetrajet_v2")] = "bf16"
  assert ablation.main(argv) == 0
  printed = capsys.readouterr().out
  assert "stopped after 3 steps" in printed and "| bf16 | 3 |" in printed
  probe = json.loads((out / "throughput.json").read_text(encoding="utf-8"))
  assert probe["bf16"]["steps"] == 3 and probe["bf16"]["tokens_per_s"] > 0
  assert not (out / "bf16" / "final.json").exists()


@pytest.mark.parametrize("extra, message", [
    (["--arms", "bf16,fp8"], "valid arms: bf16, nvidia_nvfp4"),
    (["--model", "1b"], "valid models: tiny"),
    (["--seq-len", "60"], "not a multiple of 128"),
    (["--tokens", "1000"], "not a whole number of steps of 128 tokens"),
    (["--tokens", "2048"], "do not fit the schedule"),
    (["--downstream", "mmlu"], "unknown downstream task"),
])
def test_bad_input_fails_before_compute(tmp_path, capsys, extra, message):
  assert ablation.main(_argv(tmp_path / "x", *extra)) == 2
  assert message in capsys.readouterr().err
  assert not (tmp_path / "x").exists()


def test_backend_flag_reaches_every_arm_and_is_validated(tmp_path, capsys):
  """--backend (default auto) is each arm's TrainConfig.backend, part of the
  run identity; an unknown backend is a usage error naming the valid ones."""
  argv = ["--model", "tiny", "--arms", "bf16,tetrajet_v2", "--tokens", "16384", "--batch-size", "2",
          "--seq-len", "128", "--out", str(tmp_path)]
  plans = {b: ablation.make_plan(ablation.parse_args(argv + ([] if b is None else ["--backend", b])),
                                 vocab_size=512, train_tokens=100_000) for b in (None, "xla")}
  assert {c.backend for c in plans[None].configs.values()} == {"auto"}
  assert {c.backend for c in plans["xla"].configs.values()} == {"xla"}
  ids = [ablation._run_identity(p) for p in plans.values()]  # pylint: disable=protected-access
  assert ids[0] != ids[1]
  with pytest.raises(run_checks.UsageError, match="invalid choice: 'turbo'"):
    ablation.parse_args(argv + ["--backend", "turbo"])


def test_scan_blocks_flag_reaches_the_config_not_the_run_identity(tmp_path):
  """--scan-blocks / --no-scan-blocks pick the layout (default: None, the
  backend's choice); a results folder (and its checkpoints) may mix them,
  since they compute the same model up to float summation order."""
  argv = ["--model", "tiny", "--arms", "bf16,tetrajet_v2", "--tokens", "16384", "--batch-size", "2",
          "--seq-len", "128", "--out", str(tmp_path)]
  plans = {flag: ablation.make_plan(ablation.parse_args(argv + ([flag] if flag else [])), vocab_size=512,
                                    train_tokens=100_000)
           for flag in (None, "--scan-blocks", "--no-scan-blocks")}
  assert all(c.scan_blocks is None for c in plans[None].configs.values())
  assert all(c.scan_blocks is True for c in plans["--scan-blocks"].configs.values())
  assert all(c.scan_blocks is False for c in plans["--no-scan-blocks"].configs.values())
  ids = [ablation._run_identity(p) for p in plans.values()]  # pylint: disable=protected-access
  assert ids[0] == ids[1] == ids[2]


@pytest.mark.parametrize("extra, message", [
    (["--keep-checkpoints", "-1"], "--keep-checkpoints -1"),
    (["--backend", "turbo"], "invalid choice: 'turbo'"),
    (["--backend", "pallas"], "--backend pallas"),
    (["--attention", "cudnn"], "--attention cudnn needs an NVIDIA GPU"),
    (["--mesh", "data=3"], "3 devices, but there are 1"),
    (["--mesh", "fsdp=2"], "--mesh fsdp=2"),
    (["--retry", "nvidia_nvfp4"], "not among --arms"),
])
def test_configuration_errors_are_one_line_before_writing(tmp_path, capsys, extra, message):
  """Each refused setting is a single ``error:`` line with exit code 2, and the
  results folder is not created (a refused mesh leaves no run.json behind)."""
  if jax.default_backend() == "gpu" and extra[0] in ("--attention",) + (("--backend",) if "pallas" in extra else ()):
    pytest.skip("valid on a GPU")
  if jax.device_count() > 1 and extra[0] == "--mesh":
    pytest.skip("device-count specific")
  out = tmp_path / "x"
  assert ablation.main(_argv(out, *extra)) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and message in err, err
  assert len(err.strip().splitlines()) == 1, err
  assert not out.exists()


def test_out_that_cannot_be_written_is_refused(tmp_path, capsys):
  blocker = tmp_path / "file.txt"
  blocker.write_text("not a folder")
  assert ablation.main(_argv(blocker / "res")) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --out") and "is not a folder" in err and len(err.strip().splitlines()) == 1
  if os.geteuid() != 0:  # root writes anywhere
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    assert ablation.main(_argv(locked / "res")) == 2
    assert "is not writable" in capsys.readouterr().err
    assert not (locked / "res").exists()


def test_diverged_arm_is_rerun_only_with_retry(cache, tmp_path, capsys):
  """--resume never reuses a diverged arm's final.json silently; --retry moves the
  old run to <arm>/history/ and may change its LR, recorded in run.json."""
  out = tmp_path / "res"
  argv = _argv(out)
  argv[argv.index("bf16,tetrajet_v2")] = "bf16"
  assert ablation.main(argv) == 0
  diverged = {"arm": "bf16", "status": "diverged", "error": "step 5: non-finite train/loss=nan"}
  (out / "bf16" / "final.json").write_text(json.dumps(diverged), encoding="utf-8")
  capsys.readouterr()
  assert ablation.main(argv + ["--resume"]) == 1
  err = capsys.readouterr().err
  assert "bf16: diverged earlier" in err and "--retry bf16" in err
  assert json.loads((out / "bf16" / "final.json").read_text(encoding="utf-8")) == diverged
  assert ablation.main(argv + ["--resume", "--lr", "1e-3"]) == 2  # another LR needs --retry
  assert "--retry ARM" in capsys.readouterr().err

  assert ablation.main(argv + ["--resume", "--retry", "bf16", "--lr", "1e-3"]) == 0
  assert "starting over (--retry)" in capsys.readouterr().out
  run = json.loads((out / "run.json").read_text(encoding="utf-8"))
  assert run["train"]["peak_lr"] == 3e-3  # the folder's shared settings stay
  assert run["arm_settings"] == {"bf16": {"peak_lr": 1e-3}}
  (entry,) = run["history"]
  assert entry["arm"] == "bf16" and entry["previous_status"] == "diverged"
  assert entry["changed"] == {"peak_lr": [3e-3, 1e-3]}
  moved = out / entry["moved_to"]
  assert json.loads((moved / "final.json").read_text(encoding="utf-8")) == diverged
  assert (moved / "metrics.jsonl").is_file()
  final = json.loads((out / "bf16" / "final.json").read_text(encoding="utf-8"))
  assert final["status"] == "completed"
  config = json.loads((out / "bf16" / "config.json").read_text(encoding="utf-8"))
  assert config["train"]["peak_lr"] == 1e-3
  # Resuming the folder later keeps the retried arm's own LR (no settings clash).
  assert ablation.main(argv + ["--resume"]) == 0
  assert "finished earlier" in capsys.readouterr().out


@pytest.mark.parametrize("arm,no_cache,stop_after,compiles", [
    ("tetrajet_v2", False, None, True),  # with the persistent cache: every arm, downstream forwards included
    ("bf16", False, None, True),
    ("tetrajet_v2", True, None, False),  # without it the loop would compile everything a second time
    ("tetrajet_v2_outcontrol", True, None, True),  # OutControl's phase switches still never stall the loop
    ("tetrajet_v2", False, 30, False),  # a throughput probe compiles only what it runs
])
def test_what_an_arm_compiles_before_step_0(arm, no_cache, stop_after, compiles, capsys):
  calls = []
  config = TrainConfig(model="tiny", arm=arm, batch_size=2, seq_len=64, total_steps=2000)
  trainer = types.SimpleNamespace(config=config, precompile=lambda logits_shapes: calls.append(logits_shapes) or ["fp4"])
  plan = types.SimpleNamespace(args=types.SimpleNamespace(stop_after=stop_after, no_compile_cache=no_cache),
                               tasks=["piqa"])
  arm_run._compile_up_front(plan, get_arm(arm), trainer)  # pylint: disable=protected-access
  assert calls == ([[(DOWNSTREAM_BATCH, t) for t in length_buckets(64)]] if compiles else [])
  assert ("up front in" in capsys.readouterr().out) == compiles
