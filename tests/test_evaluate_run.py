"""``python -m tetrajet_jax.evaluation --run RESULTS/ARM``: a saved run's checkpoint, evaluated later."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tetrajet_jax.data import build as build_lib
from tetrajet_jax.data import corpus, locate, sources
from tetrajet_jax.evaluation import __main__ as evaluation_cli
from tetrajet_jax.train import TrainConfig, TrainData, Trainer


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A 4-step tiny bf16 run with checkpoints at steps 2 and 4, and its final validation numbers."""
  tmp = tmp_path_factory.mktemp("evalrun")
  folder = tmp / "src"
  folder.mkdir()
  # Distinct documents (the corpus builder removes exact and near duplicates): seeded word draws.
  rng = np.random.default_rng(0)
  words = "an old lighthouse keeper counts ships while gulls argue over bread near the harbour".split()
  for i in range(30):
    (folder / f"d{i:02d}.txt").write_text(" ".join(rng.choice(words, 300)) + ".")
  mp = pytest.MonkeyPatch()
  mp.setattr(sources, "SOURCES", {**sources.SOURCES, "syn": sources.directory_source("syn", folder)})
  build_lib.build(build_lib.BuildConfig(corpus=corpus.CorpusConfig(sources=("syn",), cache_dir=tmp / "cache",
                                                                   val_fraction=0.2),
                                        vocab_size=300, eval_tasks=()))
  mp.undo()
  paths = locate.locate_data("bpe300", bundle_dir=tmp / "no-bundle", cache_dir=tmp / "cache")
  cfg = TrainConfig(model="tiny", arm="bf16", layers=1, batch_size=2, seq_len=64, total_steps=4,
                    checkpoint_every=2, keep_checkpoints=2)
  run_dir = tmp / "results" / "bf16"
  trainer = Trainer(cfg, TrainData.from_located(paths), run_dir, progress=False, tensorboard=False,
                    async_checkpoints=False)
  trainer.train()
  final = trainer.evaluate()
  trainer.close()
  return run_dir, final


def test_evaluates_the_newest_and_an_older_checkpoint(run, capsys):
  run_dir, final = run
  metrics = (run_dir / "metrics.jsonl").read_bytes()
  assert evaluation_cli.main(["--run", str(run_dir), "--tasks", "none"]) == 0
  assert "bf16 step 4" in capsys.readouterr().out
  newest = json.loads((run_dir / "eval_step4.json").read_text(encoding="utf-8"))
  assert newest["step"] == 4 and newest["arm"] == "bf16" and newest["downstream"] == {}
  # The same state and the same compiled validation pass as the run's own final evaluation.
  for k in ("loss", "ppl", "bits_per_byte", "tokens", "batch_losses", "batch_tokens"):
    assert newest["val"][k] == final[k], k
  assert evaluation_cli.main(["--run", str(run_dir), "--step", "2", "--tasks", "none", "--val-batches", "1"]) == 0
  older = json.loads((run_dir / "eval_step2.json").read_text(encoding="utf-8"))
  assert older["step"] == 2 and len(older["val"]["batch_losses"]) == 1
  assert older["val"]["batch_losses"][0] != newest["val"]["batch_losses"][0]
  assert (run_dir / "metrics.jsonl").read_bytes() == metrics  # the run's files are only read


@pytest.mark.parametrize("extra, message", [
    (["--step", "3"], "no checkpoint for step 3"),
    (["--tasks", "mmlu"], "unknown task"),
])
def test_bad_requests_are_one_error_line(run, capsys, extra, message):
  run_dir, _ = run
  assert evaluation_cli.main(["--run", str(run_dir), *extra]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and message in err, err


def test_a_folder_without_a_run_is_refused(tmp_path, capsys):
  assert evaluation_cli.main(["--run", str(tmp_path)]) == 2
  assert "config.json does not exist" in capsys.readouterr().err
