"""Quantizer sections: the fused RTN and RHT + SR kernels vs the same-run copy and the XLA quantizer."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench.copy_kernel import copy_fns
from experiments.bench.jobs import Job, _label, _nbytes, _same_bits, _tensors_equal, code_agreement
from tetrajet_jax.kernels.nvfp4_quantize import quantize_nvfp4_rtn
from tetrajet_jax.kernels.nvfp4_quantize_backward import quantize_nvfp4_backward
from tetrajet_jax.kernels.nvfp4_quantize_triton import (quantize_nvfp4_backward_triton, quantize_nvfp4_rtn_triton,
                                                        requantize_nvfp4_backward_triton)
from tetrajet_jax.numerics import (decode_e2m1, dequantize_nvfp4_canonical, hadamard_signs, nvfp4_bf16_operand,
                                   quantize_nvfp4, random_hadamard_16, unpack_e2m1)
from tetrajet_jax.numerics.counter_rng import sr_seed

# One quantizer shape: every kernel variant costs 20-40 s of Mosaic compile on
# the GPU host, and (16384, 1024) ranked the variants the same way
# (docs/KERNELS.md); pass --quant-shapes to time others.
QUANT_SHAPES = [(16384, 4096)]


QUANT_INPUTS = ("lognormal", "normal")
# Row-name prefixes of the baselines every quantizer row is a ratio to.
QUANT_BASELINES = ("copy", "xla ")


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


# The default kernel lowered under Mosaic GPU's lane semantics (`kernels._platform.quantizer_params`):
# faster to lower; these rows check it bitwise against the default and time it.
LANE_SUFFIX = " lane semantics"
DENSE_SUFFIX = " dense transform (SMEM tile)"
REGISTERS_SUFFIX = " tiles from registers (unrolled, larger module)"
# The Pallas Triton quantizers' tilings (`kernels.nvfp4_quantize_triton`): (rows per program, warps).
TRITON_TILINGS = ((16, 2), (32, 4), (64, 4), (64, 8))


def _same_as(ref_key):
  """A variant that must be bitwise the default kernel's output (ref_key's)."""
  def check(out, outs):
    return None if ref_key in outs and _tensors_equal(out, outs[ref_key]) else \
        f"MISMATCH vs {' '.join(map(str, ref_key))}"
  return check


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


def _tiling_jobs(exact_key, tilings, make, args, nb, bw, xla) -> list[Job]:
  """The default kernel (exact_key) under other tilings: `make(rows, steps)` is the kernel with
  that many rows per tile and that TMA pipeline depth; each row is checked bitwise against the
  default's output before it is timed (the tiling changes no result)."""
  jobs = []
  for rows, steps in tilings:
    key = (exact_key[0].replace(" rows64_s2", "") + f" rows{rows}_s{steps}", exact_key[1])
    jobs.append(Job(key, make(rows, steps), args, check=_same_as(exact_key),
                    row=lambda dt, out, times, key=key, nb=nb, bw=bw, xla=xla: _quant_row(
                        key[0], key[1], dt, nb, bw(times), times[xla])))
  return jobs


def quantizer_jobs(shapes: list, inputs: tuple = QUANT_INPUTS[:1], tilings: tuple = ()) -> list[Job]:
  """RTN quantizers: the same-run copy (baseline), the XLA quantizer, the
  Pallas kernel (bitwise vs XLA), with its bf16 operand, and its attribution,
  per input kind (`_test_input`); `tilings` (rows, pipeline steps) adds the
  default kernel under each, checked bitwise against it."""
  jobs = []
  for shape, kind, dtype in itertools.product(shapes, inputs, (jnp.bfloat16, jnp.float32)):
    start = len(jobs)
    x = _test_input(jax.random.key(1), shape, dtype, kind)
    dname = _input_name(dtype, kind)
    copies = [((f"copy ({how}) {dname}", shape), op) for how, op in copy_fns(x)]
    xla = (f"xla quantize_nvfp4 {dname}", shape)
    out_bytes = _nbytes(jax.eval_shape(lambda v: quantize_nvfp4(v, axis=-1), x))
    nb = x.nbytes + out_bytes
    bw = lambda times, copies=copies, x=x: 2 * x.nbytes / min(times[c] for c, _ in copies if c in times)
    jobs += [Job(c, op, (x,)) for c, op in copies]
    jobs += [
             Job(xla, lambda v: quantize_nvfp4(v, axis=-1), (x,),
                 row=lambda dt, out, times, xla=xla, nb=nb, bw=bw: _quant_row(
                     *xla, dt, nb, bw(times), dt, copy_gbps=bw(times) / 1e9))]
    # block_rows=128 measured 1.4-2x slower at every shape and dtype
    # (docs/KERNELS.md): not re-timed.
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
    exact = (f"pallas rtn {dname} rows64_s2", shape)
    lane = (exact[0] + LANE_SUFFIX, shape)
    jobs.append(Job(lane, lambda v: quantize_nvfp4_rtn(v, _semantics="lane"), (x,), check=_same_as(exact),
                    row=lambda dt, out, times, lane=lane, nb=nb, bw=bw, xla=xla: _quant_row(
                        lane[0], lane[1], dt, nb, bw(times), times[xla])))
    jobs += _tiling_jobs(exact, tilings, lambda rows, steps: lambda v: quantize_nvfp4_rtn(
        v, block_rows=rows, max_concurrent_steps=steps), (x,), nb, bw, xla)
    for rows, warps in TRITON_TILINGS:  # bitwise the XLA quantizer, like the Mosaic kernel
      key = (f"triton rtn {dname} rows{rows}_w{warps}", shape)
      jobs.append(Job(key, lambda v, rows=rows, warps=warps: quantize_nvfp4_rtn_triton(
          v, block_rows=rows, num_warps=warps), (x,), check=_same_as(xla),
          row=lambda dt, out, times, key=key, nb=nb, bw=bw, xla=xla: _quant_row(
              key[0], key[1], dt, nb, bw(times), times[xla])))
    _label(jobs, start, f"rtn {dname}")
    if dtype == jnp.bfloat16:
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


