"""Checks and times the Pallas NVFP4 kernels against same-run baselines (H200).

  PYTHONPATH=. python -m pallas_kernels.bench [--only quant,bwdquant,gemm,linear] [--out results/kernels_bench.json]

Prints one table of ratios (median of repeats, one run; each sample times N
calls inside one jitted lax.fori_loop, so host dispatch gaps between short
kernels do not count): quantizer bandwidth vs a device-to-device
copy-equivalent (elementwise negate: reads and writes the same bytes) and vs
the jitted XLA quantizer; NVFP4 GEMM TFLOP/s vs XLA's bf16 dot and vs
jax.nn.scaled_dot_general(nvfp4) where it runs; the TetraJet-v2 linear
fwd+bwd vs a bf16 linear. Attribution rows say where the time goes: the
default quantizers with the plain hardware division per element (timing
only: not bitwise) and with no tile math (the load+store ceiling); the
linear's forward alone, its six quantizers alone and its three GEMMs alone,
each vs the same bf16 fwd+bwd. Every timed kernel is first checked against
its reference on the same inputs (bitwise for the quantizer, FP32-accumulation
tolerance for the GEMM); a variant that fails its check is reported and not
timed. Each section runs in waves (`run_jobs`): a wave's timing loops
compile side by side, then its rows are measured. Writes the table as JSON with the commit and device name;
`--table FILES` renders saved JSON as markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np


from pallas_kernels.nvfp4_gemm import GemmConfig, block_scaled_bf16_gemm, nvfp4_gemm, nvfp4_gemm_reference

from pallas_kernels.nvfp4_quantize import quantize_nvfp4_rtn
from pallas_kernels.nvfp4_quantize_backward import quantize_nvfp4_rht_sr
from tetrajet_jax.benchmarking import commit_id, compile_loops, time_fn
from tetrajet_jax.numerics import (decode_e2m1, hadamard_signs, nvfp4_bf16_operand, quantize_nvfp4,
                                   random_hadamard_16, unpack_e2m1)

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


QUANT_INPUTS = ("lognormal", "normal")


def _test_input(key, shape, dtype, kind: str = "lognormal"):
  """Quantizer input: "lognormal" (normal times exp(2 N(0,1)): magnitudes over
  ~e^+-6, many values far below their block's max) or "normal" (like a
  layer's activations and dY), both with a zero block, a tiny block and one
  huge value in the first rows (edge cases the checks see)."""
  if kind not in QUANT_INPUTS:
    raise ValueError(f"unknown input kind {kind!r}; use one of {QUANT_INPUTS}")
  k1, k2 = jax.random.split(key)
  x = jax.random.normal(k1, shape, jnp.float32)
  if kind == "lognormal":
    x = x * jnp.exp(2.0 * jax.random.normal(k2, shape, jnp.float32))
  x = x.at[0, :128].set(0.0).at[1, :16].set(1e-30).at[2, 7].set(3e5)
  return x.astype(dtype)


def code_agreement(a, b) -> float:
  """Fraction of equal 4-bit codes of two packed code arrays (both nibbles)."""
  a, b = np.asarray(a), np.asarray(b)
  return float(((a & 0xF) == (b & 0xF)).mean() + ((a >> 4) == (b >> 4)).mean()) / 2


@dataclasses.dataclass
class Job:
  """One timed function of a section.

  key: (name, shape); later jobs' checks and rows read `outs` / `times` by
  key. check(out, outs) -> None or why the output is wrong (then the job
  is reported, not timed). row(dt, out, times) -> the result row, or None for a
  job that is only a baseline or a check. timed=False: run and check only
  (row, if any, is then called with dt=None).
  args_from: the key of an earlier job whose output is this job's arguments
  (args then only give their shapes, for compiling). wave: consecutive jobs
  with the same label compile together (`run_jobs`).
  """
  key: tuple
  fn: Callable
  args: tuple
  args_from: tuple | None = None
  row: Callable | None = None
  check: Callable | None = None
  timed: bool = True
  inner: int = 10
  reps: int = 15
  kind: str = "quant"
  wave: str = ""

  @property
  def name(self) -> str:
    return self.key[0]


def run_jobs(rows: list, log, jobs: list[Job]) -> None:
  """Runs the jobs wave by wave (consecutive jobs with the same `wave` label).

  Per wave: every timing loop compiles side by side (compile_loops), then
  each job runs, is checked and is timed, one at a time, in order. Each loop's
  output is its function's output (the arguments do not change between
  calls), so the checks read the very executable that is timed, and no kernel
  is compiled twice. Why waves: a wave's rows come only after all its
  compiles, and a `gemm="pallas"` layer alone takes minutes to compile on the
  device host, so builders give expensive jobs a wave of their own, after the
  cheap ones, and a call cut off by its time limit keeps every earlier wave.
  """
  outs, times = {}, {}
  for label, wave in itertools.groupby(jobs, key=lambda j: j.wave):
    wave = list(wave)
    t0 = time.perf_counter()
    loops = compile_loops([(j.fn, j.args, j.inner) for j in wave])
    print(f"wave {label or '-'}: {len(wave)} timing loops compiled in {time.perf_counter() - t0:.0f} s", flush=True)
    for j, loop in zip(wave, loops):
      _run_job(rows, log, j, loop, outs, times)


def _run_job(rows: list, log, j: Job, loop, outs: dict, times: dict) -> None:
  shape = j.key[1]
  try:
    if isinstance(loop, Exception):
      raise loop
    args = j.args
    if j.args_from is not None:
      if j.args_from not in outs:
        raise RuntimeError(f"no arguments: {j.args_from[0]} did not run")
      args = outs[j.args_from]
    out = loop(*args)
    why = j.check(out, outs) if j.check else None
    if why:
      rows.append(dict(kind=j.kind, name=j.name, shape=shape, ok=False, error=why))
      return
    outs[j.key] = out
    if j.timed:
      times[j.key] = time_fn(j.fn, *args, reps=j.reps, loop=loop)
    row = j.row(times.get(j.key), out, times) if j.row else None
    if row is not None:
      rows.append(row)
  except Exception as e:  # noqa: BLE001 - report and keep measuring the rest
    _record_failure(rows, log, f"{j.name} {shape}", e, kind=j.kind, name=j.name, shape=shape)
  finally:
    log.flush()


def _label(jobs: list[Job], start: int, wave: str) -> None:
  """Puts the jobs from `start` on that have no wave yet into `wave`."""
  for j in jobs[start:]:
    j.wave = j.wave or wave


def _quant_row(name: str, shape, dt: float, nbytes: int, copy_bw: float, t_xla: float, **extra) -> dict:
  return dict(kind="quant", name=name, shape=shape, ms=dt * 1e3, gbps=nbytes / dt / 1e9,
              vs_copy=nbytes / dt / copy_bw, vs_xla=t_xla / dt, ok=True, **extra)


# Where a quantizer's time goes (bf16 input, default variant): the same kernel
# with the plain hardware quotient per element (timing only, not bitwise: what
# exactness costs), and with no tile math (same loads and stores: the ceiling).
ATTRIBUTION = (
    (" division=hardware (timing only, inexact)", dict(_division="hardware")),
    (" load+store only (ceiling)", dict(_math="none")),
)


def _inexact_check(ref_key):
  """The hardware-division variant is not bitwise (that is what it measures):
  >= 99% of its codes must equal the exact kernel's, or it is not timed."""
  def check(out, outs):
    if ref_key not in outs:
      return f"no reference: {' '.join(map(str, ref_key))} failed"
    agree = code_agreement(out.codes, outs[ref_key].codes)
    return None if agree >= 0.99 else f"MISMATCH: {agree:.2%} of codes agree (< 99%)"
  return check


