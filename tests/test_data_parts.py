"""Parts for the GPU machine: pack -> unpack round trip, partial and corrupt sets."""

from __future__ import annotations

import numpy as np
import pytest

from tetrajet_jax.data import build as build_lib
from tetrajet_jax.data import bundle, corpus, locate, pack, parts, sources, unpack


@pytest.fixture
def built(tmp_path, monkeypatch):
  folder = tmp_path / "src"
  folder.mkdir()
  rng = np.random.default_rng(21)
  words = ["alpha", "beta", "gamma", "delta", "river", "stone", "light", "cloud", "north"]
  for i in range(30):
    text = " ".join(rng.choice(words, size=400)) + f" document {i}."
    (folder / f"d{i:02d}.txt").write_text(text)
  monkeypatch.setattr(sources, "SOURCES", {**sources.SOURCES,
                                           "syn": sources.directory_source("syn", folder)})
  cfg = build_lib.BuildConfig(
      corpus=corpus.CorpusConfig(sources=("syn",), cache_dir=tmp_path / "cache", val_fraction=0.2),
      vocab_size=300, eval_tasks=())
  build_lib.build(cfg)
  return tmp_path / "cache"


def _pack(built, out, max_part_bytes=1500):
  files, meta = bundle.collect_files(tokenizers=("bpe300",), cache_dir=built, eval_tasks=(),
                                     wheels=False)
  return parts.pack_files(files, out, max_part_bytes=max_part_bytes, jobs=1,
                          extra={"bundle_manifest": bundle.bundle_manifest(files, meta)})


def test_round_trip_rebuilds_identical_arrays(tmp_path, built):
  manifest = _pack(built, tmp_path / "parts")
  assert all(p["bytes"] <= 1500 for p in manifest["parts"].values())
  assert len(manifest["files"]["tokenized/bpe300/train.npy"]["parts"]) > 1  # really split
  assert unpack.main(["--parts", str(tmp_path / "parts"), "--dest", str(tmp_path / "b"),
                      "--jobs", "2"]) == 0  # the multi-process path
  bundle.verify_bundle(tmp_path / "b")
  src = locate.locate_data("bpe300", bundle_dir=tmp_path / "none", cache_dir=built)
  got = locate.locate_data("bpe300", bundle_dir=tmp_path / "b", cache_dir=built)
  assert got.origin == "bundle" and src.origin == "cache"
  for split in src.manifest["splits"]:
    np.testing.assert_array_equal(got.tokens(split), src.tokens(split))
    assert got.tokens(split).dtype == src.tokens(split).dtype
  assert (got.tokenizer_json.read_bytes() == src.tokenizer_json.read_bytes())


def test_missing_part_is_named_and_nothing_is_written(tmp_path, built, capsys):
  manifest = _pack(built, tmp_path / "parts")
  gone = sorted(manifest["parts"])[1]
  (tmp_path / "parts" / gone).unlink()
  with pytest.raises(parts.MissingPartsError, match=gone):
    parts.unpack_parts(tmp_path / "parts", tmp_path / "b")
  assert not (tmp_path / "b" / "tokenized").exists()
  assert unpack.main(["--parts", str(tmp_path / "parts"), "--check-only"]) == 1
  assert f"missing: {gone}" in capsys.readouterr().out
  assert unpack.main(["--parts", str(tmp_path / "parts"), "--dest", str(tmp_path / "b")]) == 2
  assert "MissingPartsError" in capsys.readouterr().err


