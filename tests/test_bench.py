"""The benchmarks (experiments.bench): result rows, checks before timing, waves, and the CLI checks."""

from __future__ import annotations

import io
import itertools
import json
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.bench import gemms, jobs, kernels, layer_parts, quantizers
from experiments.bench.jobs import Rows
from tetrajet_jax.linear.gemm import KERNELS, interpret_kernels

_MODULES = (jobs, quantizers, gemms, layer_parts, kernels)


class _Bench:
  """The bench's names across its modules; tests read them and patch them here."""

  def __getattr__(self, name):
    for m in _MODULES:
      if name in vars(m):
        return vars(m)[name]
    raise AttributeError(name)

  def patch(self, monkeypatch, name, value):
    """Replaces `name` in every bench module that uses it."""
    hit = [m for m in _MODULES if name in vars(m)]
    assert hit, name
    for m in hit:
      monkeypatch.setattr(m, name, value)


bench = _Bench()


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
  markdown_tables = bench.markdown_tables

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


# Attribution rows (issue: "where the time goes, variant timings"): the
# timing-only kernel variants run in the CPU interpreter and lower for Hopper.

def _input(rng, shape=(64, 256)):
  x = rng.standard_normal(shape) * np.exp(2.0 * rng.standard_normal(shape))
  x[0, :128] = 0.0
  return jnp.asarray(x.astype(np.float32)).astype(jnp.bfloat16)


def _same_layout(t, r):
  """Same canonical arrays (shapes, dtypes) as the real kernel's tensor r."""
  return [(a.shape, a.dtype) for a in (t.codes, t.scale_inner, t.scale_outer)] == [
      (a.shape, a.dtype) for a in (r.codes, r.scale_inner, r.scale_outer)]


def test_rtn_attribution_variants_interpret(rng):
  from tetrajet_jax.kernels import quantize_nvfp4_rtn, quantize_nvfp4_rtn_reference
  code_agreement = bench.code_agreement

  x = _input(rng)
  ref = quantize_nvfp4_rtn_reference(x)
  t = quantize_nvfp4_rtn(x, interpret=True, _division="hardware")
  assert code_agreement(t.codes, ref.codes) >= 0.99
  np.testing.assert_array_equal(np.asarray(t.scale_outer), np.asarray(ref.scale_outer))  # scales stay exact
  np.testing.assert_array_equal(np.asarray(t.scale_inner, np.float32), np.asarray(ref.scale_inner, np.float32))
  for dtype in (jnp.bfloat16, jnp.float32):  # "pairs" and "xla" packing
    t, qs = quantize_nvfp4_rtn(x.astype(dtype), interpret=True, emit_operand=True, _math="none")
    assert _same_layout(t, ref) and t.shape == x.shape and (qs.shape, qs.dtype) == (x.shape, jnp.bfloat16)
  with pytest.raises(ValueError, match="_division"):
    quantize_nvfp4_rtn(x, interpret=True, _division="fast")


def test_rht_sr_attribution_variants_interpret(rng, key):
  from tetrajet_jax.kernels import quantize_nvfp4_backward
  code_agreement = bench.code_agreement
  from tetrajet_jax.numerics import hadamard_signs

  x, signs, seed = _input(rng), hadamard_signs(key), jnp.uint32(5)
  ref = quantize_nvfp4_backward(x, signs, seed, interpret=True)
  t = quantize_nvfp4_backward(x, signs, seed, interpret=True, _division="hardware")
  assert code_agreement(t.codes, ref.codes) >= 0.99
  np.testing.assert_array_equal(np.asarray(t.scale_outer), np.asarray(ref.scale_outer))
  for axis in (-1, 0):
    t, qs = quantize_nvfp4_backward(x if axis == -1 else x.T, signs, seed, axis=axis, emit_operand=True,
                                  interpret=True, _math="none")
    assert _same_layout(t, ref) and t.axis == axis % 2 and (qs.shape, qs.dtype) == (x.shape, jnp.bfloat16)
    assert t.shape == (x.shape if axis == -1 else x.T.shape)


