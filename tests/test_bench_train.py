"""The train-step bench (python -m experiments.bench train) and the rendered docs/PERFORMANCE.md."""

from __future__ import annotations

import json
import os

import pytest

from experiments.bench import lowering, performance_doc, train_steps


def _row(arm, tok, comp, **kw):
  return dict(kind="train", model="20m", arm=arm, phases=["fp4"], compile_s=comp, warmup_s=1.0, tokens_per_s=tok,
              model_tflops_per_s=tok * 1e-4, step_ms=1.0, peak_gib=None, loss=5.0, **kw)


def test_ratios_are_to_the_same_models_bf16_row():
  rows = train_steps.with_ratios([_row("bf16", 1000.0, 5.0),
                                  _row("tetrajet_v2", 250.0, 20.0, compile_stages=dict(lower_s=12.5)),
                                  dict(kind="train", model="20m", arm="nvidia_nvfp4", error="rc 1: boom")])
  assert rows[0]["vs_bf16_tokens_per_s"] == 1.0 and rows[0]["vs_bf16_compile"] == 1.0
  assert rows[1]["vs_bf16_tokens_per_s"] == 0.25 and rows[1]["vs_bf16_compile"] == 4.0
  assert "vs_bf16_tokens_per_s" not in rows[2]
  text = train_steps.table(dict(rows=rows))
  assert "| 20m | tetrajet_v2 | 250 | 0.25x | 0.0 | 20.0 | 4.0x | 12.5 | - |" in text
  assert "| 20m | bf16 | 1,000 | 1.00x | 0.1 | 5.0 | 1.0x | - | - |" in text  # a row without the breakdown
  assert "| 20m | nvidia_nvfp4 | failed: rc 1: boom |" in text


@pytest.mark.parametrize("argv,message", [
    (["--arms", "bf16,nope"], "unknown"),
    (["--models", "tiny", "--warmup", "1"], "--warmup"),
    (["--models", "tiny", "--arms", "tetrajet_v2", "--batch-size", "1", "--seq-len", "100"], "multiple of 128"),
])
def test_bad_arguments_stop_before_any_arm_runs(argv, message, capsys, monkeypatch):
  ran = []
  monkeypatch.setattr(train_steps, "run_arm", ran.append)
  with pytest.raises(SystemExit):
    train_steps.main(argv)
  assert message in capsys.readouterr().err and not ran


def test_the_oscillation_monitor_can_be_left_out_of_the_step():
  _, specs = train_steps.parse_args(["--models", "tiny", "--arms", "tetrajet_v2"])
  assert all(s["monitor_oscillation"] for s in specs)
  _, specs = train_steps.parse_args(["--models", "tiny", "--arms", "tetrajet_v2", "--no-oscillation-monitor"])
  assert [s["arm"] for s in specs] == ["bf16", "tetrajet_v2"]
  assert not any(train_steps.bench_config(s).monitor_oscillation for s in specs)


def test_a_tiny_bf16_step_is_measured_in_its_own_process(tmp_path):
  out = tmp_path / "train.json"
  result = train_steps.main(["--models", "tiny", "--arms", "bf16", "--layers", "1", "--batch-size", "2",
                             "--seq-len", "32", "--vocab", "64", "--steps", "2", "--warmup", "2", "--out", str(out)])
  (row,) = result["rows"]
  assert "error" not in row, row
  assert row["tokens_per_s"] > 0 and row["compile_s"] > 0 and row["phases"] == ["fp4"]
  stages = row["compile_stages"]
  assert 0 < stages["lower_s"] < row["compile_s"] and stages["backend_compile_s"] > 0, stages
  assert row["vs_bf16_tokens_per_s"] == 1.0 and row["device"] == result["device"]
  assert json.loads(out.read_text()) == result


def test_a_failing_worker_becomes_an_error_row():
  spec = dict(model="no-such-model", arm="bf16", backend="xla", scan_blocks=None, layers=None, batch_size=2,
              seq_len=32, vocab=64, steps=2, warmup=2)
  row = train_steps.run_arm(spec)
  assert row["arm"] == "bf16" and row["error"].startswith("rc 1") and "no-such-model" in row["error"]


def test_performance_doc_is_rendered_from_its_recorded_sources():
  doc = performance_doc.DEFAULT_OUT.read_text(encoding="utf-8")
  sources = performance_doc.recorded_sources(doc)
  assert sources, "the document names no sources"
  assert performance_doc.render(sources) == doc, "docs/PERFORMANCE.md is stale: re-run `python -m experiments.bench doc`"