def _input_name(dtype, kind: str) -> str:
  """Row-name part for the dtype, plus the input kind unless it is the default."""
  return jnp.dtype(dtype).name + ("" if kind == QUANT_INPUTS[0] else f" {kind}-input")


def quantizer_jobs(shapes: list, inputs: tuple = QUANT_INPUTS[:1]) -> list[Job]:
  """RTN quantizers: the same-run copy (baseline), the XLA quantizer, the
  Pallas kernel (bitwise vs XLA), with its bf16 operand, and its attribution,
  per input kind (`_test_input`)."""
  jobs = []
  for shape, kind, dtype in itertools.product(shapes, inputs, (jnp.bfloat16, jnp.float32)):
    start = len(jobs)
    x = _test_input(jax.random.key(1), shape, dtype, kind)
    dname = _input_name(dtype, kind)
    copy, xla = (f"copy {dname}", shape), (f"xla quantize_nvfp4 {dname}", shape)
    out_bytes = _nbytes(jax.eval_shape(lambda v: quantize_nvfp4(v, axis=-1), x))
    nb = x.nbytes + out_bytes
    bw = lambda times, copy=copy, x=x: 2 * x.nbytes / times[copy]
    jobs += [Job(copy, lambda v: -v, (x,)),
             Job(xla, lambda v: quantize_nvfp4(v, axis=-1), (x,),
                 row=lambda dt, out, times, xla=xla, nb=nb, bw=bw: _quant_row(
                     *xla, dt, nb, bw(times), dt, copy_gbps=bw(times) / 1e9))]
    # block_rows=128 measured 1.4-2x slower at every shape and dtype
    # (docs/KERNELS.md, device call of commit 37834f9): not re-timed.
    for emit in (False, True):
      key = (f"pallas rtn {dname} rows64_s2{' +operand' if emit else ''}", shape)

      def check(out, outs, xla=xla, emit=emit):
        ref = outs.get(xla)
        if ref is None:
          return "no reference: the XLA quantizer failed"
        t, qs = out if emit else (out, None)
        ok = _tensors_equal(t, ref) and (not emit or _same_bits(qs, nvfp4_bf16_operand(ref)[0]))
        return None if ok else "MISMATCH vs reference"

      jobs.append(Job(key, lambda v, emit=emit: quantize_nvfp4_rtn(v, emit_operand=emit), (x,), check=check,
                      row=lambda dt, out, times, key=key, nb=nb, bw=bw, xla=xla, emit=emit: _quant_row(
                          key[0], key[1], dt, nb + (out[1].nbytes if emit else 0), bw(times), times[xla])))
    _label(jobs, start, f"rtn {dname}")
    if dtype == jnp.bfloat16:
      exact = (f"pallas rtn {dname} rows64_s2", shape)
      for suffix, knobs in ATTRIBUTION:
        key = (exact[0] + suffix, shape)
        jobs.append(Job(key, lambda v, knobs=knobs: quantize_nvfp4_rtn(v, **knobs), (x,),
                        check=_inexact_check(exact) if "_division" in knobs else None,
                        row=lambda dt, out, times, key=key, nb=nb, bw=bw, xla=xla: _quant_row(
                            key[0], key[1], dt, nb, bw(times), times[xla])))
      _label(jobs, start, f"rtn {dname} attribution")
  return jobs


