"""The kernel benchmark's result sink: a run cut off by a time limit keeps its rows."""

from __future__ import annotations

import json

from pallas_kernels.bench import Rows


def test_rows_are_printed_and_saved_as_they_come(tmp_path, capsys):
  out = str(tmp_path / "bench.json")
  rows = Rows({"commit": "abc"}, out)
  rows.append(dict(kind="quant", name="xla quantize_nvfp4 bfloat16", shape=(8, 128), ms=1.0, gbps=2.0,
                   vs_copy=0.5, vs_xla=1.0, ok=True))
  saved = json.loads(open(out).read())
  assert saved["commit"] == "abc" and len(saved["rows"]) == 1
  assert "vs_copy=0.50" in capsys.readouterr().out
  rows.append(dict(kind="gemm", name="pallas nvfp4 t128x64_s2", shape=(8, 8, 8), ok=False, error="ValueError: smem"))
  saved = json.loads(open(out).read())
  assert [r["ok"] for r in saved["rows"]] == [True, False]
  assert "FAILED/SKIPPED ValueError: smem" in capsys.readouterr().out


def test_markdown_tables_render_saved_results():
  from pallas_kernels.bench import markdown_tables

  res = {"commit": "abc1234", "device": "NVIDIA H200", "jax": "0.11.2", "date": "d", "rows": [
      {"kind": "quant", "name": "xla quantize_nvfp4 bfloat16", "shape": [64, 128], "ms": 0.5, "gbps": 300.0,
       "vs_copy": 0.125, "vs_xla": 1.0, "copy_gbps": 2400.0, "ok": True},
      {"kind": "gemm_check", "name": "pallas gemm t", "ok": True, "rel_err": 4.1e-7},
      {"kind": "gemm", "name": "pallas gemm t", "shape": [8, 8, 8], "ok": False, "error": "ValueError: smem"},
      {"kind": "linear", "name": "linear fwd+bwd bf16", "shape": [1, 2, 3], "ms": 1.25, "vs_bf16": 1.0, "ok": True}]}
  text = markdown_tables([res])
  assert "quant (commit abc1234, NVIDIA H200" in text
  assert "| xla quantize_nvfp4 bfloat16 | 64x128 | 0.500 | 300 | 0.12 | 1.00 |" in text
  assert "64x128 bfloat16: 2400 GB/s" in text
  assert "| pallas gemm t | 8x8x8 | - | - | failed: ValueError: smem |" in text
  assert "pallas gemm t: 4.1e-07" in text
  assert "| linear fwd+bwd bf16 | 1x2x3 | 1.250 | 1.00 |" in text