def test_performance_doc_renders_a_train_result(tmp_path):
  result = dict(device="gpu:H", commit="abc1234", date="2026-12-03", rows=train_steps.with_ratios(
      [_row("bf16", 1000.0, 5.0), _row("tetrajet_v2", 500.0, 10.0)]),
      settings=dict(backend="xla", scan_blocks="off", batch_size=32, seq_len=1024, steps=20, warmup=3))
  (tmp_path / "t.json").write_text(json.dumps(result))
  text = performance_doc.render(["t.json"], root=tmp_path)
  assert performance_doc.recorded_sources(text) == ["t.json"]
  assert "commit abc1234, gpu:H" in text and "| 20m | tetrajet_v2 | 500 | 0.50x |" in text
  with pytest.raises(ValueError, match="names no sources"):
    performance_doc.recorded_sources("# hand-written\n")


def test_lowering_section_times_each_named_kernel(tmp_path):
  """The lowering bench lowers for CUDA on this CPU: here the XLA reference row
  (the kernels' own lowering for Hopper is checked by the *_lowers_for_hopper tests)."""
  out = tmp_path / "lowering.json"
  result = lowering.main(["--kernels", "xla_quantizer", "--out", str(out)])
  assert json.loads(out.read_text()) == result
  (row,) = result["rows"]
  assert row["kernel"] == "xla_quantizer" and row["lower_s"] > 0 and row["text_chars"] > 0


def test_lowering_section_refuses_unknown_kernels(capsys):
  with pytest.raises(SystemExit) as e:
    lowering.main(["--kernels", "rtn_fp8"])
  assert e.value.code == 2 and "unknown ['rtn_fp8']" in capsys.readouterr().err


def test_lowering_section_lowers_whole_steps_with_their_kernels(monkeypatch):
  """--steps lowers an arm's update for CUDA with the kernels' dispatch told it is on a Hopper GPU:
  the FP4 arm's functions (both halves of its split update) call Mosaic modules (here all its
  kernels: TETRAJET_QUANTIZER_KERNELS=mosaic), bf16's call none, and the pretence ends with the
  section (this host's dispatch is back to XLA)."""
  import jax

  from tetrajet_jax.kernels import _platform, hopper_available

  monkeypatch.setattr(_platform, "QUANTIZER_KERNELS", "mosaic")
  result = lowering.main(["--kernels", "", "--steps", "tiny/tetrajet_v2,tiny/bf16", "--layers", "1"])
  fp4, bf16 = result["rows"]
  assert fp4["step"] == "tiny/tetrajet_v2" and fp4["lower_s"] > 0
  assert 0 < fp4["mosaic_modules"] <= fp4["mosaic_calls"]
  assert bf16["mosaic_calls"] == 0
  # The update's first half, and its second half in each of the three window phases the run meets;
  # the first half (the train step) lowered first, and when each ended.
  assert fp4["phases"] == ["fp4"] and fp4["functions"] == 4
  assert [kind for kind, _ in fp4["lowered_at_s"]][0] == "train" and len(fp4["lowered_at_s"]) == 4
  assert 0 < fp4["train_steps_lowered_s"] == fp4["lowered_at_s"][0][1] < fp4["lowered_at_s"][-1][1] <= fp4["lower_s"]
  assert (f"| tiny/tetrajet_v2 | mosaic | on | 4 | {fp4['lower_s']:.1f} | {fp4['mosaic_modules']} "
          f"| {fp4['mosaic_calls']} | 0 |") in lowering.table(result)
  if jax.default_backend() == "cpu":
    assert not hopper_available()


def test_lowering_section_counts_triton_kernels(monkeypatch):
  """Under the Triton quantizers (TETRAJET_QUANTIZER_KERNELS=triton, the default; here the module
  setting) an FP4 step's block-scaled quantizers lower to Triton calls: fewer Mosaic modules (the
  GEMMs remain) than under mosaic, and the row says which kernels ran."""
  from tetrajet_jax.kernels import _platform

  if _platform.QUANTIZER_KERNELS_ENV not in os.environ:
    assert _platform.QUANTIZER_KERNELS == "triton"  # the default
  monkeypatch.setattr(_platform, "QUANTIZER_KERNELS", "mosaic")
  mosaic = lowering.main(["--kernels", "", "--steps", "tiny/tetrajet_v2", "--layers", "1"])["rows"][0]
  monkeypatch.setattr(_platform, "QUANTIZER_KERNELS", "triton")
  triton = lowering.main(["--kernels", "", "--steps", "tiny/tetrajet_v2", "--layers", "1"])["rows"][0]
  assert (mosaic["quantizer_kernels"], triton["quantizer_kernels"]) == ("mosaic", "triton")
  assert mosaic["triton_calls"] == 0 < triton["triton_calls"]
  assert 0 < triton["mosaic_modules"] < mosaic["mosaic_modules"]