def check_backward_output(xs, t, y, key, axis: int) -> str | None:
  """The kernel's output on xs (with its RHT output y) vs XLA: RHT within FP32
  accumulation order of random_hadamard_16, scales bitwise on the kernel's own
  RHT output, codes among the two E2M1 neighbours. None when all hold."""
  y = np.asarray(y)
  lines = xs if axis == -1 else xs.T
  lines = jnp.pad(lines, ((0, 0), (0, y.shape[1] - lines.shape[1])))  # the kernel pads its axis with zeros
  yr = np.asarray(random_hadamard_16(lines.astype(jnp.float32), key, axis=-1))
  cmax = np.repeat(np.abs(yr).reshape(yr.shape[0], -1, 16).max(-1), 16, 1)
  fin = np.isfinite(yr) & np.isfinite(y)
  if not np.all(np.abs(np.where(fin, y - yr, 0)) <= cmax * 2.0**-20):
    return "RHT differs from random_hadamard_16"
  r = quantize_nvfp4(jnp.asarray(y), axis=-1)
  if not (_same_bits(t.scale_inner, r.scale_inner) and _same_bits(t.scale_outer, r.scale_outer)):
    return "scales differ from quantize_nvfp4 on the kernel's RHT output"
  s = np.repeat(np.asarray(t.scale_inner, np.float32), 16, 1) * np.repeat(np.asarray(t.scale_outer), 128, 1)
  grid = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
  a = np.minimum(np.abs(y / s), 6.0)
  lo_i = np.searchsorted(grid, a, side="right") - 1
  mag = np.abs(np.asarray(decode_e2m1(unpack_e2m1(t.codes))))
  if not np.all((mag == grid[lo_i]) | (mag == grid[np.minimum(lo_i + 1, 7)])):
    return "SR picked a non-neighbour"
  return None


