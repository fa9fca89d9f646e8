"""Checks and times the Pallas NVFP4 kernels against same-run baselines (H200).

  PYTHONPATH=. python -m pallas_kernels.bench [--quick] [--out results/kernels_bench.json]

Prints one table of ratios (median of repeats, one run; each sample times N
calls inside one jitted lax.fori_loop, so host dispatch gaps between short
kernels do not count): quantizer bandwidth vs
a device-to-device copy-equivalent (elementwise negate: reads and writes the
same bytes) and vs the jitted XLA quantizer; NVFP4 GEMM TFLOP/s vs XLA's bf16
dot and vs jax.nn.scaled_dot_general(nvfp4) where it runs; the TetraJet-v2
linear fwd+bwd vs a bf16 linear when tetrajet_jax.linear exists. Every timed
kernel is first checked against its reference on the same inputs (bitwise for
the quantizer, FP32-accumulation tolerance for the GEMM); a variant that fails
its check is reported and not timed. Writes the table as JSON with the commit
and device name.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np


from pallas_kernels.nvfp4_gemm import GemmConfig, block_scaled_bf16_gemm, nvfp4_gemm, nvfp4_gemm_reference

from pallas_kernels.nvfp4_quantize import quantize_nvfp4_rtn
from pallas_kernels.nvfp4_quantize_backward import quantize_nvfp4_rht_sr
from tetrajet_jax.benchmarking import commit_id, time_fn
from tetrajet_jax.numerics import hadamard_signs, nvfp4_bf16_operand, quantize_nvfp4, random_hadamard_16

GEMM_SHAPES = [  # (M, K, N): out [M, N] = A [M, K] @ B [N, K]^T
    (8192, 8192, 8192),
    (16384, 1024, 3072),
    (16384, 1024, 1024),
    (16384, 1024, 8192),
    (16384, 4096, 1024),
]
GEMM_CONFIGS = {  # each fits the 227 KiB SMEM limit with the measured ~34 KiB overhead
    "t128x64_s2": GemmConfig(tile_m=128, tile_n=64, max_concurrent_steps=2),
    "t64x64_s3": GemmConfig(tile_m=64, tile_n=64, max_concurrent_steps=3),
    "t64x128_s2_o1": GemmConfig(tile_m=64, tile_n=128, max_concurrent_steps=2, out_slots=1),
}
# One quantizer shape: every kernel variant costs 20-40 s of Mosaic compile on
# the device host, and (16384, 1024) ranked the variants the same way
# (docs/KERNELS.md); pass --quant-shapes to time others.
QUANT_SHAPES = [(16384, 4096)]


def _record_failure(rows: list, log, label: str, e: Exception, **row) -> None:
  """Logs the traceback and adds a failed row, so one broken variant does not stop the run."""
  log.write(f"{label}:\n{traceback.format_exc()}\n")
  rows.append(dict(row, ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"))


def _nbytes(tree) -> int:
  return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def _same_bits(a, b) -> bool:
  a, b = np.asarray(a), np.asarray(b)
  if a.dtype != b.dtype or a.shape != b.shape:
    return False
  return bool((a.view(np.uint8) == b.view(np.uint8)).all())


def _tensors_equal(t, r) -> bool:
  return (_same_bits(t.codes, r.codes) and _same_bits(t.scale_inner, r.scale_inner)
          and _same_bits(t.scale_outer, r.scale_outer))


def _test_input(key, shape, dtype):
  k1, k2 = jax.random.split(key)
  x = jax.random.normal(k1, shape, jnp.float32) * jnp.exp(2.0 * jax.random.normal(k2, shape, jnp.float32))
  x = x.at[0, :128].set(0.0).at[1, :16].set(1e-30).at[2, 7].set(3e5)
  return x.astype(dtype)


def bench_quantizers(rows: list, log, shapes: list):
  for shape in shapes:
    for dtype in (jnp.bfloat16, jnp.float32):
      x = _test_input(jax.random.key(1), shape, dtype)
      copy = jax.jit(lambda v: -v)
      t_copy = time_fn(copy, x)
      copy_bw = 2 * x.nbytes / t_copy
      xla_q = jax.jit(lambda v: quantize_nvfp4(v, axis=-1))
      ref = xla_q(x)
      out_bytes = _nbytes((ref.codes, ref.scale_inner, ref.scale_outer))
      t_xla = time_fn(xla_q, x)
      dname = jnp.dtype(dtype).name
      rows.append(dict(kind="quant", name=f"xla quantize_nvfp4 {dname}", shape=shape, ms=t_xla * 1e3,
                       gbps=(x.nbytes + out_bytes) / t_xla / 1e9, vs_copy=(x.nbytes + out_bytes) / t_xla / copy_bw,
                       vs_xla=1.0, copy_gbps=copy_bw / 1e9, ok=True))
      # block_rows=128 measured 1.4-2x slower at every shape and dtype
      # (docs/KERNELS.md, device call of commit 37834f9): not re-timed.
      variants = [("rows64_s2", dict(block_rows=64, max_concurrent_steps=2))]
      for vname, kw in variants:
        for emit in (False, True):
          name = f"pallas rtn {dname} {vname}{' +operand' if emit else ''}"
          try:
            f = jax.jit(lambda v, kw=kw, emit=emit: quantize_nvfp4_rtn(v, emit_operand=emit, **kw))
            got = f(x)
            t, qs = got if emit else (got, None)
            ok = _tensors_equal(t, ref)
            if emit:
              ok = ok and _same_bits(qs, nvfp4_bf16_operand(ref)[0])
            if not ok:
              rows.append(dict(kind="quant", name=name, shape=shape, ok=False, error="MISMATCH vs reference"))
              continue
            dt = time_fn(f, x)
            nb = x.nbytes + out_bytes + (qs.nbytes if emit else 0)
            rows.append(dict(kind="quant", name=name, shape=shape, ms=dt * 1e3, gbps=nb / dt / 1e9,
                             vs_copy=nb / dt / copy_bw, vs_xla=t_xla / dt, ok=True))
          except Exception as e:  # noqa: BLE001 - report and keep measuring the rest
            _record_failure(rows, log, f"{name} {shape}", e, kind="quant", name=name, shape=shape)
        log.flush()


def check_backward_quantizer(x, signs, key, axis: int) -> tuple[bool, str]:
  """Kernel vs XLA on a slice of x: scales bitwise on the kernel's own RHT output,
  RHT within FP32 accumulation order of random_hadamard_16, codes among the two
  E2M1 neighbours."""
  xs = x[:1024] if axis == -1 else x[:, :512]
  t, y = jax.jit(lambda v: quantize_nvfp4_rht_sr(v, signs, jnp.uint32(3), axis=axis, emit_transformed=True))(xs)
  y = np.asarray(y)
  lines = xs if axis == -1 else xs.T
  yr = np.asarray(random_hadamard_16(lines.astype(jnp.float32), key, axis=-1))
  cmax = np.repeat(np.abs(yr).reshape(yr.shape[0], -1, 16).max(-1), 16, 1)
  fin = np.isfinite(yr) & np.isfinite(y)
  if not np.all(np.abs(np.where(fin, y - yr, 0)) <= cmax * 2.0**-20):
    return False, "RHT differs from random_hadamard_16"
  r = quantize_nvfp4(jnp.asarray(y), axis=-1)
  if not (_same_bits(t.scale_inner, r.scale_inner) and _same_bits(t.scale_outer, r.scale_outer)):
    return False, "scales differ from quantize_nvfp4 on the kernel's RHT output"
  s = np.repeat(np.asarray(t.scale_inner, np.float32), 16, 1) * np.repeat(np.asarray(t.scale_outer), 128, 1)
  grid = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
  a = np.minimum(np.abs(y / s), 6.0)
  lo_i = np.searchsorted(grid, a, side="right") - 1
  from tetrajet_jax.numerics import decode_e2m1, unpack_e2m1  # noqa: PLC0415
  mag = np.abs(np.asarray(decode_e2m1(unpack_e2m1(t.codes))))
  if not np.all((mag == grid[lo_i]) | (mag == grid[np.minimum(lo_i + 1, 7)])):
    return False, "SR picked a non-neighbour"
  return True, ""


def bench_backward_quantizers(rows: list, log, shapes: list):
  """RHT-16 + SR quantizers (Q3..Q6) along the last axis and along the first axis."""
  key = jax.random.key(11)
  signs = hadamard_signs(key)
  for shape in shapes:
    for dtype in (jnp.bfloat16, jnp.float32):
      x = _test_input(jax.random.key(2), shape, dtype)
      t_copy = time_fn(jax.jit(lambda v: -v), x)
      copy_bw = 2 * x.nbytes / t_copy
      dname = jnp.dtype(dtype).name
      for axis in (-1, 0):
        xla_q = jax.jit(lambda v, k1, k2, axis=axis: quantize_nvfp4(
            random_hadamard_16(v, k1, axis=axis), axis=axis, rounding="stochastic", key=k2))
        ref = xla_q(x, key, jax.random.key(12))
        out_bytes = _nbytes((ref.codes, ref.scale_inner, ref.scale_outer))
        t_xla = time_fn(xla_q, x, key, jax.random.key(12))
        nb = x.nbytes + out_bytes
        rows.append(dict(kind="quant", name=f"xla rht+sr {dname} axis={axis}", shape=shape, ms=t_xla * 1e3,
                         gbps=nb / t_xla / 1e9, vs_copy=nb / t_xla / copy_bw, vs_xla=1.0, copy_gbps=copy_bw / 1e9,
                         ok=True))
        try:
          ok, why = check_backward_quantizer(x, signs, key, axis)
        except Exception as e:  # noqa: BLE001
          log.write(f"rht+sr check {dname} axis={axis} {shape}:\n{traceback.format_exc()}\n")
          ok, why = False, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        for emit in (False, True):
          name = f"pallas rht+sr {dname} axis={axis}{' +operand' if emit else ''}"
          if not ok:
            rows.append(dict(kind="quant", name=name, shape=shape, ok=False, error=f"CHECK FAILED: {why}"))
            continue
          try:
            f = jax.jit(lambda v, sg, sd, axis=axis, emit=emit: quantize_nvfp4_rht_sr(
                v, sg, sd, axis=axis, emit_operand=emit))
            got = f(x, signs, jnp.uint32(4))
            dt = time_fn(f, x, signs, jnp.uint32(4))
            nbe = nb + (got[1].nbytes if emit else 0)
            rows.append(dict(kind="quant", name=name, shape=shape, ms=dt * 1e3, gbps=nbe / dt / 1e9,
                             vs_copy=nbe / dt / copy_bw, vs_xla=t_xla / dt, ok=True))
          except Exception as e:  # noqa: BLE001 - report and keep measuring the rest
            _record_failure(rows, log, f"{name} {shape}", e, kind="quant", name=name, shape=shape)
        log.flush()


def _gemm_operands(m, k, n, seed=0):
  ka, kb = jax.random.split(jax.random.key(seed))
  a = quantize_nvfp4(_test_input(ka, (m, k), jnp.float32), axis=-1)
  b = quantize_nvfp4(jax.random.normal(kb, (n, k), jnp.float32), axis=-1)
  return a, b


def check_gemm(cfg: GemmConfig) -> tuple[bool, float]:
  """Relative max error vs the f32 HIGHEST reference at a mid-size shape (fresh data)."""
  m, k, n = 2 * cfg.cta_tile_m * 4, 1024, cfg.cta_tile_n * 4
  a, b = _gemm_operands(m, k, n, seed=7)
  out = jax.jit(lambda a, b: nvfp4_gemm(a, b, out_dtype=jnp.float32, config=cfg))(a, b)
  ref = nvfp4_gemm_reference(a, b)
  err = float(jnp.max(jnp.abs(out - ref)) / jnp.max(jnp.abs(ref)))
  return bool(np.isfinite(err) and err < 1e-5), err


def bench_gemms(rows: list, log, quick: bool):
  shapes = GEMM_SHAPES[:2] if quick else GEMM_SHAPES
  ok_cfgs = {}
  for cname, cfg in GEMM_CONFIGS.items():
    try:
      ok, err = check_gemm(cfg)
      ok_cfgs[cname] = ok
      rows.append(dict(kind="gemm_check", name=f"pallas gemm {cname}", ok=ok, rel_err=err))
    except Exception as e:  # noqa: BLE001
      _record_failure(rows, log, f"gemm check {cname}", e, kind="gemm_check", name=f"pallas gemm {cname}")
  for (m, k, n) in shapes:
    flops = 2.0 * m * n * k
    a, b = _gemm_operands(m, k, n)
    a_qs, a_so = nvfp4_bf16_operand(a)
    b_qs, b_so = nvfp4_bf16_operand(b)
    xa, xb = jax.random.normal(jax.random.key(3), (m, k), jnp.bfloat16), jax.random.normal(
        jax.random.key(4), (n, k), jnp.bfloat16)
    dot = jax.jit(lambda x, y: jnp.dot(x, y.T, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
    t_dot = time_fn(dot, xa, xb)
    shape = (m, k, n)
    rows.append(dict(kind="gemm", name="xla bf16 dot", shape=shape, ms=t_dot * 1e3, tflops=flops / t_dot / 1e12,
                     vs_bf16=1.0, ok=True))
    for cname, cfg in GEMM_CONFIGS.items():
      if not ok_cfgs.get(cname):
        continue
      try:
        kern = jax.jit(lambda aq, asc, bq, bsc, cfg=cfg: block_scaled_bf16_gemm(aq, asc, bq, bsc, config=cfg))
        dt = time_fn(kern, a_qs, a_so, b_qs, b_so)
        rows.append(dict(kind="gemm", name=f"pallas block-scaled bf16 gemm {cname}", shape=shape, ms=dt * 1e3,
                         tflops=flops / dt / 1e12, vs_bf16=t_dot / dt, ok=True))
        full = jax.jit(lambda a, b, cfg=cfg: nvfp4_gemm(a, b, config=cfg))
        dt = time_fn(full, a, b)
        rows.append(dict(kind="gemm", name=f"pallas nvfp4_gemm (+XLA decode) {cname}", shape=shape,
                         ms=dt * 1e3, tflops=flops / dt / 1e12, vs_bf16=t_dot / dt, ok=True))
      except Exception as e:  # noqa: BLE001
        _record_failure(rows, log, f"gemm {cname} {shape}", e, kind="gemm", name=f"pallas gemm {cname}",
                        shape=shape)
    try:
      cfgs = [jax.nn.get_scaled_dot_general_config("nvfp4")] * 3
      sdg = jax.jit(lambda x, y: jax.nn.scaled_dot_general(
          x, y, (((1,), (1,)), ((), ())), preferred_element_type=jnp.bfloat16, configs=cfgs))
      dt = time_fn(sdg, xa, xb)
      rows.append(dict(kind="gemm", name="jax.nn.scaled_dot_general nvfp4", shape=shape, ms=dt * 1e3,
                       tflops=flops / dt / 1e12, vs_bf16=t_dot / dt, ok=True))
    except Exception as e:  # noqa: BLE001
      _record_failure(rows, log, f"scaled_dot_general {shape}", e, kind="gemm",
                      name="jax.nn.scaled_dot_general nvfp4", shape=shape)
    log.flush()


LINEAR_SHAPES = [(16384, 1024, 4096), (16384, 4096, 1024)]  # (M tokens, K in, N out)


def bench_linear(rows: list, log):
  """TetraJet-v2 linear fwd+bwd (six quantizers) vs the bf16 linear; needs tetrajet_jax.linear."""
  try:
    from tetrajet_jax.linear import linear  # noqa: PLC0415 - lazy: the layer lands separately
  except ImportError as e:
    rows.append(dict(kind="linear", name="tetrajet linear fwd+bwd", ok=False,
                     error=f"skipped: tetrajet_jax.linear not importable ({e})"))
    return
  for (m, k, n) in LINEAR_SHAPES:
    kx, kw, kd = jax.random.split(jax.random.key(5), 3)
    x = jax.random.normal(kx, (m, k), jnp.bfloat16)
    w = jax.random.normal(kw, (k, n), jnp.float32) * 0.02
    dy = jax.random.normal(kd, (m, n), jnp.bfloat16)

    def step(x, w, dy, key, recipe, gemm):
      y, vjp = jax.vjp(lambda x, w: linear(x, w, recipe=recipe, key=key, gemm=gemm), x, w)
      return y, vjp(dy.astype(y.dtype))

    t_ref = None
    for recipe, gemm in (("bf16", "fast"), ("tetrajet_v2", "fast"), ("tetrajet_v2", "pallas")):
      name = f"linear fwd+bwd {recipe} gemm={gemm}"
      try:
        f = jax.jit(lambda x, w, dy, key, recipe=recipe, gemm=gemm: step(x, w, dy, key, recipe, gemm))
        dt = time_fn(f, x, w, dy, jax.random.key(0), reps=7, inner=5)
        t_ref = dt if t_ref is None else t_ref
        rows.append(dict(kind="linear", name=name, shape=(m, k, n), ms=dt * 1e3, vs_bf16=dt / t_ref, ok=True))
      except Exception as e:  # noqa: BLE001
        _record_failure(rows, log, f"{name} {(m, k, n)}", e, kind="linear", name=name, shape=(m, k, n))


class Rows(list):
  """The result rows: each appended row is printed and the JSON file rewritten
  at once, so a run cut off by a time limit (each Mosaic compile takes tens of
  seconds on the device host) still leaves every row it measured."""

  def __init__(self, header: dict, out: str):
    super().__init__()
    self.header, self.out = header, out

  def append(self, row: dict) -> None:
    super().append(row)
    print(format_table([row]), flush=True)
    with open(self.out + ".tmp", "w") as f:
      json.dump(dict(self.header, rows=list(self)), f, indent=1, default=str)
    os.replace(self.out + ".tmp", self.out)


def format_table(rows: list) -> str:
  lines = []
  for r in rows:
    shape = "x".join(map(str, r.get("shape", ()))) or "-"
    if not r.get("ok"):
      lines.append(f"{r['kind']:<10} {r['name']:<48} {shape:<18} FAILED/SKIPPED {r.get('error', '')}"
                   f"{' rel_err=%.2e' % r['rel_err'] if 'rel_err' in r else ''}")
    elif r["kind"] == "quant":
      lines.append(f"quant      {r['name']:<48} {shape:<18} {r['ms']:8.3f} ms {r['gbps']:7.0f} GB/s "
                   f"vs_copy={r['vs_copy']:.2f} vs_xla={r['vs_xla']:.2f}")
    elif r["kind"] == "gemm":
      lines.append(f"gemm       {r['name']:<48} {shape:<18} {r['ms']:8.3f} ms {r['tflops']:6.0f} TFLOP/s "
                   f"vs_bf16={r['vs_bf16']:.2f}")
    elif r["kind"] == "linear":
      lines.append(f"linear     {r['name']:<48} {shape:<18} {r['ms']:8.3f} ms time/bf16={r['vs_bf16']:.2f}")
    elif r["kind"] == "gemm_check":
      lines.append(f"check      {r['name']:<48} ok rel_err={r['rel_err']:.2e}")
  return "\n".join(lines)


def markdown_tables(results: list) -> str:
  """Markdown tables (quantizers, GEMMs, linear layer) of saved bench results
  (the JSON files `main` writes), with each file's commit, device and date."""
  cols = {
      "quant": (["quantizer", "shape", "ms", "GB/s", "vs same-run copy", "vs XLA quantizer"],
                lambda r: [f"{r['ms']:.3f}", f"{r['gbps']:.0f}", f"{r['vs_copy']:.2f}", f"{r['vs_xla']:.2f}"]),
      "gemm": (["GEMM", "M x K x N", "ms", "TFLOP/s", "vs XLA bf16 dot"],
               lambda r: [f"{r['ms']:.3f}", f"{r['tflops']:.0f}", f"{r['vs_bf16']:.2f}"]),
      "linear": (["linear fwd+bwd", "M x K x N", "ms", "time / bf16 linear"],
                 lambda r: [f"{r['ms']:.3f}", f"{r['vs_bf16']:.2f}"]),
  }
  out = []
  for res in results:
    src = f"commit {res.get('commit')}, {res.get('device')}, jax {res.get('jax')}, {res.get('date')}"
    for kind, (header, cells) in cols.items():
      rows = [r for r in res["rows"] if r.get("kind") == kind]
      if not rows:
        continue
      out += [f"{kind} ({src}):", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
      for r in rows:
        shape = "x".join(map(str, r.get("shape", ()))) or "-"
        vals = cells(r) if r.get("ok") else ["-"] * (len(header) - 3) + [f"failed: {r.get('error', '')[:80]}"]
        out.append("| " + " | ".join([r["name"], shape] + vals) + " |")
      copies = [f"{'x'.join(map(str, r['shape']))} {r['name'].split()[-1]}: {r['copy_gbps']:.0f} GB/s"
                for r in rows if "copy_gbps" in r]
      out += ([""] + ["Same-run copy bandwidth: " + "; ".join(copies) + "."] if copies else []) + [""]
    checks = [f"{r['name']}: {r['rel_err']:.1e}" for r in res["rows"] if r.get("kind") == "gemm_check"]
    if checks:
      out += ["GEMM checks before timing (max relative error vs f32 HIGHEST): " + "; ".join(checks) + ".", ""]
  return "\n".join(out)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default="results/kernels_bench.json")
  p.add_argument("--log", default=None, help="traceback log (default: next to --out)")
  p.add_argument("--quick", action="store_true", help="first shapes only")
  p.add_argument("--quant-shapes", default=None, help="quantizer shapes, e.g. 16384x4096,16384x1024")
  sections = ("quant", "bwdquant", "gemm", "linear")
  p.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(sections)}")
  p.add_argument("--table", nargs="+", metavar="JSON", default=None,
                 help="print saved results (JSON files written by --out) as markdown tables and exit")
  args = p.parse_args(argv)
  if args.table:
    print(markdown_tables([json.loads(Path(f).read_text()) for f in args.table]))
    return 0
  only = None if args.only is None else set(args.only.split(","))
  quant_shapes = QUANT_SHAPES
  if args.quant_shapes:
    try:
      quant_shapes = [tuple(int(d) for d in s.split("x")) for s in args.quant_shapes.split(",")]
    except ValueError:
      p.error(f"--quant-shapes: expected ROWSxCOLS[,ROWSxCOLS...], got {args.quant_shapes!r}")
  if args.quick:
    quant_shapes = quant_shapes[:1]
  if only is not None and not only <= set(sections):
    p.error(f"--only: unknown section(s) {sorted(only - set(sections))}; valid: {', '.join(sections)}")
  dev = jax.devices()[0]
  header = dict(commit=commit_id(), device=getattr(dev, "device_kind", str(dev)), jax=jax.__version__,
                date=time.strftime("%Y-%m-%d %H:%M:%S"))
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  rows = Rows(header, args.out)
  with open(args.log or os.path.splitext(args.out)[0] + ".log", "w") as log:
    for section, fn in (("quant", lambda: bench_quantizers(rows, log, quant_shapes)),
                        ("bwdquant", lambda: bench_backward_quantizers(rows, log, quant_shapes)),
                        ("gemm", lambda: bench_gemms(rows, log, args.quick)),
                        ("linear", lambda: bench_linear(rows, log))):
      if only is None or section in only:
        print(f"--- {section}", flush=True)
        fn()
  print("=" * 30, "summary")
  print(json.dumps(header))
  print(format_table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