def test_corrupt_part_is_refused(tmp_path, built, capsys):
  manifest = _pack(built, tmp_path / "parts")
  bad = sorted(manifest["parts"])[0]
  data = bytearray((tmp_path / "parts" / bad).read_bytes())
  data[len(data) // 2] ^= 0xFF
  (tmp_path / "parts" / bad).write_bytes(bytes(data))
  assert parts.check_parts(tmp_path / "parts")["bad"] == [bad]
  with pytest.raises(parts.CorruptPartError, match=bad):
    parts.unpack_parts(tmp_path / "parts", tmp_path / "b")
  assert not (tmp_path / "b" / "tokenized").exists()
  assert unpack.main(["--parts", str(tmp_path / "parts"), "--check-only"]) == 1
  assert f"bad: {bad}" in capsys.readouterr().out


def test_missing_manifest_and_complete_check(tmp_path, built):
  with pytest.raises(parts.MissingPartsError, match="parts.json"):
    parts.check_parts(tmp_path)
  _pack(built, tmp_path / "parts")
  assert unpack.main(["--parts", str(tmp_path / "parts"), "--check-only"]) == 0


def test_pack_cli(tmp_path, built, capsys):
  assert pack.main(["--out", str(tmp_path / "p"), "--tokenizer", "bpe300", "--cache", str(built),
                    "--eval-tasks", "", "--no-wheels", "--jobs", "1"]) == 0
  assert "parts" in capsys.readouterr().out
  assert parts.check_parts(tmp_path / "p")["missing"] == []


def test_transfer_folders_hold_every_part_once_and_unpack_in_place(tmp_path, built, capsys):
  """--transfer-mib sorts the parts into transfer-N folders under the cap (parts.json in the
  first); copied side by side they unpack as they are; a transfer not yet arrived is named."""
  cap = 9000  # parts.json is about 6.6 kB here, the 13 parts 13 kB together
  assert pack.main(["--out", str(tmp_path / "p"), "--tokenizer", "bpe300", "--cache", str(built),
                    "--eval-tasks", "", "--no-wheels", "--jobs", "1", "--part-mib", str(1500 / 2**20),
                    "--transfer-mib", str(cap / 2**20)]) == 0
  assert "transfer-1" in capsys.readouterr().out
  folders = sorted((tmp_path / "p").iterdir())
  assert len(folders) > 2 and all(f.name.startswith("transfer-") and f.is_dir() for f in folders)
  assert all(sum(x.stat().st_size for x in f.iterdir()) <= cap for f in folders)
  manifest = parts.read_parts_manifest(tmp_path / "p")
  placed = sorted(x.name for f in folders for x in f.iterdir() if x.name != parts.PARTS_MANIFEST)
  assert placed == sorted(manifest["parts"])  # every part exactly once
  assert (folders[0] / parts.PARTS_MANIFEST).is_file()
  last = folders[-1]
  held = tmp_path / "held"
  last.rename(held)  # the last transfer has not arrived
  assert unpack.main(["--parts", str(tmp_path / "p"), "--dest", str(tmp_path / "b")]) == 2
  err = capsys.readouterr().err
  assert all(x.name in err for x in held.iterdir())
  assert not (tmp_path / "b").exists()
  held.rename(last)
  assert unpack.main(["--parts", str(tmp_path / "p"), "--dest", str(tmp_path / "b"), "--jobs", "1"]) == 0
  bundle.verify_bundle(tmp_path / "b")
  with pytest.raises(ValueError, match="smaller --part-mib"):
    parts.group_for_transfers(folders[0], 100)


@pytest.mark.parametrize("n", [0, 2, 10, 4096])
def test_shuffle2_inverts(n):
  data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
  assert parts.unshuffle2(parts.shuffle2(data)) == data


def test_unpack_runs_without_grain_or_lxml():
  # The GPU machine gets grain from the wheels inside the parts, so unpack must
  # import (and run its --help) before they are installed.
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel

  code = ("import sys\nfor m in ('grain', 'lxml', 'rdata', 'zstandard'): sys.modules[m] = None\n"
          "import runpy\nsys.argv = ['unpack', '--help']\n"
          "runpy.run_module('tetrajet_jax.data.unpack', run_name='__main__')\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stderr
  assert "--check-only" in proc.stdout
