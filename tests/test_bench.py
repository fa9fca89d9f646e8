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
