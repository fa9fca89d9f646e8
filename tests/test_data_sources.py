"""Markup parsers, dedup, mixture table, caps, weights and the stats file."""

from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest

from tetrajet_jax.data import build as build_lib
from tetrajet_jax.data import corpus, dedup, mixture, sources, stats, textparse, tokenized

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64(n: int) -> str:
  out = ""
  while True:
    out = _B64[n % 64] + out
    n //= 64
    if n == 0:
      return out


def test_html_to_text_keeps_content_drops_chrome():
  html = b"""<html><head><title>T</title><style>p{}</style></head><body>
  <div class="sphinxsidebar">Navigation junk</div>
  <div role="main"><h1>Title</h1><p>First   paragraph
  spans lines.</p><script>var x=1;</script><pre>def f():
      return 1</pre><ul><li>one</li><li>two</li></ul></div></body></html>"""
  text = textparse.html_to_text(html)
  assert "junk" not in text and "var x" not in text and "p{}" not in text
  assert "Title\n\nFirst paragraph spans lines." in text
  assert "def f():\n      return 1" in text  # <pre> keeps its indentation
  assert "one\ntwo" in text
  assert textparse.html_to_text(b"  ") == ""


def test_dictd_reader_follows_the_index(tmp_path):
  entries = [("apple", "apple\n   a fruit; see {pear}\n"), ("pear", "pear\n   another fruit\n")]
  blob, index = b"", []
  for head, body in [("00-database-short", "header\n"), *entries]:
    data = body.encode()
    index.append(f"{head}\t{_b64(len(blob))}\t{_b64(len(data))}")
    blob += data
  index.append(f"apples\t{_b64(len(b'header\n'))}\t{_b64(len(entries[0][1]))}")  # alias, read once
  (tmp_path / "x.index").write_text("\n".join(index) + "\n")
  (tmp_path / "x.dict.dz").write_bytes(gzip.compress(blob))
  got = textparse.read_dictd(tmp_path / "x.index", tmp_path / "x.dict.dz")
  assert got == entries
  assert textparse.dictd_number("BA") == 64 and textparse.dictd_number("A") == 0
  docs = textparse.dictd_documents(got, target_bytes=10)
  assert [d for d, _ in docs] == ["00000-apple", "00001-pear"]
  assert docs[0][1] == "apple\n   a fruit; see pear"


@pytest.mark.skipif(shutil.which("pod2text") is None, reason="perl's pod2text not installed")
def test_pod_to_text():
  text = textparse.pod_to_text(b"=head1 NAME\n\nfoo - does B<bold> things\n\n=cut\n")
  assert "NAME" in text and "foo - does bold things" in text and "B<" not in text


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff not installed")
def test_man_to_text():
  text = textparse.man_to_text(b".TH FOO 1\n.SH NAME\nfoo \\- does \\fBthings\\fR\n")
  assert "NAME" in text and "foo - does things" in text.replace("\u2010", "-")
  assert "\x1b" not in text and "\b" not in text


def test_dedup_exact_near_and_distinct():
  rng = np.random.default_rng(7)
  vocab = [f"w{i}" for i in range(500)]
  base = " ".join(rng.choice(vocab, 400))
  near = base.replace(base.split()[200], "CHANGED", 1)
  other = " ".join(rng.choice(vocab, 400))
  d = dedup.Deduplicator()
  assert d.check(base) is None
  assert d.check(base.replace(" ", "  \n")) == "exact"  # whitespace-only change
  assert d.check(near) == "near"
  assert d.check(other) is None
  assert d.check("") is None and d.check("   ") == "exact"