def backward_quantizer_jobs(shapes: list, inputs: tuple = QUANT_INPUTS[:1]) -> list[Job]:
  """RHT-16 + SR quantizers (Q3..Q6) along the last axis and along the first
  axis: copy, XLA (RHT then quantize_nvfp4 SR), a check of the kernel on a
  slice, the kernel with and without its bf16 operand, and (bf16, axis -1)
  its attribution, checked against the exact kernel's codes."""
  key = jax.random.key(11)
  signs = hadamard_signs(key)
  jobs = []
  for shape, kind, dtype in itertools.product(shapes, inputs, (jnp.bfloat16, jnp.float32)):
    start = len(jobs)  # the copy joins the first axis's wave
    x = _test_input(jax.random.key(2), shape, dtype, kind)
    dname = _input_name(dtype, kind)
    copy = (f"copy {dname}", shape)
    bw = lambda times, copy=copy, x=x: 2 * x.nbytes / times[copy]
    jobs.append(Job(copy, lambda v: -v, (x,)))
    for axis in (-1, 0):
      xla = (f"xla rht+sr {dname} axis={axis}", shape)
      xla_fn = lambda v, k1, k2, axis=axis: quantize_nvfp4(random_hadamard_16(v, k1, axis=axis), axis=axis,
                                                           rounding="stochastic", key=k2)
      ref_shape = jax.eval_shape(xla_fn, x, key, jax.random.key(12))
      nb = x.nbytes + _nbytes((ref_shape.codes, ref_shape.scale_inner, ref_shape.scale_outer))
      jobs.append(Job(xla, xla_fn, (x, key, jax.random.key(12)),
                      row=lambda dt, out, times, xla=xla, nb=nb, bw=bw: _quant_row(
                          xla[0], xla[1], dt, nb, bw(times), dt, copy_gbps=bw(times) / 1e9)))
      xs = x[:1024] if axis == -1 else x[:, :512]
      checked = (f"pallas rht+sr {dname} axis={axis} check", shape)
      jobs.append(Job(checked, lambda v, axis=axis: quantize_nvfp4_rht_sr(
          v, signs, jnp.uint32(3), axis=axis, emit_transformed=True), (xs,), timed=False, inner=1,
          check=lambda out, outs, xs=xs, axis=axis: check_backward_output(xs, *out, key, axis)))

      def needs_check(out, outs, checked=checked):
        return None if checked in outs else "CHECK FAILED (see the check's row)"

      for emit in (False, True):
        pk = (f"pallas rht+sr {dname} axis={axis}{' +operand' if emit else ''}", shape)
        jobs.append(Job(pk, lambda v, sg, sd, axis=axis, emit=emit: quantize_nvfp4_rht_sr(
            v, sg, sd, axis=axis, emit_operand=emit), (x, signs, jnp.uint32(4)), check=needs_check,
            row=lambda dt, out, times, pk=pk, nb=nb, bw=bw, xla=xla, emit=emit: _quant_row(
                pk[0], pk[1], dt, nb + (out[1].nbytes if emit else 0), bw(times), times[xla])))
      _label(jobs, start, f"rht+sr {dname} axis={axis}")
      if dtype == jnp.bfloat16 and axis == -1:
        exact = (f"pallas rht+sr {dname} axis={axis}", shape)
        for suffix, knobs in ATTRIBUTION:
          ak = (exact[0] + suffix, shape)
          jobs.append(Job(ak, lambda v, sg, sd, knobs=knobs: quantize_nvfp4_rht_sr(v, sg, sd, **knobs),
                          (x, signs, jnp.uint32(4)),
                          check=_inexact_check(exact) if "_division" in knobs else needs_check,
                          row=lambda dt, out, times, ak=ak, nb=nb, bw=bw, xla=xla: _quant_row(
                              ak[0], ak[1], dt, nb, bw(times), times[xla])))
        _label(jobs, start, f"rht+sr {dname} axis={axis} attribution")
  return jobs