def test_traced_compile_names_each_function_and_the_compilers_events():
  """--trace-compile's summary on this backend: every function's compile time, and the host events
  of its compile summed by name (XLA's own compile among them, never longer than the wall time of
  the compiles it sits in), costliest first."""
  import jax
  import jax.numpy as jnp

  spec = jax.ShapeDtypeStruct((64, 64), jnp.float32)
  lowered = {("a",): jax.jit(lambda x: jnp.sin(x) @ x.T).trace(spec).lower(),
             ("b",): jax.jit(lambda x: jnp.cos(x) + 1).trace(spec).lower()}
  seconds, events = lowering.traced_compile(lowered)
  assert list(seconds) == ["('a',)", "('b',)"] and all(s > 0 for s in seconds.values())
  by_name = {e["name"]: e for e in events}
  compile_event = by_name["backend_compile_and_load"]
  assert compile_event["count"] == 2 and 0 < compile_event["seconds"] <= sum(seconds.values())
  assert [e["seconds"] for e in events] == sorted((e["seconds"] for e in events), reverse=True)


def test_lowering_section_refuses_unknown_steps(capsys):
  with pytest.raises(SystemExit) as e:
    lowering.main(["--kernels", "", "--steps", "20m/fp8"])
  assert e.value.code == 2 and "['20m/fp8'] are not MODEL/ARM" in capsys.readouterr().err


def test_quantizer_semantics_runs_each_quantized_arm_per_semantics(capsys):
  _, specs = train_steps.parse_args(["--models", "tiny", "--arms", "tetrajet_v2", "--quantizer-semantics",
                                     "warpgroup,lane"])
  assert [(s["arm"], s["quantizer_semantics"]) for s in specs] == [
      ("bf16", None), ("tetrajet_v2", "warpgroup"), ("tetrajet_v2", "lane")]
  with pytest.raises(SystemExit) as e:
    train_steps.parse_args(["--models", "tiny", "--quantizer-semantics", "thread"])
  assert e.value.code == 2 and "unknown ['thread']" in capsys.readouterr().err
  _, specs = train_steps.parse_args(["--models", "tiny", "--arms", "tetrajet_v2", "--lowering-cache", "on,off"])
  assert [(s["arm"], s["lowering_cache"]) for s in specs] == [("bf16", None), ("tetrajet_v2", "on"), ("tetrajet_v2", "off")]
  with pytest.raises(SystemExit) as e:
    train_steps.parse_args(["--models", "tiny", "--lowering-cache", "maybe"])
  assert e.value.code == 2 and "--lowering-cache: unknown ['maybe']; known: on, off" in capsys.readouterr().err
  _, specs = train_steps.parse_args(["--models", "tiny", "--arms", "tetrajet_v2", "--quantizer-kernels", "mosaic,triton",
                                     "--lowering-cache", "on,off"])
  assert [(s["arm"], s["quantizer_kernels"], s["lowering_cache"]) for s in specs] == [
      ("bf16", None, None), ("tetrajet_v2", "mosaic", "on"), ("tetrajet_v2", "triton", "on"),
      ("tetrajet_v2", "mosaic", "off"), ("tetrajet_v2", "triton", "off")]


def test_the_chosen_semantics_reaches_the_worker():
  """The worker checks that its kernels lower with the semantics, the lowering cache and the
  quantizer kernels asked for (set through the environment before it imports them), and the table
  labels the row with all three."""
  spec = dict(model="tiny", arm="bf16", backend="xla", scan_blocks=None, layers=1, batch_size=2, seq_len=64,
              vocab=64, steps=2, warmup=2, quantizer_semantics="lane", lowering_cache="off", quantizer_kernels="triton")
  row = train_steps.run_arm(spec)
  assert "error" not in row, row
  assert (row["quantizer_semantics"], row["lowering_cache"], row["quantizer_kernels"]) == ("lane", "off", "triton")
  assert ("| tiny | bf16 (lane semantics) (lowering cache off) (triton quantizers) |"
          in train_steps.table(dict(rows=train_steps.with_ratios([row]))))
