"""The one benchmark command (python -m experiments.bench all): each section in its own process with
its own limit, a failed or timed-out section reported without stopping the rest, and the performance
document rendered from the JSON files the run wrote."""

from __future__ import annotations

import json

import pytest

from experiments.bench import performance_doc, suite

TINY_TRAIN = "--models tiny --layers 1 --batch-size 2 --seq-len 64 --vocab 64 --steps 2 --warmup 2 --arms bf16"


def test_sections_run_in_turn_and_render_the_document(tmp_path):
  doc = tmp_path / "PERFORMANCE.md"
  results = suite.main(["--out-dir", str(tmp_path), "--sections", "recipes,train",
                        "--args", "recipes=--shapes 256x128x128 --reps 1 --backends xla",
                        "--args", f"train={TINY_TRAIN}", "--doc", str(doc)])
  assert [(r["section"], r["rc"]) for r in results] == [("recipes", 0), ("train", 0)]
  train = json.loads((tmp_path / "train.json").read_text())
  assert [r["arm"] for r in train["rows"]] == ["bf16"] and train["settings"]["scan_blocks"] == "on"
  recipes = json.loads((tmp_path / "recipes.json").read_text())
  assert {r["recipe"] for r in recipes["rows"]} >= {"bf16", "tetrajet_v2"}
  text = doc.read_text()
  assert performance_doc.recorded_sources(text) == [str(tmp_path / "recipes.json"), str(tmp_path / "train.json")]
  assert "| tiny | bf16 |" in text


def test_a_failing_section_is_reported_and_the_next_runs(tmp_path):
  results = suite.main(["--out-dir", str(tmp_path), "--sections", "train,recipes",
                        "--args", "train=--models no-such-model",
                        "--args", "recipes=--shapes 256x128x128 --reps 1 --backends xla"])
  assert [(r["section"], r["rc"], bool(r["json"])) for r in results] == [("train", 2, False), ("recipes", 0, True)]
  assert "--models: unknown ['no-such-model']" in (tmp_path / "train.log").read_text()


def test_a_section_past_its_limit_is_stopped(tmp_path):
  (result,) = suite.main(["--out-dir", str(tmp_path), "--sections", "recipes", "--limit-s", "0.01"])
  assert result["rc"] == "timeout" and result["json"] is None


@pytest.mark.parametrize("argv, message", [
    (["--sections", "quant,fp8"], "--sections: unknown ['fp8']"),
    (["--args", "fp8=--steps 2"], "expected SECTION=\"options\""),
    (["--limit-s", "0"], "--limit-s must be > 0"),
])
def test_bad_arguments_are_refused_before_any_section_runs(tmp_path, capsys, argv, message):
  with pytest.raises(SystemExit) as e:
    suite.main(["--out-dir", str(tmp_path / "out"), *argv])
  assert e.value.code == 2 and message in capsys.readouterr().err
  assert not (tmp_path / "out").exists()


def test_commit_id_marks_a_tree_that_differs_from_its_commit(tmp_path, monkeypatch):
  """A result names the commit its tree is: "-dirty" when tracked files differ from HEAD (a copied
  tree whose git metadata lags its files), "unknown" outside git; $BENCH_COMMIT wins."""
  import subprocess

  from experiments.bench.timing import commit_id

  monkeypatch.delenv("BENCH_COMMIT", raising=False)
  assert commit_id(tmp_path) == "unknown"
  git = lambda *args: subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True)
  git("init", "-q")
  (tmp_path / "a.py").write_text("x = 1\n")
  git("add", "a.py")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
  sha = git("rev-parse", "--short", "HEAD").stdout.strip()
  (tmp_path / "notes.txt").write_text("untracked files do not count\n")
  assert commit_id(tmp_path) == sha
  (tmp_path / "a.py").write_text("x = 2\n")
  assert commit_id(tmp_path) == f"{sha}-dirty"
  monkeypatch.setenv("BENCH_COMMIT", "abc1234")
  assert commit_id(tmp_path) == "abc1234"