def _gemm_operands(m, k, n, seed=0):
  ka, kb = jax.random.split(jax.random.key(seed))
  a = quantize_nvfp4(_test_input(ka, (m, k), jnp.float32), axis=-1)
  b = quantize_nvfp4(jax.random.normal(kb, (n, k), jnp.float32), axis=-1)
  return a, b


def _gemm_check_shape(cfg: GemmConfig) -> tuple:
  """The mid-size shape a config is checked at: 8 x 4 CTA tiles, K = 1024 (8 promotion chunks)."""
  return 2 * cfg.cta_tile_m * 4, 1024, cfg.cta_tile_n * 4


def _gemm_rel_err(out) -> float:
  """Max abs error / max abs reference of a check job's (kernel f32 output, reference)."""
  got, ref = out
  return float(jnp.max(jnp.abs(got - ref)) / jnp.max(jnp.abs(ref)))


def _gemm_check_ok(err: float) -> bool:
  return bool(np.isfinite(err) and err < 1e-5)


def gemm_jobs(quick: bool = False, shapes: list | None = None, configs: dict | None = None,
              check_shape: tuple | None = None) -> list[Job]:
  """NVFP4 GEMMs vs XLA's bf16 dot (and jax.nn.scaled_dot_general nvfp4).

  Per config, a check: the kernel's f32 output vs nvfp4_gemm_reference (f32
  HIGHEST) at a mid-size shape (`_gemm_check_shape`, or check_shape), fresh
  data; max abs error / max abs reference < 1e-5. Per shape: the bf16 dot (the
  baseline), per config the block-scaled bf16 GEMM on pre-decoded operands and
  nvfp4_gemm with its XLA decode (reported, not timed, when the config's check
  failed), then scaled_dot_general. quick: the first two shapes.
  """
  shapes = list(GEMM_SHAPES if shapes is None else shapes)
  shapes = shapes[:2] if quick else shapes
  configs = GEMM_CONFIGS if configs is None else configs
  jobs, checks = [], {}
  for cname, cfg in configs.items():
    cshape = tuple(check_shape or _gemm_check_shape(cfg))
    a, b = _gemm_operands(*cshape, seed=7)
    checks[cname] = ck = (f"pallas gemm {cname}", cshape)

    def check_row(dt, out, times, ck=ck):
      err = _gemm_rel_err(out)
      return dict(kind="gemm_check", name=ck[0], ok=_gemm_check_ok(err), rel_err=err)

    jobs.append(Job(ck, lambda a, b, cfg=cfg: (nvfp4_gemm(a, b, out_dtype=jnp.float32, config=cfg),
                                               nvfp4_gemm_reference(a, b)),
                    (a, b), timed=False, inner=1, kind="gemm_check", row=check_row))

  _label(jobs, 0, "gemm checks")

  def needs_check(out, outs, ck):
    if ck not in outs:
      return "CHECK FAILED (see the check's row)"
    err = _gemm_rel_err(outs[ck])
    return None if _gemm_check_ok(err) else f"CHECK FAILED (rel_err={err:.2e}, see the check's row)"

  for shape in shapes:
    m, k, n = shape = tuple(shape)
    flops = 2.0 * m * n * k
    a, b = _gemm_operands(m, k, n)
    a_qs, a_so = nvfp4_bf16_operand(a)
    b_qs, b_so = nvfp4_bf16_operand(b)
    xa, xb = jax.random.normal(jax.random.key(3), (m, k), jnp.bfloat16), jax.random.normal(
        jax.random.key(4), (n, k), jnp.bfloat16)
    base = ("xla bf16 dot", shape)

    def job(name, fn, args, flops=flops, shape=shape, base=base, **kw):
      return Job((name, shape), fn, args, kind="gemm", **kw,
                 row=lambda dt, out, times: dict(kind="gemm", name=name, shape=shape, ms=dt * 1e3,
                                                 tflops=flops / dt / 1e12, vs_bf16=times[base] / dt, ok=True))

    jobs.append(job(base[0], lambda x, y: jnp.dot(x, y.T, preferred_element_type=jnp.float32).astype(jnp.bfloat16),
                    (xa, xb)))
    for cname, cfg in configs.items():
      check = lambda out, outs, ck=checks[cname]: needs_check(out, outs, ck)
      jobs += [job(f"pallas block-scaled bf16 gemm {cname}",
                   lambda aq, asc, bq, bsc, cfg=cfg: block_scaled_bf16_gemm(aq, asc, bq, bsc, config=cfg),
                   (a_qs, a_so, b_qs, b_so), check=check),
               job(f"pallas nvfp4_gemm (+XLA decode) {cname}", lambda a, b, cfg=cfg: nvfp4_gemm(a, b, config=cfg),
                   (a, b), check=check)]

    def sdg(x, y):
      cfgs = [jax.nn.get_scaled_dot_general_config("nvfp4")] * 3
      return jax.nn.scaled_dot_general(x, y, (((1,), (1,)), ((), ())), preferred_element_type=jnp.bfloat16,
                                       configs=cfgs)

    jobs.append(job("jax.nn.scaled_dot_general nvfp4", sdg, (xa, xb)))
    _label(jobs, 0, f"gemm {m}x{k}x{n}")
  return jobs


