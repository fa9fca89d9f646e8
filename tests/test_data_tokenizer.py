"""Tokenizer training, round trip, byte accounting, tokenized arrays."""

from __future__ import annotations

import numpy as np
import pytest

from tetrajet_jax.data import build as build_lib
from tetrajet_jax.data import cache, corpus, locate, sources, tokenized
from tetrajet_jax.data import tokenizer as tokenizer_lib


@pytest.fixture(scope="module")
def code_texts():
  # Real corpus text that needs no network: the code share.
  return [t for _, t in sources.stdlib_documents(max_bytes=300_000)]


@pytest.fixture(scope="module")
def small_tok(code_texts):
  return tokenizer_lib.train_bpe(code_texts, vocab_size=600)


def test_training_is_deterministic(code_texts, small_tok):
  again = tokenizer_lib.train_bpe(code_texts, vocab_size=600)
  assert again.hf.to_str() == small_tok.hf.to_str()
  assert small_tok.vocab_size == 600
  assert small_tok.eos_id == 0 and small_tok.pad_id == 1
  assert small_tok.dtype == np.uint16


@pytest.mark.parametrize("extra", ["", "naïve café — 東京 🙂\t\r\n  x", "<|endoftext|> literal"])
def test_round_trip(code_texts, small_tok, extra):
  for text in code_texts[:40] + [extra]:
    assert small_tok.decode(small_tok.encode(text)) == text


def test_token_byte_lengths_count_utf8_bytes(code_texts, small_tok):
  lengths = small_tok.token_byte_lengths()
  assert lengths.shape == (small_tok.vocab_size,)
  assert lengths[small_tok.eos_id] == 0
  for text in code_texts[:20] + ["naïve 東京 🙂"]:
    assert lengths[small_tok.encode(text)].sum() == len(text.encode("utf-8"))


def test_vocab_size_is_validated():
  with pytest.raises(ValueError, match="vocab_size"):
    tokenizer_lib.train_bpe(["abc"], vocab_size=100)


def _synthetic_sources(tmp_path, n_docs):
  folder = tmp_path / "src"
  folder.mkdir()
  for i in range(n_docs):
    (folder / f"d{i:03d}.txt").write_text(
        f"The {i}th quick brown fox jumps over {i % 7} lazy dogs. " * 5, encoding="utf-8")
  return {"syn": sources.directory_source("syn", folder)}


def test_build_end_to_end_arrays_and_idempotence(tmp_path, monkeypatch):
  extra = _synthetic_sources(tmp_path, 20)
  monkeypatch.setattr(sources, "SOURCES", {**sources.SOURCES, **extra})
  cfg = build_lib.BuildConfig(
      corpus=corpus.CorpusConfig(sources=("syn",), cache_dir=tmp_path / "cache", val_fraction=0.2),
      vocab_size=300, eval_tasks=())
  result = build_lib.build(cfg)
  tok = result["tokenizer"]
  for split in corpus.SPLITS:
    arr = tokenized.load_split(cfg.tokenized_dir, split)
    entry = result["tokenized"]["splits"][split]
    assert arr.dtype == np.uint16 and arr.size == entry["tokens"]
    assert arr[0] == tok.eos_id and arr[-1] == tok.eos_id
    assert (arr == tok.eos_id).sum() == entry["docs"] + 1
    docs = [t for _, _, t in corpus.iter_documents(cfg.corpus.corpus_dir, result["corpus"], split)]
    pieces = np.split(arr, np.flatnonzero(arr == tok.eos_id))
    decoded = sorted(tok.decode(p[1:]) for p in pieces if p.size > 1)
    assert decoded == sorted(docs)
  report = build_lib.format_report(result)
  assert "syn" in report and "train:" in report
  # Second run: nothing rewritten.
  mtime = (cfg.tokenized_dir / "train.npy").stat().st_mtime_ns
  build_lib.build(cfg)
  assert (cfg.tokenized_dir / "train.npy").stat().st_mtime_ns == mtime
  # locate_data finds it in the cache when no bundle exists.
  data = locate.locate_data("bpe300", cache_dir=tmp_path / "cache", bundle_dir=tmp_path / "none")
  assert data.origin == "cache" and data.vocab_size == 300
  # Corruption is reported with the command that fixes it, then repaired.
  with open(cfg.tokenized_dir / "val.npy", "r+b") as f:
    f.seek(-2, 2)
    f.write(b"\xff\xff")
  with pytest.raises(cache.CorruptCacheError, match="tetrajet_jax.data.build"):
    locate.locate_data("bpe300", cache_dir=tmp_path / "cache", bundle_dir=tmp_path / "none")
  build_lib.build(cfg)
  tokenized.load_split(cfg.tokenized_dir, "val", verify=True)


def test_empty_split_is_a_clear_error(tmp_path, monkeypatch):
  extra = _synthetic_sources(tmp_path, 1)  # one document: validation stays empty
  monkeypatch.setattr(sources, "SOURCES", {**sources.SOURCES, **extra})
  cfg = build_lib.BuildConfig(
      corpus=corpus.CorpusConfig(sources=("syn",), cache_dir=tmp_path / "cache"),
      vocab_size=300, eval_tasks=())
  with pytest.raises(ValueError, match="val split is empty"):
    build_lib.build(cfg)


def test_missing_data_names_the_build_command(tmp_path):
  with pytest.raises(FileNotFoundError, match="tetrajet_jax.data.build --vocab-size 512"):
    locate.locate_data("bpe512", cache_dir=tmp_path, bundle_dir=tmp_path)


def test_cli_reports_bad_input_with_exit_code_2(tmp_path, capsys):
  assert build_lib.main(["--sources", "nope", "--cache", str(tmp_path), "--no-eval", "-q"]) == 2
  assert "unknown corpus source" in capsys.readouterr().err