@pytest.mark.parametrize("knobs", [dict(_division="hardware"), dict(_math="none")])
def test_attribution_variants_lower_for_hopper(knobs):
  from tetrajet_jax.kernels import quantize_nvfp4_backward, quantize_nvfp4_rtn

  spec = jax.ShapeDtypeStruct((256, 512), jnp.bfloat16)
  jax.jit(lambda v: quantize_nvfp4_rtn(v, **knobs)).trace(spec).lower(lowering_platforms=("cuda",))
  signs = jnp.ones((16,), jnp.float32)
  jax.jit(lambda v: quantize_nvfp4_backward(v, signs, jnp.uint32(1), **knobs)).trace(spec).lower(
      lowering_platforms=("cuda",))


@pytest.fixture
def interpreted_kernels(monkeypatch):
  """The bench's kernels in the CPU interpreter, and a stub timer: these tests
  check the rows, checks and ordering, not the interpreter's speed."""
  import functools


  bench.patch(monkeypatch, "quantize_nvfp4_rtn", functools.partial(bench.quantize_nvfp4_rtn, interpret=True))
  bench.patch(monkeypatch, "quantize_nvfp4_backward", functools.partial(bench.quantize_nvfp4_backward, interpret=True))
  bench.patch(monkeypatch, "quantize_nvfp4_rtn_triton",
              functools.partial(bench.quantize_nvfp4_rtn_triton, interpret=True))
  bench.patch(monkeypatch, "quantize_nvfp4_backward_triton",
              functools.partial(bench.quantize_nvfp4_backward_triton, interpret=True))
  bench.patch(monkeypatch, "requantize_nvfp4_backward_triton",
              functools.partial(bench.requantize_nvfp4_backward_triton, interpret=True))
  bench.patch(monkeypatch, "nvfp4_gemm", functools.partial(bench.nvfp4_gemm, interpret=True))
  bench.patch(monkeypatch, "block_scaled_bf16_gemm", functools.partial(bench.block_scaled_bf16_gemm, interpret=True))
  bench.patch(monkeypatch, "time_fn", lambda f, *a, **kw: 1e-3)
  return bench


def test_quantizer_jobs_check_then_time_every_variant(interpreted_kernels):
  bench = interpreted_kernels
  rows, log = [], io.StringIO()
  bench.run_jobs(rows, log, bench.quantizer_jobs([(64, 256)]))
  assert [r["name"] for r in rows] == [
      "xla quantize_nvfp4 bfloat16", "pallas rtn bfloat16 rows64_s2", "pallas rtn bfloat16 rows64_s2 +operand",
      "pallas rtn bfloat16 rows64_s2 lane semantics",
      *(f"triton rtn bfloat16 rows{r}_w{w}" for r, w in bench.TRITON_TILINGS),
      "pallas rtn bfloat16 rows64_s2 division=hardware (timing only, inexact)",
      "pallas rtn bfloat16 rows64_s2 load+store only (ceiling)",
      "xla quantize_nvfp4 float32", "pallas rtn float32 rows64_s2", "pallas rtn float32 rows64_s2 +operand",
      "pallas rtn float32 rows64_s2 lane semantics",
      *(f"triton rtn float32 rows{r}_w{w}" for r, w in bench.TRITON_TILINGS)]
  assert all(r["ok"] for r in rows), log.getvalue()
  for r in rows:
    assert {"kind", "name", "shape", "ms", "gbps", "vs_copy", "vs_xla"} <= set(r) and r["vs_xla"] == 1.0
  assert "| pallas rtn bfloat16 rows64_s2 load+store only (ceiling) | 64x256 | 1.000 |" in bench.markdown_tables(
      [{"rows": rows}])