LINEAR_SHAPES = [(16384, 1024, 4096), (16384, 4096, 1024)]  # (M tokens, K in, N out)
LINEAR_GEMMS = ("fast", "pallas")  # gemm modes of the tetrajet_v2 rows ("exact" is a reference, not timed)


def linear_parts(recipe: str, gemm: str):
  """The layer's two halves, callable apart (tetrajet_jax.linear internals, so
  the timing follows the layer's code): quantize(x, w, dy, key) -> the six
  GEMM operands (Q1, Q2 forward; Q3..Q6 backward, with the W_hat / X_hat
  decode the aligned backward re-quantizes), and gemms(*operands) -> (y, dx, dw)
  before the layer's final crops and casts."""
  import importlib  # noqa: PLC0415

  lin = importlib.import_module("tetrajet_jax.linear.linear")  # the package exports a function of that name
  from tetrajet_jax.linear import gemm_nt, recipes  # noqa: PLC0415
  rec = recipes.get(recipe)
  if not rec.aligned_backward or rec.outlier_fraction:
    raise ValueError(f"linear_parts: recipe {recipe!r} not supported (aligned, no OutControl only).")

  def quantize(x, w, dy, key):
    keys = lin._split_keys(key, rec)
    xq = lin._quantize(lin._as_rounded(x), 1, rec, keys, axis=-1, gemm=gemm)
    wq = lin._quantize(w, 2, rec, keys, axis=0, weight=True, gemm=gemm)
    res = lin._Residuals(x_fwd=xq, x_out=None, q6_pre=None, kernel=w, key=key, outlier_idx=None,
                         x_dtype=jnp.zeros((0,), x.dtype))
    ops = lin._backward_operands(rec, gemm, res, lin._as_rounded(dy))
    return xq, wq, ops.a3, ops.b4, ops.a5, ops.b6

  def gemms(xq, wq, a3, b4, a5, b6):
    mm = lambda a, b: gemm_nt(a, b, mode=gemm, out_dtype=jnp.float32)
    return mm(xq, wq), mm(a3, b4), mm(b6, a5)

  return quantize, gemms


