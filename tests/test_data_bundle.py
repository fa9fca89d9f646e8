"""GPU bundle: packing, checksums, size limit, locate_data preferring it."""

from __future__ import annotations

import pytest

from tetrajet_jax.data import build as build_lib
from tetrajet_jax.data import bundle, cache, corpus, locate, sources


@pytest.fixture
def built(tmp_path, monkeypatch):
  folder = tmp_path / "src"
  folder.mkdir()
  for i in range(12):
    (folder / f"d{i:02d}.txt").write_text(f"Document number {i} says hello. " * 10)
  monkeypatch.setattr(sources, "SOURCES", {**sources.SOURCES,
                                           "syn": sources.directory_source("syn", folder)})
  cfg = build_lib.BuildConfig(
      corpus=corpus.CorpusConfig(sources=("syn",), cache_dir=tmp_path / "cache", val_fraction=0.3),
      vocab_size=300, eval_tasks=())
  build_lib.build(cfg)
  return tmp_path / "cache"


def test_pack_and_locate_prefers_bundle(tmp_path, built):
  out = tmp_path / "bundle"
  manifest = bundle.pack_bundle(out, tokenizers=("bpe300",), cache_dir=built, eval_tasks=(),
                                wheels=False)
  assert set(manifest["files"]) == {f"tokenized/bpe300/{f}" for f in
                                    ("manifest.json", "tokenizer.json", "train.npy", "val.npy",
                                     "val_prose.npy")}
  assert manifest["total_bytes"] == sum(f["bytes"] for f in manifest["files"].values())
  bundle.verify_bundle(out)
  data = locate.locate_data("bpe300", bundle_dir=out, cache_dir=built)
  assert data.origin == "bundle" and data.root == out / "tokenized" / "bpe300"
  assert data.tokens("val").size > 0
  assert data.tokenizer().vocab_size == data.vocab_size <= 300  # tiny corpus: fewer merges
  # Re-packing is idempotent.
  assert bundle.pack_bundle(out, tokenizers=("bpe300",), cache_dir=built, eval_tasks=(),
                            wheels=False)["files"] == manifest["files"]
  (out / "tokenized/bpe300/train.npy").write_bytes(b"junk")
  with pytest.raises(cache.CorruptCacheError, match="data.bundle --out"):
    bundle.verify_bundle(out)


def test_size_limit_and_missing_data(tmp_path, built):
  with pytest.raises(ValueError, match="MiB"):
    bundle.pack_bundle(tmp_path / "b", tokenizers=("bpe300",), cache_dir=built, eval_tasks=(),
                       wheels=False, max_bytes=100)
  with pytest.raises(FileNotFoundError, match="data.build --vocab-size 999"):
    bundle.pack_bundle(tmp_path / "c", tokenizers=("bpe999",), cache_dir=built, eval_tasks=(),
                       wheels=False)
  (tmp_path / "not_a_bundle").mkdir()
  (tmp_path / "not_a_bundle" / "precious.txt").write_text("x")
  with pytest.raises(ValueError, match="non-empty folder"):
    bundle.pack_bundle(tmp_path / "not_a_bundle", tokenizers=("bpe300",), cache_dir=built,
                       eval_tasks=(), wheels=False)


def test_gpu_wheel_pins_follow_this_environment():
  pins = bundle.gpu_wheel_pins()
  assert "grain==0.2.18" in pins and len(pins) == len(bundle.GPU_MISSING_PACKAGES)