def test_quantizer_tilings_are_checked_against_the_default(interpreted_kernels):
  """--quant-tilings: the default kernel under another tiling, checked bitwise against the
  default's output before it is timed."""
  bench = interpreted_kernels
  rows, log = [], io.StringIO()
  bench.run_jobs(rows, log, [j for j in bench.quantizer_jobs([(128, 256)], tilings=((128, 3),))
                             if "float32" not in j.key[0]])
  assert "pallas rtn bfloat16 rows128_s3" in [r["name"] for r in rows] and all(r["ok"] for r in rows), log.getvalue()
  names = [j.key[0] for j in bench.backward_quantizer_jobs([(128, 256)], tilings=((128, 3),))]
  assert "pallas rht+sr float32 axis=0 rows128_s3" in names
  for bad in ("96x2", "64x0", "64"):
    with pytest.raises(SystemExit):
      bench.main(["--only", "quant", "--quant-tilings", bad])


def test_quant_rows_keep_baselines_and_checks():
  """--quant-rows: matching kernel rows, plus the copy and XLA baselines and the kernel checks
  every ratio and row depends on."""
  import re
  names = [j.name for j in bench.select_rows(bench.backward_quantizer_jobs([(64, 256)]), re.compile("triton"))]
  assert any(n.startswith("copy") for n in names) and "xla rht+sr bfloat16 axis=0" in names
  assert "pallas rht+sr bfloat16 axis=0 check" in names and "pallas rht+sr bfloat16 axis=0" not in names
  # Per dtype and axis the tilings and the backward operand's two ways; + Q6's two ways.
  assert sum(n.startswith("triton") for n in names) == 2 * 2 * (len(bench.TRITON_TILINGS) + 2) + 2
  with pytest.raises(SystemExit):
    bench.main(["--only", "quant", "--quant-rows", "("])


def test_quantizer_jobs_per_input_kind():
  """--quant-inputs lognormal,normal: both kinds' jobs; the default kind keeps
  the historical row names, the other is named in each row. (Running them is
  the next test's, per kind alike.)"""
  one = [j.key[0] for j in bench.backward_quantizer_jobs([(64, 256)])]
  both = [j.key[0] for j in bench.backward_quantizer_jobs([(64, 256)], ("lognormal", "normal"))]
  assert both[:len(one)] == one and len(both) == 2 * len(one)
  assert both[len(one):] == [n.replace("bfloat16", "bfloat16 normal-input").replace("float32", "float32 normal-input")
                             for n in one]
  assert "pallas rht+sr bfloat16 axis=0" in both and "pallas rht+sr bfloat16 normal-input axis=0" in both
  x = bench._test_input(jax.random.key(0), (64, 256), jnp.float32, "normal")
  assert float(jnp.max(jnp.abs(x[3:]))) < 8.0  # no log-normal tail outside the edge-case rows
  with pytest.raises(ValueError, match="unknown input kind"):
    bench._test_input(jax.random.key(0), (64, 256), jnp.float32, "uniform")
  with pytest.raises(SystemExit):
    bench.main(["--only", "quant", "--quant-inputs", "normal,uniform"])


def test_backward_quantizer_jobs_check_then_time(interpreted_kernels):
  bench = interpreted_kernels
  rows, log = [], io.StringIO()
  bench.run_jobs(rows, log, bench.backward_quantizer_jobs([(64, 256)]))
  assert all(r["ok"] for r in rows), log.getvalue() + str([r for r in rows if not r["ok"]])
  names = [r["name"] for r in rows]
  # Per dtype and axis: XLA, the kernel, +operand, tiles from registers, the dense transform and lane
  # semantics (the last three checked bitwise against the kernel), the Triton kernel's tilings
  # (checked bitwise against XLA) and its bf16 GEMM operand both ways (written by the kernel, checked
  # bitwise against its codes' XLA decode); float32 along tokens, Q6 of X_hat both ways (from Q1's
  # codes checked bitwise against the kernel on the decoded X_hat).
  assert len(names) == 2 * 2 * (8 + len(bench.TRITON_TILINGS)) + 4 and "pallas rht+sr float32 axis=0 +operand" in names
  assert {"triton rht+sr bfloat16 axis=0, then the XLA decode to the bf16 GEMM operand",
          "triton rht+sr bfloat16 axis=0 writing the bf16 GEMM operand"} <= set(names)
  assert {"triton rht+sr float32 axis=0 on XLA-decoded X_hat",
          "triton rht+sr float32 axis=0 from Q1 codes"} <= set(names)
  assert "triton rht+sr float32 axis=0 rows64_w8" in names
  assert "pallas rht+sr bfloat16 axis=0 dense transform (SMEM tile)" in names
  assert "pallas rht+sr bfloat16 axis=0 lane semantics" in names
  assert "pallas rht+sr float32 axis=0 tiles from registers (unrolled, larger module)" in names
  assert "pallas rht+sr bfloat16 axis=-1 division=hardware (timing only, inexact)" in names


