"""GEMM section: the Pallas NVFP4 GEMM per tile config vs XLA's bf16 dot (each config checked first)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench.jobs import Job, _label
from experiments.bench.quantizers import _test_input
from tetrajet_jax.kernels.nvfp4_gemm import (OVERLAP_CONFIG, WIDE_CONFIG, GemmConfig, block_scaled_bf16_gemm,
                                             nvfp4_gemm, nvfp4_gemm_reference)
from tetrajet_jax.numerics import nvfp4_bf16_operand, quantize_nvfp4

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
    "t128x64_s2_pairs": GemmConfig(tile_m=128, tile_n=64, max_concurrent_steps=2, cluster_m=True),
    "t128x64_k64_s4": GemmConfig(tile_m=128, tile_n=64, max_concurrent_steps=4, k_step=64),
    "t128x64_k64_s4_pairs": GemmConfig(tile_m=128, tile_n=64, max_concurrent_steps=4, k_step=64, cluster_m=True),
    "t128x128_k64_s3_rows64": WIDE_CONFIG,  # the layer's TETRAJET_GEMM_TILING=wide
    "t128x64_s2_overlap": OVERLAP_CONFIG,  # the layer's TETRAJET_GEMM_TILING=overlap
}
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