def _q6_jobs(x, dname: str, shape, signs, bw, xla) -> list[Job]:
  """TetraJet-v2's Q6 of X_hat = Q1(x) dequantized, along tokens, both ways the layer can run it:
  an XLA decode writing float32 X_hat, then the Triton columns kernel; or the kernel reading Q1's
  codes and scales (bitwise the first). Bytes: what each reads and writes in HBM."""
  t = quantize_nvfp4(x, axis=-1)
  seed = sr_seed(jax.random.key(12))
  decoded = (f"triton rht+sr {dname} axis=0 on XLA-decoded X_hat", shape)
  from_codes = (f"triton rht+sr {dname} axis=0 from Q1 codes", shape)
  out = jax.eval_shape(lambda v: quantize_nvfp4_backward_triton(v, signs, seed, axis=0), x)
  out_bytes = _nbytes((out.codes, out.scale_inner, out.scale_outer))
  q1_bytes = _nbytes((t.codes, t.scale_inner, t.scale_outer))
  row = lambda key, nb: lambda dt, out, times: _quant_row(key[0], key[1], dt, nb, bw(times), times[xla])
  return [Job(decoded, lambda t, sg, sd: quantize_nvfp4_backward_triton(dequantize_nvfp4_canonical(t), sg, sd, axis=0),
              (t, signs, seed), row=row(decoded, q1_bytes + 2 * x.nbytes + out_bytes)),
          Job(from_codes, lambda t, sg, sd: requantize_nvfp4_backward_triton(t, sg, sd, rows=x.shape[0]),
              (t, signs, seed), check=_same_as(decoded), row=row(from_codes, q1_bytes + out_bytes))]


def _operand_jobs(x, dname: str, shape, axis: int, signs, bw, xla) -> list[Job]:
  """The two ways a backward GEMM operand reaches the GEMM (TETRAJET_BACKWARD_OPERANDS): the Triton
  kernel's codes, then XLA's decode to the bf16 operand; or the kernel writing that operand itself
  (checked bitwise against the first). Bytes: what each reads and writes in HBM."""
  seed = sr_seed(jax.random.key(12))
  decoded = (f"triton rht+sr {dname} axis={axis}, then the XLA decode to the bf16 GEMM operand", shape)
  operand = (f"triton rht+sr {dname} axis={axis} writing the bf16 GEMM operand", shape)
  t = jax.eval_shape(lambda v: quantize_nvfp4_backward_triton(v, signs, seed, axis=axis), x)
  values, s_out = jax.eval_shape(nvfp4_bf16_operand, t)
  t_bytes, op_bytes = _nbytes((t.codes, t.scale_inner, t.scale_outer)), values.size * 2 + s_out.size * 4

  def same_as_decoded(out, outs):
    want = outs.get(decoded)
    return None if want is not None and all(map(_same_bits, (out.values, out.scale_outer), want)) else \
        f"MISMATCH vs {decoded[0]}"
  row = lambda key, nb: lambda dt, out, times: _quant_row(key[0], key[1], dt, nb, bw(times), times[xla])
  return [Job(decoded, lambda v, sg, sd: nvfp4_bf16_operand(quantize_nvfp4_backward_triton(v, sg, sd, axis=axis)),
              (x, signs, seed), row=row(decoded, x.nbytes + 2 * t_bytes + op_bytes)),
          Job(operand, lambda v, sg, sd: quantize_nvfp4_backward_triton(v, sg, sd, axis=axis, operand=True),
              (x, signs, seed), check=same_as_decoded, row=row(operand, x.nbytes + op_bytes))]