def test_select_documents_caps_in_hash_order_and_drops_dups():
  docs = [(f"d{i:03d}", f"text of document {i:03d} " * 20) for i in range(100)]
  docs.append(("dup", docs[5][1]))
  docs.sort()
  kept, info = corpus.select_documents("s", docs, cap_bytes=None, seed=0)
  assert len(kept) == 100 and info["dropped_exact"] == 1
  size = len(docs[0][1].encode())
  capped, info = corpus.select_documents("s", docs, cap_bytes=30 * size, seed=0)
  assert len(capped) == 30 and info["dropped_cap"] > 0 and capped == sorted(capped)
  again, _ = corpus.select_documents("s", docs, cap_bytes=30 * size, seed=0)
  assert again == capped
  assert capped != [d for d in sorted(kept)][:30]  # a spread sample, not the first ids


def test_mixture_table_covers_every_source():
  assert set(mixture.MIXTURE) == set(sources.SOURCES)
  assert set(mixture.DEMO_SOURCES) <= set(sources.SOURCES)
  assert {e.group for e in mixture.MIXTURE.values()} == set(mixture.GROUPS)
  assert all(e.licence for e in mixture.MIXTURE.values())
  with pytest.raises(ValueError, match="group"):
    mixture.MixtureEntry(group="poetry")
  with pytest.raises(ValueError, match="weight"):
    mixture.MixtureEntry(group="code", weight=-1)


def test_copies_follow_weight():
  assert tokenized.copies(1.0, "s", "d", 0) == 1 and tokenized.copies(3.0, "s", "d", 0) == 3
  half = [tokenized.copies(0.5, "s", f"d{i}", 0) for i in range(2000)]
  assert set(half) == {0, 1} and 0.45 < np.mean(half) < 0.55


def test_weights_groups_and_stats_file(tmp_path, monkeypatch):
  for name, word in (("pa", "river"), ("cb", "return")):
    folder = tmp_path / name
    folder.mkdir()
    for i in range(20):
      (folder / f"{i:02d}.txt").write_text(f"{word} {i} " + " ".join([word] * (30 + i)))
  monkeypatch.setattr(sources, "SOURCES", {**sources.SOURCES, **{
      n: sources.directory_source(n, tmp_path / n) for n in ("pa", "cb")}})
  monkeypatch.setattr(mixture, "MIXTURE", {**mixture.MIXTURE,
                                           "pa": mixture.MixtureEntry(group="prose", weight=2.0),
                                           "cb": mixture.MixtureEntry(group="code")})
  cfg = build_lib.BuildConfig(corpus=corpus.CorpusConfig(sources=("pa", "cb"),
                              cache_dir=tmp_path / "cache", val_fraction=0.2),
                              vocab_size=280, eval_tasks=())
  result = build_lib.build(cfg)
  tm = result["tokenized"]
  assert tm["val_groups"] == {"code": "val_code", "prose": "val_prose"}
  cm = result["corpus"]["sources"]
  assert tm["splits"]["train"]["sources"]["pa"]["docs"] == 2 * cm["pa"]["train_docs"]
  assert tm["splits"]["train"]["sources"]["cb"]["docs"] == cm["cb"]["train_docs"]
  val = tm["splits"]["val"]
  assert val["tokens"] + 1 == tm["splits"]["val_prose"]["tokens"] + tm["splits"]["val_code"]["tokens"]
  s = stats.collect_stats(result, wall_seconds=result["wall_seconds"], cache_dir=tmp_path / "cache")
  assert s["groups"]["prose"]["train_tokens"] == tm["splits"]["train"]["sources"]["pa"]["tokens"]
  doc = tmp_path / "DATA.md"
  doc.write_text(f"intro\n{stats.START}\nold\n{stats.END}\nafter\n")
  stats.update_markdown(doc, s)
  text = doc.read_text()
  assert "old" not in text and "| pa | prose |" in text and text.endswith(f"{stats.END}\nafter\n")
  with pytest.raises(ValueError, match="markers"):
    stats.update_markdown(_no_markers(tmp_path), s)


def _no_markers(tmp_path):
  path = tmp_path / "plain.md"
  path.write_text("no block here\n")
  return path
