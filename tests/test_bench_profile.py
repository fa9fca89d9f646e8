"""The step profiler (python -m experiments.bench profile): attributing HLO instructions to parts of
the step, the busy-time union, and its refusal of a trace without a GPU plane."""

from __future__ import annotations

import glob
import json
import os

import jax
import jax.numpy as jnp
import optax
import pytest

from experiments.bench import performance_doc, step_profile
from tetrajet_jax.numerics import dequantize_nvfp4, quantize_nvfp4
from tetrajet_jax.optim import osci_reset


def test_hlo_sources_attributes_quantizer_and_osci_reset_ops():
  """XLA's optimized module of a step that quantizes a weight in the model and runs OsciReset:
  fusions from numerics/ are the XLA quantizer, those under OsciReset's scope are OsciReset's,
  even though both call the same quantizer."""
  tx = optax.chain(optax.sgd(1.0), osci_reset(start_step=0, period=4, window=2))
  params = {"blk": {"kernel": jnp.ones((128, 16), jnp.float32)}}
  state = tx.init(params)

  def step(params, state):
    w = dequantize_nvfp4(quantize_nvfp4(params["blk"]["kernel"], axis=0))
    grads = jax.grad(lambda p: jnp.sum(jnp.tanh(p["blk"]["kernel"] * w)))(params)
    return tx.update(grads, state, params)

  text = jax.jit(step).lower(params, state).compile().as_text()
  sources = step_profile.hlo_sources(text)
  parts = {v["part"] for v in sources.values()}
  assert "XLA numerics (quantize, decode)" in parts
  assert "OsciReset / oscillation monitor" in parts
  quantizer = [v for v in sources.values() if v["part"] == "XLA numerics (quantize, decode)"]
  assert all(v["source"].startswith("tetrajet_jax/numerics/") for v in quantizer)
  assert all(":" in v["source"] and v["source"].rsplit(":", 1)[1].isdigit() for v in quantizer)
  assert all(v["shape"] for v in quantizer if v["kind"] == "fusion")  # e.g. "f32[128,16]{1,0}"


def test_busy_time_is_the_union_of_intervals():
  assert step_profile._busy_ns([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25
  assert step_profile._busy_ns([]) == 0


def test_kernel_times_needs_a_gpu_plane(tmp_path):
  f = jax.jit(lambda a: jnp.tanh(a).sum())
  x = jnp.ones((64, 64))
  f(x).block_until_ready()
  with jax.profiler.trace(str(tmp_path)):
    f(x).block_until_ready()
  [xspace] = glob.glob(os.path.join(tmp_path, "**", "*.xplane.pb"), recursive=True)
  trace = jax.profiler.ProfileData.from_file(xspace)
  if jax.default_backend() == "gpu":
    by_op, busy, lines = step_profile.kernel_times(trace)
    assert by_op and busy > 0 and any(n.startswith("Stream") for n in lines)
  else:
    with pytest.raises(RuntimeError, match="no GPU plane"):
      step_profile.kernel_times(trace)


def test_bad_arguments_are_refused_before_any_work():
  with pytest.raises(SystemExit):
    step_profile.parse_args(["--steps", "0"])
  with pytest.raises(SystemExit):
    step_profile.parse_args(["--arm", "fp3"])


def test_performance_doc_renders_a_profile(tmp_path):
  result = dict(kind="profile", commit="abc1234", date="2026-12-04", model="20m", arm="tetrajet_v2", backend="auto",
                scan_blocks=True, oscillation_monitor=True, steps=5, step_ms=60.0, profiled_wall_ms_per_step=61.0,
                kernel_ms_per_step=50.0, busy_ms_per_step=49.0,
                parts={"backward quantizer (Pallas)": 20.0, "GEMM (cuBLAS)": 5.0},
                ops=[dict(op="mpmd_map.1", kind="custom-call", target="mosaic_gpu_v2", shape="u8[8,8]{1,0}",
                          source="tetrajet_jax/linear/layer.py:1", part="backward quantizer (Pallas)", ms_per_step=4.0)])
  (tmp_path / "p.json").write_text(json.dumps(result))
  text = performance_doc.render(["p.json"], root=tmp_path)
  assert "commit abc1234, 2026-12-04" in text
  assert "| backward quantizer (Pallas) | 20.00 | 40% |" in text  # share of the summed kernel time
  assert "| mpmd_map.1 | mosaic_gpu_v2 | `u8[8,8]{1,0}` | 4.000 | backward quantizer (Pallas) |" in text
  assert "(backend auto, oscillation monitor on): step 60.0 ms" in text  # a file without the kernels' settings
  result["variants"] = {"gemm_tiling": "wide", "quantizer_kernels": "triton"}
  assert "(backend auto, oscillation monitor on, wide GEMM tiles, triton quantizers): step 60.0 ms" in \
      step_profile.table(result)


def test_attribution_reads_the_module_that_ran():
  """Two compiled steps share instruction names; the one naming most of the traced time is used."""
  info = lambda part: dict(kind="fusion", target="", shape="f32[8]{0}", source="x.py:1", part=part)
  modules = {"calibrating": {"fusion.1": info("model"), "fusion.2": info("optimizer")},
             "frozen": {"fusion.1": info("RTN quantizer (Pallas)"), "fusion.2": info("model"),
                        "fusion.3": info("model")}}
  by_op = {"fusion.1": 6e6, "fusion.2": 2e6, "fusion.3": 4e6, "MemcpyD2H": 1e6}  # ns over 2 steps
  ran, parts, ops = step_profile.attribute(by_op, modules, steps=2)
  assert ran == "frozen"
  assert parts == {"RTN quantizer (Pallas)": 3.0, "model": 3.0, "unattributed (not in the step's HLO)": 0.5}
  assert [o["op"] for o in ops] == ["fusion.1", "fusion.3", "fusion.2", "MemcpyD2H"]
  assert step_profile.attribute({}, {}, steps=1) == (None, {}, [])


def test_attribution_reads_both_halves_of_a_split_update():
  """A split update runs two functions a step; each one's module that ran is read, and a name both
  hold goes to the function naming more traced time."""
  info = lambda part: dict(kind="fusion", target="", shape="f32[8]{0}", source="x.py:1", part=part)
  modules = {"m1.jit_update_step.txt": {"fusion.1": info("model"), "fusion.2": info("model")},
             "m2.jit_oscillation_step.txt": {"fusion.2": info("OsciReset"), "fusion.9": info("OsciReset")}}
  by_op = {"fusion.1": 6e6, "fusion.2": 2e6, "fusion.9": 2e6}
  ran, parts, _ = step_profile.attribute(by_op, modules, steps=2)
  assert ran == "m1.jit_update_step.txt, m2.jit_oscillation_step.txt"
  assert parts == {"model": 4.0, "OsciReset": 1.0}