def test_operand_rows_check_the_kernel_against_the_decode_bitwise():
  """The operand kernel's row is timed only if its values and outer scales are bitwise the decoded
  codes': one flipped bit, a missing reference or another dtype is reported as a mismatch."""
  x = jnp.zeros((64, 256), jnp.float32)
  decoded, operand = quantizers._operand_jobs(x, "float32", (64, 256), -1, jnp.ones((16,)), None, None)
  values, s_out = jnp.ones((64, 256), jnp.bfloat16), jnp.ones((64, 2), jnp.float32)
  out = types.SimpleNamespace(values=values, scale_outer=s_out)
  assert operand.check(out, {decoded.key: (values, s_out)}) is None
  flipped = values.view(jnp.uint16).at[3, 7].add(1).view(jnp.bfloat16)
  for outs in ({decoded.key: (flipped, s_out)}, {decoded.key: (values.astype(jnp.float32), s_out)}, {}):
    assert operand.check(out, outs).startswith("MISMATCH")


def test_failed_checks_are_reported_and_not_timed(rng, interpreted_kernels):
  bench = interpreted_kernels
  x = _input(rng)
  ref = bench.quantize_nvfp4_rtn(x)
  bad = ref._replace(codes=jnp.zeros_like(ref.codes)) if hasattr(ref, "_replace") else None
  check = bench._inexact_check(("exact", (64, 256)))
  assert check(ref, {("exact", (64, 256)): ref}) is None
  assert check(ref, {}).startswith("no reference")
  if bad is not None:
    assert check(bad, {("exact", (64, 256)): ref}).startswith("MISMATCH")
  timed = []
  jobs = [bench.Job(("broken", (64, 256)), lambda v: v * 2, (x,), check=lambda out, outs: "MISMATCH vs reference",
                    row=lambda *a: timed.append(a)),
          bench.Job(("after", (64, 256)), lambda v: v + 1, (x,), args_from=("broken", (64, 256)),
                    row=lambda *a: timed.append(a))]
  rows = []
  bench.run_jobs(rows, io.StringIO(), jobs)
  assert not timed and [r["ok"] for r in rows] == [False, False]
  assert rows[0]["error"] == "MISMATCH vs reference" and "did not run" in rows[1]["error"]