def backward_quantizer_jobs(shapes: list, inputs: tuple = QUANT_INPUTS[:1], tilings: tuple = ()) -> list[Job]:
  """RHT-16 + SR quantizers (Q3..Q6) along the last axis and along the first
  axis: copy, XLA (RHT then quantize_nvfp4 SR), a check of the kernel on a
  slice, the kernel with and without its bf16 operand, other `tilings` (as
  `quantizer_jobs`), and (bf16, axis -1) its attribution, checked against
  the exact kernel's codes."""
  key = jax.random.key(11)
  signs = hadamard_signs(key)
  jobs = []
  for shape, kind, dtype in itertools.product(shapes, inputs, (jnp.bfloat16, jnp.float32)):
    start = len(jobs)  # the copy joins the first axis's wave
    x = _test_input(jax.random.key(2), shape, dtype, kind)
    dname = _input_name(dtype, kind)
    copies = [((f"copy ({how}) {dname}", shape), op) for how, op in copy_fns(x)]
    bw = lambda times, copies=copies, x=x: 2 * x.nbytes / min(times[c] for c, _ in copies if c in times)
    jobs += [Job(c, op, (x,)) for c, op in copies]
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
      jobs.append(Job(checked, lambda v, axis=axis: quantize_nvfp4_backward(
          v, signs, jnp.uint32(3), axis=axis, emit_transformed=True), (xs,), timed=False, inner=1,
          check=lambda out, outs, xs=xs, axis=axis: check_backward_output(xs, *out, key, axis)))

      def needs_check(out, outs, checked=checked):
        return None if checked in outs else "CHECK FAILED (see the check's row)"

      for emit in (False, True):
        pk = (f"pallas rht+sr {dname} axis={axis}{' +operand' if emit else ''}", shape)
        jobs.append(Job(pk, lambda v, sg, sd, axis=axis, emit=emit: quantize_nvfp4_backward(
            v, sg, sd, axis=axis, emit_operand=emit), (x, signs, jnp.uint32(4)), check=needs_check,
            row=lambda dt, out, times, pk=pk, nb=nb, bw=bw, xla=xla, emit=emit: _quant_row(
                pk[0], pk[1], dt, nb + (out[1].nbytes if emit else 0), bw(times), times[xla])))
      _label(jobs, start, f"rht+sr {dname} axis={axis}")
      exact = (f"pallas rht+sr {dname} axis={axis}", shape)
      # Variants, each bitwise the default: the quantizer reading the dense wgmma accumulator in
      # registers, unrolled (what the SMEM round trip of the transformed tile costs); the dense
      # [128, 128] transform with its tile written back to SMEM (the default before the per-block
      # transform); lane semantics.
      for suffix, knobs in ((REGISTERS_SUFFIX, dict(_tile_source="registers")),
                            (DENSE_SUFFIX, dict(_tile_source="smem")), (LANE_SUFFIX, dict(_semantics="lane"))):
        vk = (exact[0] + suffix, shape)
        jobs.append(Job(vk, lambda v, sg, sd, axis=axis, knobs=knobs: quantize_nvfp4_backward(v, sg, sd, axis=axis,
                                                                                             **knobs),
                        (x, signs, jnp.uint32(4)), check=_same_as(exact),
                        row=lambda dt, out, times, vk=vk, nb=nb, bw=bw, xla=xla: _quant_row(
                            vk[0], vk[1], dt, nb, bw(times), times[xla])))
      jobs += _tiling_jobs(exact, tilings, lambda rows, steps, axis=axis: lambda v, sg, sd: quantize_nvfp4_backward(
          v, sg, sd, axis=axis, block=rows, max_concurrent_steps=steps), (x, signs, jnp.uint32(4)), nb, bw, xla)
      # The Triton kernel runs the XLA path's RHT operations in order: bitwise the XLA row (same signs
      # and SR seed).
      for rows, warps in TRITON_TILINGS:
        tk = (f"triton rht+sr {dname} axis={axis} rows{rows}_w{warps}", shape)
        jobs.append(Job(tk, lambda v, sg, sd, axis=axis, rows=rows, warps=warps: quantize_nvfp4_backward_triton(
            v, sg, sd, axis=axis, block_rows=rows, num_warps=warps), (x, signs, sr_seed(jax.random.key(12))),
            check=_same_as(xla), row=lambda dt, out, times, tk=tk, nb=nb, bw=bw, xla=xla: _quant_row(
                tk[0], tk[1], dt, nb, bw(times), times[xla])))
      jobs += _operand_jobs(x, dname, shape, axis, signs, bw, xla)
      if dtype == jnp.float32 and axis == 0:
        jobs += _q6_jobs(x, dname, shape, signs, bw, xla)
      if dtype == jnp.bfloat16 and axis == -1:
        for suffix, knobs in ATTRIBUTION:
          ak = (exact[0] + suffix, shape)
          jobs.append(Job(ak, lambda v, sg, sd, knobs=knobs: quantize_nvfp4_backward(v, sg, sd, **knobs),
                          (x, signs, jnp.uint32(4)),
                          check=_inexact_check(exact) if "_division" in knobs else needs_check,
                          row=lambda dt, out, times, ak=ak, nb=nb, bw=bw, xla=xla: _quant_row(
                              ak[0], ak[1], dt, nb, bw(times), times[xla])))
        _label(jobs, start, f"rht+sr {dname} axis={axis} attribution")
  return jobs