def linear_jobs(shapes: list, parts_shapes: list = (), gemms: tuple = LINEAR_GEMMS,
                layers: bool = True) -> list[Job]:
  """TetraJet-v2 linear fwd+bwd (six quantizers) vs the bf16 linear, and where its time goes.

  Per shape: fwd+bwd of bf16 (the baseline), of tetrajet_v2 with gemm="fast"
  and "pallas". Then, per shape of parts_shapes (a subset of shapes: their
  ratios read its bf16 times) and per gemm, the forward alone, the six
  quantizers alone and the three GEMMs alone on their pre-quantized operands
  (`linear_parts`), each vs the same bf16 fwd+bwd. Waves: per shape the XLA
  rows, then the pallas layer alone; then per shape and gemm the attribution.
  gemms picks the modes of the tetrajet_v2 rows; layers=False keeps only the
  bf16 baseline of the whole layer (an attribution-only run: a pallas layer
  wave costs ~130 s of Mosaic compiles on the device host).
  """
  from tetrajet_jax.linear import linear  # noqa: PLC0415 - the layer imports the kernels

  missing = [s for s in parts_shapes if s not in shapes]
  if missing:
    raise ValueError(f"linear_jobs: attribution shapes {missing} are not among the timed shapes {shapes}; "
                     "their ratios need that shape's bf16 fwd+bwd.")

  def step(x, w, dy, key, recipe, gemm):
    y, vjp = jax.vjp(lambda x, w: linear(x, w, recipe=recipe, key=key, gemm=gemm), x, w)
    return y, vjp(dy.astype(y.dtype))

  def inputs(shape):
    m, k, n = shape
    kx, kw, kd = jax.random.split(jax.random.key(5), 3)
    return (jax.random.normal(kx, (m, k), jnp.bfloat16), jax.random.normal(kw, (k, n), jnp.float32) * 0.02,
            jax.random.normal(kd, (m, n), jnp.bfloat16), jax.random.key(0))

  def job(name, shape, fn, args, wave, **kw):
    base = ("linear fwd+bwd bf16 gemm=fast", shape)
    return Job((name, shape), fn, args, kind="linear", inner=5, reps=7, wave=f"{wave} {'x'.join(map(str, shape))}",
               row=lambda dt, out, times: dict(kind="linear", name=name, shape=shape, ms=dt * 1e3,
                                               vs_bf16=dt / times[base], ok=True), **kw)

  data = {tuple(shape): inputs(shape) for shape in shapes}
  jobs = []
  for shape in data:
    arms = [("bf16", "fast")] + [("tetrajet_v2", g) for g in gemms if layers]
    for recipe, gemm in arms:
      jobs.append(job(f"linear fwd+bwd {recipe} gemm={gemm}", shape,
                      lambda x, w, dy, key, recipe=recipe, gemm=gemm: step(x, w, dy, key, recipe, gemm),
                      data[shape], f"linear {'pallas' if gemm == 'pallas' else 'xla'}"))
  for shape in map(tuple, parts_shapes):
    x, w, dy, key = data[shape]
    for gemm in gemms:
      quant, gemm_fn = linear_parts("tetrajet_v2", gemm)
      qname, wave = f"tetrajet_v2 quantizers only (6) gemm={gemm}", f"linear parts {gemm}"
      jobs += [job(f"tetrajet_v2 forward only gemm={gemm}", shape,
                   lambda x, w, key, gemm=gemm: linear(x, w, recipe="tetrajet_v2", key=key, gemm=gemm),
                   (x, w, key), wave),
               job(qname, shape, quant, (x, w, dy, key), wave),
               job(f"tetrajet_v2 GEMMs only (3, pre-quantized) gemm={gemm}", shape, gemm_fn,
                   jax.eval_shape(quant, x, w, dy, key), wave, args_from=(qname, shape))]
  return jobs


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
    def check_text(r):
      if "rel_err" not in r:  # the check itself raised
        return f"{r['name']}: failed: {r.get('error', '')[:80]}"
      return f"{r['name']}: {r['rel_err']:.1e}{'' if r.get('ok') else ' (FAILED)'}"
    checks = [check_text(r) for r in res["rows"] if r.get("kind") == "gemm_check"]
    if checks:
      out += ["GEMM checks before timing (max relative error vs f32 HIGHEST): " + "; ".join(checks) + ".", ""]
  return "\n".join(out)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default="results/kernels_bench.json")
  p.add_argument("--log", default=None, help="traceback log (default: next to --out)")
  p.add_argument("--quick", action="store_true", help="first shapes only")
  p.add_argument("--quant-shapes", default=None, help="quantizer shapes, e.g. 16384x4096,16384x1024")
  p.add_argument("--quant-inputs", default=QUANT_INPUTS[0],
                 help=f"quantizer input kinds, comma-separated subset of {','.join(QUANT_INPUTS)}")
  p.add_argument("--gemm-shapes", default=None, help="GEMM shapes MxKxN (out [M, N]), e.g. 16384x1024x1024")
  p.add_argument("--linear-shapes", default=None, help="linear shapes MxKxN, e.g. 16384x1024x4096")
  p.add_argument("--linear-parts-shapes", default=None,
                 help="shapes of the linear's attribution rows (default: --linear-shapes), a subset of them")
  p.add_argument("--linear-gemms", default=",".join(LINEAR_GEMMS), help="gemm modes of the tetrajet_v2 linear rows")
  p.add_argument("--linear-parts-only", action="store_true",
                 help="skip the tetrajet_v2 whole-layer rows (the bf16 baseline stays): attribution only")
  sections = ("quant", "bwdquant", "gemm", "linear")
  p.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(sections)}")
  p.add_argument("--table", nargs="+", metavar="JSON", default=None,
                 help="print saved results (JSON files written by --out) as markdown tables and exit")
  args = p.parse_args(argv)
  if args.table:
    print(markdown_tables([json.loads(Path(f).read_text()) for f in args.table]))
    return 0
  def subset(flag: str, value: str, valid: tuple) -> tuple:
    out = tuple(value.split(","))
    bad = sorted(set(out) - set(valid))
    if bad:
      p.error(f"{flag}: unknown {bad}; expected a comma-separated subset of {','.join(valid)}")
    return out
  def shapes(flag: str, value: str | None, default: list, dims: int) -> list:
    if not value:
      return default
    try:
      out = [tuple(int(d) for d in s.split("x")) for s in value.split(",")]
    except ValueError:
      out = []
    if not out or any(len(t) != dims for t in out):
      p.error(f"{flag}: expected {dims} sizes joined by 'x', comma-separated, got {value!r}")
    return out
  quant_shapes = shapes("--quant-shapes", args.quant_shapes, QUANT_SHAPES, 2)
  gemm_shapes = shapes("--gemm-shapes", args.gemm_shapes, GEMM_SHAPES, 3)
  linear_shapes = shapes("--linear-shapes", args.linear_shapes, LINEAR_SHAPES, 3)
  linear_parts_shapes = shapes("--linear-parts-shapes", args.linear_parts_shapes, linear_shapes, 3)
  if not set(linear_parts_shapes) <= set(linear_shapes):
    p.error("--linear-parts-shapes: every shape must also be in --linear-shapes (the ratios need its bf16 row)")
  only = None if args.only is None else subset("--only", args.only, sections)
  quant_inputs = subset("--quant-inputs", args.quant_inputs, QUANT_INPUTS)
  linear_gemms = subset("--linear-gemms", args.linear_gemms, LINEAR_GEMMS)
  if args.quick:
    quant_shapes = quant_shapes[:1]
  dev = jax.devices()[0]
  header = dict(commit=commit_id(), device=getattr(dev, "device_kind", str(dev)), jax=jax.__version__,
                date=time.strftime("%Y-%m-%d %H:%M:%S"))
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  rows = Rows(header, args.out)
  with open(args.log or os.path.splitext(args.out)[0] + ".log", "w") as log:
    for section, fn in (("quant", lambda: run_jobs(rows, log, quantizer_jobs(quant_shapes, quant_inputs))),
                        ("bwdquant", lambda: run_jobs(rows, log, backward_quantizer_jobs(quant_shapes, quant_inputs))),
                        ("gemm", lambda: run_jobs(rows, log, gemm_jobs(args.quick, gemm_shapes))),
                        ("linear", lambda: run_jobs(rows, log, linear_jobs(
                            linear_shapes, linear_parts_shapes, linear_gemms, not args.linear_parts_only)))):
      if only is None or section in only:
        print(f"--- {section}", flush=True)
        fn()
  print("=" * 30, "summary")
  print(json.dumps(header))
  print(format_table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