def test_gemm_jobs_check_then_time(interpreted_kernels):
  """The GEMM section at one small shape: each config's check (kernel vs
  nvfp4_gemm_reference) before its timed jobs; a config whose check fails
  (here: SMEM over the limit) is reported, and its GEMMs are not timed;
  scaled_dot_general is timed or reported as failed (it may not run on CPU)."""
  from tetrajet_jax.kernels.nvfp4_gemm import GemmConfig

  bench = interpreted_kernels
  shape = (128, 256, 128)
  configs = {"t64x64_s2": GemmConfig(tile_m=64, tile_n=64, grid_tile_width=1),
             "too_big": GemmConfig(tile_m=256, tile_n=256, max_concurrent_steps=4)}
  rows, log = [], io.StringIO()
  jobs = bench.gemm_jobs(shapes=[shape, (256, 256, 256)], configs=configs, check_shape=(128, 384, 256), quick=True)
  assert len({j.key for j in jobs}) == len(jobs)
  bench.run_jobs(rows, log, [j for j in jobs if j.key[1] != (256, 256, 256)])
  names = [r["name"] for r in rows]
  assert names == ["pallas gemm t64x64_s2", "pallas gemm too_big", "xla bf16 dot",
                   "pallas block-scaled bf16 gemm t64x64_s2", "pallas nvfp4_gemm (+XLA decode) t64x64_s2",
                   "pallas block-scaled bf16 gemm too_big", "pallas nvfp4_gemm (+XLA decode) too_big",
                   "jax.nn.scaled_dot_general nvfp4"], log.getvalue()
  check, bad_check = rows[0], rows[1]
  assert check["kind"] == "gemm_check" and check["ok"] and check["rel_err"] < 1e-5, check
  assert bad_check["kind"] == "gemm_check" and not bad_check["ok"] and "ValueError" in bad_check["error"]
  for r in rows[2:5]:
    assert r["kind"] == "gemm" and r["ok"] and r["shape"] == shape, (r, log.getvalue())
    assert r["ms"] == 1.0 and r["tflops"] > 0 and r["vs_bf16"] == 1.0
  assert [r["ok"] for r in rows[5:7]] == [False, False] and all("ValueError" in r["error"] for r in rows[5:7])
  sdg = rows[-1]
  assert sdg["kind"] == "gemm" and (sdg["ok"] or sdg["error"]), sdg
  text = bench.markdown_tables([{"rows": rows}])
  assert f"pallas gemm t64x64_s2: {check['rel_err']:.1e}" in text and "pallas gemm too_big: failed: ValueError" in text
  assert "| pallas nvfp4_gemm (+XLA decode) t64x64_s2 | 128x256x128 | 1.000 |" in text
  assert "| pallas block-scaled bf16 gemm too_big | 128x256x128 | - | - | failed: ValueError" in text
  bench.format_table(rows)


def test_gemm_check_failure_stops_timing(monkeypatch, interpreted_kernels):
  """A config whose kernel disagrees with the reference: its check row says so
  (with the error), and its GEMMs run but are reported, not timed."""
  from tetrajet_jax.kernels.nvfp4_gemm import GemmConfig

  bench = interpreted_kernels
  ref = bench.nvfp4_gemm_reference
  bench.patch(monkeypatch, "nvfp4_gemm_reference", lambda a, b: 2 * ref(a, b))
  timed = []
  bench.patch(monkeypatch, "time_fn", lambda f, *a, **kw: timed.append(f) or 1e-3)
  shape = (128, 256, 128)
  jobs = bench.gemm_jobs(shapes=[shape], configs={"t64x64": GemmConfig(tile_m=64, tile_n=64, grid_tile_width=1)},
                         check_shape=shape)
  rows, log = [], io.StringIO()
  bench.run_jobs(rows, log, [j for j in jobs if j.kind == "gemm_check" or "t64x64" in j.name])
  assert [r["name"] for r in rows] == ["pallas gemm t64x64", "pallas block-scaled bf16 gemm t64x64",
                                       "pallas nvfp4_gemm (+XLA decode) t64x64"], log.getvalue()
  assert not rows[0]["ok"] and 0.4 < rows[0]["rel_err"] < 0.6
  assert all(not r["ok"] and r["error"].startswith("CHECK FAILED") for r in rows[1:]) and not timed
  assert "FAILED/SKIPPED  rel_err=5" in bench.format_table(rows[:1])
  assert "pallas gemm t64x64: 5.0e-01 (FAILED)" in bench.markdown_tables([{"rows": rows}])


