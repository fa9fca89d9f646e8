"""Linear-layer section: TetraJet-v2 fwd+bwd vs the bf16 layer, and where its time goes."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from experiments.bench.jobs import Job
from tetrajet_jax.linear import gemm_nt, layer, linear, recipes

LINEAR_SHAPES = [(16384, 1024, 4096), (16384, 4096, 1024)]  # (M tokens, K in, N out)
# Backends of the tetrajet_v2 rows ("reference" is a test reference, not timed): XLA alone, and
# the Pallas kernels where they run ("auto"; "pallas" raises where one cannot).
LINEAR_BACKENDS = ("xla", "auto", "pallas")
DEFAULT_LINEAR_BACKENDS = ("xla", "auto")


def linear_parts(recipe: str, backend: str):
  """The layer's two halves, callable apart (tetrajet_jax.linear.layer
  internals, so the timing follows the layer's code): quantize(x, w, dy, key)
  -> the six GEMM operands (Q1, Q2 forward; Q3..Q6 backward, with the W_hat /
  X_hat decode the aligned backward re-quantizes), and gemms(*operands) ->
  (y, dx, dw) before the layer's final crops and casts."""
  lin = layer
  rec = recipes.get(recipe, backend=backend)
  if not rec.aligned_backward or rec.outlier_fraction:
    raise ValueError(f"linear_parts: recipe {recipe!r} not supported (aligned, no OutControl only).")

  def quantize(x, w, dy, key):
    keys = lin._split_keys(key, rec)
    xq = lin._quantize(lin._as_rounded(x), 1, rec, keys, axis=-1, backend=backend)
    wq = lin._quantize(w, 2, rec, keys, axis=0, weight=True, backend=backend)
    res = lin._Residuals(x_fwd=xq, x_out=None, q6_pre=None, kernel=w, key=key, split=None,
                         x_dtype=jnp.zeros((0,), x.dtype))
    ops = lin._backward_operands(rec, res, lin._as_rounded(dy))
    return xq, wq, ops.a3, ops.b4, ops.a5, ops.b6

  def gemms(xq, wq, a3, b4, a5, b6):
    mm = lambda a, b: gemm_nt(a, b, backend=backend, out_dtype=jnp.float32)
    return mm(xq, wq), mm(a3, b4), mm(b6, a5)

  return quantize, gemms


def linear_jobs(shapes: list, parts_shapes: list = (), backends: tuple = DEFAULT_LINEAR_BACKENDS,
                layers: bool = True) -> list[Job]:
  """TetraJet-v2 linear fwd+bwd (six quantizers) vs the bf16 linear, and where its time goes.

  Per shape: fwd+bwd of bf16 (the baseline), of tetrajet_v2 per backend
  (default "xla" and "auto"). Then, per shape of parts_shapes (a subset of
  shapes: their ratios read its bf16 times) and per backend, the forward alone, the six
  quantizers alone and the three GEMMs alone on their pre-quantized operands
  (`linear_parts`), each vs the same bf16 fwd+bwd. Waves: per shape the XLA
  rows, then the kernel layer alone; then per shape and backend the attribution.
  backends picks the backends of the tetrajet_v2 rows; layers=False keeps only
  the bf16 baseline of the whole layer (an attribution-only run: a kernel
  layer wave takes minutes of Mosaic compiles).
  """
  missing = [s for s in parts_shapes if s not in shapes]
  if missing:
    raise ValueError(f"linear_jobs: attribution shapes {missing} are not among the timed shapes {shapes}; "
                     "their ratios need that shape's bf16 fwd+bwd.")

  def step(x, w, dy, key, recipe, backend):
    y, vjp = jax.vjp(lambda x, w: linear(x, w, recipe=recipes.get(recipe, backend=backend), key=key), x, w)
    return y, vjp(dy.astype(y.dtype))

  def inputs(shape):
    m, k, n = shape
    kx, kw, kd = jax.random.split(jax.random.key(5), 3)
    return (jax.random.normal(kx, (m, k), jnp.bfloat16), jax.random.normal(kw, (k, n), jnp.float32) * 0.02,
            jax.random.normal(kd, (m, n), jnp.bfloat16), jax.random.key(0))

  def job(name, shape, fn, args, wave, **kw):
    base = ("linear fwd+bwd bf16 backend=xla", shape)
    return Job((name, shape), fn, args, kind="linear", inner=5, reps=7, wave=f"{wave} {'x'.join(map(str, shape))}",
               row=lambda dt, out, times: dict(kind="linear", name=name, shape=shape, ms=dt * 1e3,
                                               vs_bf16=dt / times[base], ok=True), **kw)

  data = {tuple(shape): inputs(shape) for shape in shapes}
  jobs = []
  for shape in data:
    arms = [("bf16", "xla")] + [("tetrajet_v2", b) for b in backends if layers]
    for recipe, backend in arms:
      jobs.append(job(f"linear fwd+bwd {recipe} backend={backend}", shape,
                      lambda x, w, dy, key, recipe=recipe, backend=backend: step(x, w, dy, key, recipe, backend),
                      data[shape], f"linear {'xla' if backend == 'xla' else 'pallas'}"))
  for shape in map(tuple, parts_shapes):
    x, w, dy, key = data[shape]
    for backend in backends:
      quant, gemm_fn = linear_parts("tetrajet_v2", backend)
      qname, wave = f"tetrajet_v2 quantizers only (6) backend={backend}", f"linear parts {backend}"
      rec = recipes.get("tetrajet_v2", backend=backend)
      jobs += [job(f"tetrajet_v2 forward only backend={backend}", shape,
                   lambda x, w, key, rec=rec: linear(x, w, recipe=rec, key=key), (x, w, key), wave),
               job(qname, shape, quant, (x, w, dy, key), wave),
               job(f"tetrajet_v2 GEMMs only (3, pre-quantized) backend={backend}", shape, gemm_fn,
                   jax.eval_shape(quant, x, w, dy, key), wave, args_from=(qname, shape))]
  return jobs