def test_linear_parts_match_the_layer():
  """quantize + gemms reproduce the layer's y, dx, dw (so their timings split its work)."""
  linear_parts = bench.linear_parts
  from tetrajet_jax.linear import linear, recipes

  m, k, n = 128, 256, 128
  kx, kw, kd = jax.random.split(jax.random.key(5), 3)
  x = jax.random.normal(kx, (m, k), jnp.bfloat16)
  w = jax.random.normal(kw, (k, n), jnp.float32) * 0.02
  dy = jax.random.normal(kd, (m, n), jnp.bfloat16)
  key = jax.random.key(0)
  y, vjp = jax.vjp(lambda x, w: linear(x, w, recipe=recipes.get("tetrajet_v2", backend="xla"), key=key), x, w)
  dx, dw = vjp(dy)
  quant, gemm_fn = linear_parts("tetrajet_v2", "xla")
  ops = jax.jit(quant)(x, w, dy, key)
  assert len(ops) == 6
  y2, dx2, dw2 = jax.jit(gemm_fn)(*ops)
  for a, b in ((y, y2), (dx, dx2[:, :k]), (dw, dw2[:k])):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b.astype(a.dtype), np.float32), rtol=1e-6)


def test_linear_jobs_on_cpu():
  """The linear section at two small shapes, wave by wave as main() runs it:
  every job compiles and runs (backend "auto" falls back to XLA off Hopper),
  the GEMMs-only job on the quantizers-only job's output, and each ratio is
  against the bf16 fwd+bwd of its own shape."""

  shapes = [(128, 256, 128), (128, 128, 256)]
  rows, log = [], io.StringIO()
  jobs = bench.linear_jobs(shapes, shapes[:1])
  waves = [label for label, _ in itertools.groupby(j.wave for j in jobs)]
  assert waves == ["linear xla 128x256x128", "linear pallas 128x256x128", "linear xla 128x128x256",
                   "linear pallas 128x128x256", "linear parts xla 128x256x128", "linear parts auto 128x256x128"]
  bench.run_jobs(rows, log, jobs)
  assert [r["ok"] for r in rows] == [True] * 12, log.getvalue()
  by = {(r["name"], tuple(r["shape"])): r for r in rows}
  for shape in shapes:
    base = by["linear fwd+bwd bf16 backend=xla", shape]
    assert base["vs_bf16"] == 1.0
    r = by["linear fwd+bwd tetrajet_v2 backend=xla", shape]
    assert r["vs_bf16"] == pytest.approx(r["ms"] / base["ms"])
  r = by["tetrajet_v2 GEMMs only (3, pre-quantized) backend=auto", shapes[0]]
  assert r["vs_bf16"] == pytest.approx(r["ms"] / by["linear fwd+bwd bf16 backend=xla", shapes[0]]["ms"])
  assert all(r["ms"] > 0 for r in rows)
  with pytest.raises(ValueError, match="not among the timed shapes"):
    bench.linear_jobs(shapes[:1], shapes[1:])


def test_linear_jobs_attribution_only():
  """--linear-parts-only --linear-backends pallas: the bf16 baseline, then the
  pallas attribution rows, and no whole-layer tetrajet_v2 row."""

  shape = (128, 256, 128)
  with interpret_kernels(*KERNELS):  # building the GEMM rows traces the quantizers (on CPU: interpreted)
    jobs = bench.linear_jobs([shape], [shape], ("pallas",), layers=False)
  assert [j.key[0] for j in jobs] == ["linear fwd+bwd bf16 backend=xla", "tetrajet_v2 forward only backend=pallas",
                                      "tetrajet_v2 quantizers only (6) backend=pallas",
                                      "tetrajet_v2 GEMMs only (3, pre-quantized) backend=pallas"]
  with pytest.raises(SystemExit):
    bench.main(["--only", "linear", "--linear-backends", "xla,bogus"])


def test_gemm_configs_flag_picks_the_tilings(monkeypatch, tmp_path):
  """--gemm-configs: only the named tilings reach the GEMM jobs, in the order given; an unknown
  name is refused before anything runs."""
  seen = []
  monkeypatch.setattr(kernels, "gemm_jobs", lambda quick, shapes, configs: seen.append(configs) or [])
  monkeypatch.setattr(kernels, "run_jobs", lambda rows, log, jobs: None)
  names = ["t128x64_k64_s4_pairs", "t128x64_s2"]
  assert bench.main(["--only", "gemm", "--gemm-configs", ",".join(names), "--out", str(tmp_path / "g.json")]) == 0
  assert seen == [{name: gemms.GEMM_CONFIGS[name] for name in names}]
  with pytest.raises(SystemExit):
    bench.main(["--only", "gemm", "--gemm-configs", "t128x64_s2,t256x256"])
  assert len(seen) == 1


def test_run_jobs_compiles_wave_by_wave(monkeypatch):
  """Each wave's loops compile together and its rows land before the next
  wave compiles (a call cut off mid-section keeps the earlier waves' rows)."""

  events, real = [], bench.compile_loops
  bench.patch(monkeypatch, "compile_loops", lambda jobs: events.append(("compile", len(jobs))) or real(jobs))
  bench.patch(monkeypatch, "time_fn", lambda f, *a, **kw: 1e-3)
  x = jnp.ones((8, 128), jnp.float32)
  row = lambda dt, out, times: events.append("row") or dict(kind="linear", name="r", ok=True, ms=1.0, vs_bf16=1.0)
  jobs = [bench.Job(("a", ()), lambda v: v + 1, (x,), row=row, wave="one"),
          bench.Job(("b", ()), lambda v: v * 2, (x,), row=row, wave="one"),
          bench.Job(("c", ()), lambda v: v - 1, (x,), row=row, wave="two")]
  bench.run_jobs([], io.StringIO(), jobs)
  assert events == [("compile", 2), "row", "row", ("compile", 1), "row"]
  waves = [j.wave for j in bench.gemm_jobs(shapes=[(128, 256, 128)], configs={})]
  assert waves == ["gemm 128x256x128"] * 2


@pytest.mark.parametrize("dtype,col_splits,store_delay", [(jnp.bfloat16, 1, 0), (jnp.float32, 2, 2)])
def test_tma_copy_roofline_copies_every_element(rng, dtype, col_splits, store_delay):
  """The copy the quantizer rows are measured against really copies (Mosaic GPU interpreter)."""
  from experiments.bench.copy_kernel import tma_copy  # noqa: PLC0415

  x = jnp.asarray(rng.standard_normal((256, 512)), dtype)
  interpret = jax.default_backend() != "gpu"
  y = tma_copy(x, col_splits=col_splits, store_delay=store_delay, interpret=interpret)
  np.testing.assert_array_equal(np.asarray(y).view(np.uint8), np.asarray(x).view(np.uint8))
  with pytest.raises(ValueError, match="must be a multiple"):
    tma_copy(x[:, :200], interpret=interpret)
  with pytest.raises(ValueError, match="store_delay"):
    tma_copy(x, store_delay=4, interpret=interpret)


def test_xla_copy_roofline_copies_every_call_of_the_timing_loop(monkeypatch):
  """On a Hopper GPU the roofline also times XLA's buffer copy; inside the timing loop that copy
  is not elided: the loop body this backend compiles holds one copy of the whole input per call."""
  from experiments.bench import copy_kernel, timing  # noqa: PLC0415

  monkeypatch.setattr(copy_kernel, "hopper_available", lambda: True)
  x = jax.ShapeDtypeStruct((256, 512), jnp.bfloat16)
  fns = dict(copy_kernel.copy_fns(x))
  assert "xla-copy" in fns and {n for n, *_ in copy_kernel.COPY_VARIANTS} <= set(fns)
  hlo = timing._looped(fns["xla-copy"], 3).lower(x).compile().as_text()
  body_name = re.search(r"body=(%[\w.\-]+)", hlo).group(1)
  body = hlo[hlo.index(body_name + " "):].split("\n}\n")[0]  # the loop body's computation
  assert sum(" copy(" in line and "bf16[256,512]" in line for line in body.splitlines()) == 1, body
