"""The quantized linear layer against independent references (docs/SPEC.md sections 2, 4, 5)."""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.extend.core as jcore
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import tetrajet_jax as tj
from tetrajet_jax.linear import gemm_nt, interpret_kernels, outlier_count, recipes, residual_bytes_per_token
from tests import layer_stages
from tests import linear_reference as lref
from tests import numpy_reference as ref

QUANT_RECIPES = ["nvidia_nvfp4", "tetrajet_v2", "tetrajet_v2_outcontrol", "tetrajet_v2_no_rht"]


def rel_err(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@functools.partial(jax.jit, static_argnames=("recipe", "backend"))
def grads(recipe, x, w, dy, key, backend="reference", outlier_idx=None):
  f = lambda x, w: tj.linear(x, w, recipe=recipes.get(recipe, backend=backend), key=key, outlier_idx=outlier_idx)
  y, vjp = jax.vjp(f, x, w)
  return (y, *vjp(dy.astype(y.dtype)))


def record_kernel_calls(monkeypatch, names, describe) -> list:
  """Wraps each named function of `tetrajet_jax.kernels` so that every call, then run as before,
  first appends describe(name, args, kwargs) to the returned list."""
  from tetrajet_jax import kernels  # noqa: PLC0415

  calls = []
  for name in names:
    def run(*args, name=name, fn=getattr(kernels, name), **kwargs):
      calls.append(describe(name, args, kwargs))
      return fn(*args, **kwargs)
    monkeypatch.setattr(kernels, name, run)
  return calls


def test_bf16_recipe_is_a_plain_dot(rng):
  x = jnp.asarray(rng.standard_normal((4, 8, 96)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((96, 40)), jnp.float32)
  y = jax.jit(lambda x, w: tj.linear(x, w, recipe="bf16"))(x, w)
  want = jnp.dot(x, w.astype(jnp.bfloat16), preferred_element_type=jnp.float32).astype(jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(want, np.float32))
  gx, gw = jax.grad(lambda x, w: jnp.sum(tj.linear(x, w, recipe="bf16").astype(jnp.float32)), (0, 1))(x, w)
  chex.assert_shape([gx, gw], [x.shape, w.shape])


@pytest.mark.parametrize("heavy", [False, True])
def test_tetrajet_forward_matches_reference(rng, heavy):
  draw = (lambda s: rng.standard_t(2.5, s)) if heavy else rng.standard_normal
  x = draw((200, 256)).astype(np.float32)
  w = (draw((256, 384)) * 0.05).astype(np.float32)
  y = jax.jit(lambda x, w: tj.linear(x, w, recipe=recipes.get("tetrajet_v2", backend="reference"),
                                     key=jax.random.key(0)))(jnp.asarray(x), jnp.asarray(w))
  want = lref.tetrajet_forward(x, w)
  # y is bf16: within bf16 rounding of the FP32-accumulated exact product.
  np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=2**-8, atol=1e-6 * np.abs(want).max())


def test_nvidia_forward_matches_reference(rng):
  x = rng.standard_normal((64, 128)).astype(np.float32)
  w = (rng.standard_normal((128, 256)) * 0.05).astype(np.float32)
  y = tj.linear(jnp.asarray(x), jnp.asarray(w), recipe=recipes.get("nvidia_nvfp4", backend="reference"),
                key=jax.random.key(0))
  cx, sx, ox = ref.nvfp4_tensor(x)
  x_hat = ref.decode_codes(cx) * np.repeat(sx.astype(np.float64), 16, -1) * float(ox)
  cw, sw, ow = ref.nvfp4_tensor_2d(w.T)  # W [N, K] in 16x16 tiles
  w_hat = ref.decode_codes(cw) * np.repeat(np.repeat(sw.astype(np.float64), 16, 0), 16, 1) * float(ow)
  want = x_hat @ w_hat.T
  np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=2**-8, atol=1e-6 * np.abs(want).max())


def test_tetrajet_backward_matches_reference_with_fixed_key(rng, key):
  m = 200  # not a multiple of 128: exercises the token padding of Q5/Q6
  x = rng.standard_normal((m, 128)).astype(np.float32)
  w = (rng.standard_normal((128, 256)) * 0.05).astype(np.float32)
  dy = rng.standard_normal((m, 256)).astype(np.float32)
  # dy is float32 and becomes the bf16 cotangent inside the jit: on the GPU this
  # also checks that the layer quantizes the bf16 values (see linear._as_rounded).
  _, dx, dw = jax.jit(lambda *a: grads("tetrajet_v2", *a))(jnp.asarray(x), jnp.asarray(w), jnp.asarray(dy), key)
  dy_seen = np.asarray(jnp.asarray(dy, jnp.bfloat16).astype(jnp.float32))  # y's cotangent is bf16
  want_ops = {}
  want_dx, want_dw = lref.tetrajet_backward(x, w, dy_seen, key, operands=want_ops)
  # Operand by operand first, so a failure names the stage where it starts.
  got_ops = jax.jit(lambda *a: layer_stages.backward_operands(*a, key))(jnp.asarray(x), jnp.asarray(w),
                                                                        jnp.asarray(dy_seen))
  for name in ("a3", "b4", "a5", "b6"):
    op = got_ops[name]
    got = np.asarray(tj.dequantize(op), np.float64)
    got = got.T if op.axis == 0 else got  # the reference holds axis-0 operands transposed
    want = want_ops[name]
    # Dequantization rounds q * s_in * s_out in float32 (the reference: in
    # float64); a different code or scale moves a value by >= 1/16 of it.
    bad = np.abs(got - want) > 1e-6 * np.abs(want)
    assert not bad.any(), (f"operand {name}: {int(bad.sum())} of {bad.size} values differ from the reference, "
                           f"first at {np.argwhere(bad)[0].tolist()}: {got[bad][0]!r} vs {want[bad][0]!r}")
  assert rel_err(dx, want_dx) < 1e-5
  assert rel_err(dw, want_dw) < 1e-5
  # And it is an FP4 estimate, not the exact gradient.
  assert rel_err(dw, x.T @ dy_seen) > 1e-3


def test_backward_is_unbiased(rng, key):
  """Mean over keys of dX, dW approaches dY W_hat and X_hat^T dY.

  Per-element z-test of the sample mean (n = 256 keys) against the target,
  with the sample standard deviation; |z| < 6 for all 2 x 16384 elements has
  a false-alarm rate below 2 * 16384 * 2e-9 ~ 7e-5 (normal approximation).
  """
  m, k, n = 128, 128, 128
  x = rng.standard_t(3.0, (m, k)).astype(np.float32)
  w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
  dy = np.asarray(jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16).astype(jnp.float32))
  x_hat = lref.fake_quant_block(x)
  w_hat = lref.fake_quant_block(w.T).T
  keys = jax.random.split(key, 256)

  def sample(recipe):
    fn = jax.jit(jax.vmap(lambda kk: grads(recipe, jnp.asarray(x), jnp.asarray(w), jnp.asarray(dy), kk)[1:]))
    dx, dw = fn(keys)
    return np.asarray(dx, np.float64), np.asarray(dw, np.float64)

  def zmax(samples, target):
    se = samples.std(0, ddof=1) / np.sqrt(samples.shape[0])
    return np.max(np.abs(samples.mean(0) - target) / np.maximum(se, 1e-12))

  dx, dw = sample("tetrajet_v2")
  assert zmax(dx, dy @ w_hat.T) < 6.0
  assert zmax(dw, x_hat.T @ dy) < 6.0
  # Re-quantizing the raw X (not X_hat) estimates X^T dY instead: biased for
  # the computation the forward did.
  biased = dataclasses.replace(recipes.TETRAJET_V2, name="raw_requant", aligned_backward=False)
  _, dw_raw = sample(biased)
  assert zmax(dw_raw, x_hat.T @ dy) > 10.0


def test_outlier_split(rng, key):
  k, n, m = 384, 256, 64
  x = rng.standard_normal((m, k)).astype(np.float32)
  x[:, [5, 77, 300]] *= 50.0  # outlier channels
  w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
  xj, wj = jnp.asarray(x), jnp.asarray(w)
  fwd = jax.jit(lambda r, i: tj.linear(xj, wj, recipe=recipes.get(r, backend="reference"), key=key, outlier_idx=i),
                static_argnums=0)
  pure = fwd("tetrajet_v2_outcontrol", None)
  empty = fwd("tetrajet_v2_outcontrol", jnp.zeros((0,), jnp.int32))
  base = fwd("tetrajet_v2", None)
  np.testing.assert_array_equal(np.asarray(pure, np.float32), np.asarray(empty, np.float32))
  np.testing.assert_array_equal(np.asarray(pure, np.float32), np.asarray(base, np.float32))
  idx = np.sort(np.r_[[5, 77, 300], np.setdiff1d(np.arange(k), [5, 77, 300])[:125]]).astype(np.int32)
  rest = np.setdiff1d(np.arange(k), idx)
  y = fwd("tetrajet_v2_outcontrol", jnp.asarray(idx))
  # Reference: FP4 on the other channels + MXFP8 on the chosen ones.
  dx, ex = ref.mxfp8(x[:, idx])
  xo = dx * np.repeat(np.exp2(ex), 32, -1)
  dwq, ew = ref.mxfp8(w[idx].T)
  wo = dwq * np.repeat(np.exp2(ew), 32, -1)
  want = lref.tetrajet_forward(x[:, rest], w[rest]) + xo.astype(np.float64) @ wo.T.astype(np.float64)
  np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=2**-8, atol=1e-6 * np.abs(want).max())
  # With the outliers in MXFP8 the forward error drops (that is the point).
  exact = x.astype(np.float64) @ w
  assert rel_err(y, exact) < rel_err(pure, exact)
  # dW rows of outlier channels are MXFP8 x MXFP8 (deterministic: no SR, no RHT).
  _, _, dw1 = grads("tetrajet_v2_outcontrol", xj, wj, jnp.ones((m, n)), jax.random.key(1), outlier_idx=jnp.asarray(idx))
  _, _, dw2 = grads("tetrajet_v2_outcontrol", xj, wj, jnp.ones((m, n)), jax.random.key(2), outlier_idx=jnp.asarray(idx))
  np.testing.assert_array_equal(np.asarray(dw1)[idx], np.asarray(dw2)[idx])
  assert np.any(np.asarray(dw1)[rest] != np.asarray(dw2)[rest])


def test_fast_gemm_deviation_from_exact(rng, key):
  x = jnp.asarray(rng.standard_normal((256, 512)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((512, 256)) * 0.05, jnp.float32)
  dy = jnp.asarray(rng.standard_normal((256, 256)), jnp.float32)
  for recipe in ("nvidia_nvfp4", "tetrajet_v2"):
    e = grads(recipe, x, w, dy, key, backend="reference")
    f = grads(recipe, x, w, dy, key, backend="xla")
    for a, b in zip(f, e):
      # bf16 operands (block scaling) round q*s_in*s_out: <= 2^-9 per element.
      assert rel_err(a, b) < 4e-3, recipe
  # Tensor scaling (NVIDIA) products are exact in the fast path: forward matches
  # exact up to accumulation order and bf16 output rounding.
  ya = grads("nvidia_nvfp4", x, w, dy, key, backend="xla")[0]
  yb = grads("nvidia_nvfp4", x, w, dy, key, backend="reference")[0]
  assert rel_err(ya, yb) < 2e-3


def _dot_operand_sources(jaxpr) -> list[tuple[set, set]]:
  """For each dot_general: ancestors of its operands, cutting the graph at
  narrow-typed values (FP4 codes / FP8) and at reductions (scales come from
  amax): what remains reachable is high-precision data flowing straight in."""
  producers = {}
  dots = []
  consts = set(jaxpr.jaxpr.constvars)  # lookup tables (the E2M1 grid), not data

  def walk(jx, env):
    for eqn in jx.eqns:
      subs = [p for p in eqn.params.values() if isinstance(p, (jcore.ClosedJaxpr, jcore.Jaxpr))]
      if subs:
        sub = subs[0].jaxpr if isinstance(subs[0], jcore.ClosedJaxpr) else subs[0]
        consts.update(sub.constvars)
        inner_env = {iv: env.get(ov, ov) if not isinstance(ov, jcore.Literal) else None
                     for iv, ov in zip(sub.invars, eqn.invars)}
        walk(sub, inner_env)
        for ov, iv in zip(eqn.outvars, sub.outvars):
          env[ov] = inner_env.get(iv, iv)
        continue
      ins = [env.get(v, v) for v in eqn.invars if not isinstance(v, jcore.Literal)]
      for ov in eqn.outvars:
        producers[ov] = (eqn.primitive.name, ins, ov.aval)
      if eqn.primitive.name == "dot_general":
        dots.append(ins)

  walk(jaxpr.jaxpr, {})
  narrow = {jnp.dtype(jnp.uint8), jnp.dtype(jnp.float8_e4m3fn)}

  def leaks(v, seen):
    if v is None or v in seen or v in consts:
      return set()
    seen.add(v)
    if v not in producers:
      return {v}  # an input of the whole computation
    prim, ins, aval = producers[v]
    if getattr(aval, "dtype", None) in narrow or prim in ("reduce_max", "reduce_min", "reduce_and",
                                                          "reduce_or", "argmax", "random_bits",
                                                          "random_wrap", "threefry2x32"):
      return set()
    out = set()
    for i in ins:
      out |= leaks(i, seen)
    return out

  return [[leaks(op, set()) for op in ins] for ins in dots]


@pytest.mark.parametrize("recipe", QUANT_RECIPES)
def test_jaxpr_every_gemm_operand_is_quantized(rng, recipe):
  x = jnp.asarray(rng.standard_normal((64, 256)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((256, 128)), jnp.float32)
  idx = jnp.arange(128, dtype=jnp.int32) if recipe == "tetrajet_v2_outcontrol" else None

  # The XLA path, on every backend: its GEMMs are dot_generals whose operands
  # can be traced. The Pallas GEMM takes packed FP4 codes by its signature,
  # and its results are checked bitwise against this path.
  r = recipes.get(recipe, backend="xla")

  def loss(x, w):
    return jnp.sum(tj.linear(x, w, recipe=r, key=jax.random.key(0), outlier_idx=idx).astype(jnp.float32) ** 2)

  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, w)
  sources = _dot_operand_sources(jaxpr)
  expected = 5 if recipe == "tetrajet_v2_outcontrol" else 3  # fwd (+MXFP8 fwd), dX, dW (+MXFP8 dW)
  assert len(sources) == expected, f"expected {expected} GEMMs, found {len(sources)}"
  for i, ops in enumerate(sources):
    for j, leak in enumerate(ops):
      assert not leak, f"GEMM {i} operand {j} takes high-precision data that bypassed quantization"


def test_jaxpr_leak_detector_catches_a_leak(rng):
  # The detector itself must fail on an unquantized GEMM (it cannot pass vacuously).
  x = jnp.asarray(rng.standard_normal((64, 128)), jnp.float32)
  jaxpr = jax.make_jaxpr(lambda x: tj.linear(x, x.T[:, :128], recipe="bf16"))(x)
  assert any(any(ops) for ops in _dot_operand_sources(jaxpr))


@pytest.mark.parametrize("recipe", ["bf16"] + QUANT_RECIPES)
def test_small_mlp_trains(rng, recipe):
  """A 2-layer MLP regression with each recipe lowers the loss; stays finite."""
  k = jax.random.key(0)
  x = jnp.asarray(rng.standard_normal((256, 128)), jnp.float32)
  w_true = jnp.asarray(rng.standard_normal((128, 128)) * 0.1, jnp.float32)
  target = jnp.tanh(x @ w_true)
  params = {"w1": jax.random.normal(jax.random.key(1), (128, 256)) * 0.05,
            "w2": jax.random.normal(jax.random.key(2), (256, 128)) * 0.05}

  def loss(p, step):
    k1, k2 = jax.random.split(jax.random.fold_in(k, step))
    h = jax.nn.gelu(tj.linear(x, p["w1"], recipe=recipe, key=k1).astype(jnp.float32))
    y = tj.linear(h, p["w2"], recipe=recipe, key=k2).astype(jnp.float32)
    return jnp.mean((y - target) ** 2)

  @jax.jit
  def step(p, i):
    l, g = jax.value_and_grad(loss)(p, i)
    return jax.tree.map(lambda a, b: a - 2.0 * b, p, g), l

  losses = []
  for i in range(100):
    params, l = step(params, i)
    losses.append(float(l))
  assert np.all(np.isfinite(losses))
  assert losses[-1] < 0.5 * losses[0], (recipe, losses[0], losses[-1])


def test_residual_bytes():
  k = 1024
  assert residual_bytes_per_token("bf16", k, 4096) == 2 * k
  # Packed codes (K/2) + E4M3 inner (K/16) + FP32 outer (4K/128).
  assert residual_bytes_per_token("tetrajet_v2", k, 4096) == k / 2 + k / 16 + 4 * k / 128
  # OutControl, 128-multiple count: FP4 on K - 128 channels + MXFP8 (1 + 1/32 bytes) on 128.
  block = dataclasses.replace(recipes.TETRAJET_V2_OUTCONTROL, outlier_rounding="block128")
  n_out = outlier_count(k, 0.1, "block128")
  assert n_out == 128
  fp4 = k - n_out
  assert residual_bytes_per_token(block, k, 4096) == fp4 / 2 + fp4 / 16 + 4 * fp4 / 128 + n_out * (1 + 1 / 32)
  # round(pK) = 102: the FP4 part (922 channels) is zero-padded to 1024, the MXFP8 part (102) to 128 (1x32 blocks).
  assert outlier_count(k, 0.1) == 102
  assert residual_bytes_per_token("tetrajet_v2_outcontrol", k, 4096) == (
      1024 / 2 + 1024 / 16 + 4 * 1024 / 128 + 128 * (1 + 1 / 32))
  assert residual_bytes_per_token("nvidia_nvfp4", k, 4096) < 0.3 * 2 * k


def test_outlier_count_rule():
  assert outlier_count(1024, 0.1) == 102  # round(102.4)
  assert outlier_count(512, 0.1) == 51  # round(51.2)
  assert outlier_count(640, 0.1) == 64
  assert outlier_count(128, 0.1) == 13  # round(12.8)
  assert outlier_count(100, 0.125) == 13  # 12.5 rounds half up
  assert outlier_count(4, 0.99) == 3  # never all of K
  assert outlier_count(512, 0.0) == 0
  assert outlier_count(1024, 0.1, "block128") == 128  # ceil(102.4 / 128) * 128
  assert outlier_count(4096, 0.1, "block128") == 512  # 409.6 -> 512
  assert outlier_count(128, 0.1, "block128") == 0  # cap floor(K/128)*128 and keep some FP4 channels
  with pytest.raises(ValueError, match="rounding must be one of"):
    outlier_count(512, 0.1, "up")
  with pytest.raises(ValueError, match="outlier_rounding must be one of"):
    tj.Recipe(outlier_fraction=0.1, outlier_rounding="up")


def test_bad_inputs(key):
  x = jnp.ones((4, 256))
  with pytest.raises(ValueError, match="Valid recipes: .*tetrajet_v2"):
    tj.linear(x, jnp.ones((256, 128)), recipe="fp4_magic")
  with pytest.raises(ValueError, match="multiple of 128"):
    tj.linear(jnp.ones((4, 200)), jnp.ones((200, 128)), recipe="tetrajet_v2", key=key)
  with pytest.raises(ValueError, match="out_features N=100"):
    tj.linear(x, jnp.ones((256, 100)), recipe="tetrajet_v2", key=key)
  with pytest.raises(ValueError, match="input features"):
    tj.linear(jnp.ones((4, 128)), jnp.ones((256, 128)), recipe="tetrajet_v2", key=key)
  with pytest.raises(ValueError, match="needs key"):
    tj.linear(x, jnp.ones((256, 128)), recipe="tetrajet_v2")
  with pytest.raises(ValueError, match="unknown backend 'turbo'"):
    recipes.get("tetrajet_v2", backend="turbo")
  with pytest.raises(ValueError, match=r"outlier channel indices \[1000, 1001.*outside \[0, K=256\)"):
    tj.linear(x, jnp.ones((256, 128)), recipe="tetrajet_v2", key=key, outlier_idx=jnp.arange(128) + 1000)
  with pytest.raises(ValueError, match=r"outside \[0, K=256\)"):
    tj.linear(x, jnp.ones((256, 128)), recipe="tetrajet_v2", key=key, outlier_idx=jnp.asarray([-1, 3]))
  with pytest.raises(ValueError, match=r"indices repeat: \[7\]"):
    tj.linear(x, jnp.ones((256, 128)), recipe="tetrajet_v2", key=key, outlier_idx=jnp.asarray([7, 7, 9]))
  with pytest.raises(ValueError, match="256 outlier channels for K=256.*less than K"):
    tj.linear(x, jnp.ones((256, 128)), recipe="tetrajet_v2", key=key, outlier_idx=jnp.arange(256))
  with pytest.raises(ValueError, match="together list every channel"):
    tj.linear(x, jnp.ones((256, 128)), recipe="tetrajet_v2", key=key, outlier_idx=jnp.arange(5),
              fp4_idx=jnp.arange(4, 255))
  with pytest.raises(ValueError, match="fp4_idx without outlier_idx"):
    tj.linear(x, jnp.ones((256, 128)), recipe="tetrajet_v2", key=key, fp4_idx=jnp.arange(256))
  with pytest.raises(ValueError, match="outlier_fraction"):
    tj.Recipe(outlier_fraction=1.5)


# ---------------------------------------------------------------- Flax NNX integration

def test_quant_linear_is_a_drop_in_for_nnx_linear(rng):
  lin = nnx.Linear(256, 128, use_bias=True, rngs=nnx.Rngs(3))
  q = tj.QuantLinear(256, 128, use_bias=True, recipe="tetrajet_v2", rngs=nnx.Rngs(3))
  # Same parameter names, shapes and initial values (same initializers and rngs).
  p_lin = nnx.state(lin, nnx.Param).to_pure_dict()
  p_q = nnx.state(q, nnx.Param).to_pure_dict()
  chex.assert_trees_all_equal(p_lin, p_q)
  x = jnp.asarray(rng.standard_normal((8, 256)), jnp.float32)
  y = nnx.jit(lambda q, x: q(x))(q, x)
  want = tj.linear(x, q.kernel[...], recipe="tetrajet_v2", key=jax.random.key(0)) + q.bias[...]
  assert rel_err(y, want) < 1e-2 and rel_err(y, lin(x)) < 0.2


def test_quant_linear_key_stream_advances(rng):
  q = tj.QuantLinear(128, 128, recipe="tetrajet_v2", rngs=nnx.Rngs(0))
  x = jnp.asarray(rng.standard_normal((128, 128)), jnp.float32)

  @nnx.jit
  def grad_w(q):
    return nnx.grad(lambda q: jnp.sum(q(x).astype(jnp.float32) ** 2))(q).kernel[...]

  g1, g2 = grad_w(q), grad_w(q)
  assert int(q.key_count[...]) == 2
  assert np.any(np.asarray(g1) != np.asarray(g2)), "fresh SR/RHT randomness each step"
  q2 = tj.QuantLinear(128, 128, recipe="tetrajet_v2", rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(np.asarray(grad_w(q2)), np.asarray(g1))  # reproducible from the seed


def test_outcontrol_calibration_picks_largest_norms(rng):
  q = tj.QuantLinear(512, 128, recipe="tetrajet_v2_outcontrol", rngs=nnx.Rngs(0))
  scale = np.ones(512, np.float32)
  hot = rng.choice(512, 128, replace=False)
  scale[hot] = 20.0
  tj.set_outcontrol_phase(q, "calibrate")
  call = nnx.jit(lambda q, x: q(x))
  for _ in range(3):
    call(q, jnp.asarray(rng.standard_normal((64, 512)) * scale, jnp.float32))
  tj.freeze_outlier_channels(q)
  n = outlier_count(512, 0.1)
  stats = np.asarray(q.oc_stats[...])
  order = np.concatenate([np.asarray(q.oc_channels[...]), np.asarray(q.oc_fp4_channels[...])])
  np.testing.assert_array_equal(order, np.argsort(-stats, kind="stable"))  # descending norm, both parts
  assert set(order[:n].tolist()) <= set(hot.tolist())  # the outliers: hot channels
  assert q.outcontrol_phase == "frozen"
  with pytest.raises(ValueError, match="calibration"):
    tj.freeze_outlier_channels(tj.QuantLinear(512, 128, recipe="tetrajet_v2_outcontrol", rngs=nnx.Rngs(0)))


def test_quantize_linears_by_pattern():
  class MLP(nnx.Module):
    def __init__(self):
      self.up = nnx.Linear(128, 256, rngs=nnx.Rngs(0))
      self.down = nnx.Linear(256, 128, rngs=nnx.Rngs(1))
      self.head = nnx.Linear(128, 10, rngs=nnx.Rngs(2))

  m = MLP()
  before = nnx.state(m, nnx.Param).to_pure_dict()
  assert sorted(tj.quantize_linears(m, "tetrajet_v2", pattern=r"^(up|down)$")) == ["down", "up"]
  assert isinstance(m.up, tj.QuantLinear) and isinstance(m.down, tj.QuantLinear)
  assert type(m.head) is nnx.Linear
  chex.assert_trees_all_equal(nnx.state(m, nnx.Param).to_pure_dict(), before)
  with pytest.raises(ValueError, match="matched no"):
    tj.quantize_linears(MLP(), "tetrajet_v2", pattern="nothing_here")


def test_quantize_linears_checks_every_match_before_converting():
  """A layer the recipe cannot take (K = 200, not a multiple of the 16-element
  block) is named, and the layers before it in the model are not converted."""
  class Model(nnx.Module):
    def __init__(self):
      self.up = nnx.Linear(128, 256, rngs=nnx.Rngs(0))
      self.odd = nnx.Linear(200, 128, rngs=nnx.Rngs(1))
      self.down = nnx.Linear(256, 128, rngs=nnx.Rngs(2))

  m = Model()
  before = nnx.state(m, nnx.Param).to_pure_dict()
  with pytest.raises(ValueError, match=r"layer 'odd' cannot take recipe 'tetrajet_v2'.*No layer was converted"):
    tj.quantize_linears(m, "tetrajet_v2")
  assert all(type(lin) is nnx.Linear for lin in (m.up, m.odd, m.down))
  chex.assert_trees_all_equal(nnx.state(m, nnx.Param).to_pure_dict(), before)
  # Without the odd layer the same call converts the rest.
  assert sorted(tj.quantize_linears(m, "tetrajet_v2", pattern=r"^(up|down)$")) == ["down", "up"]


def _pallas_forward_diagnosis(x, w) -> str:
  """Which stage of the Pallas forward differs from the XLA path (for failure messages)."""
  from tetrajet_jax.linear.gemm import rtn_quantize  # noqa: PLC0415

  out = []
  ops = {}
  for name, a in (("X", x), ("W^T", w.T)):
    fused, xla = rtn_quantize(a, "auto"), tj.quantize_nvfp4(a)
    ops[name] = (fused, xla)
    if fused is None:
      out.append(f"{name}: fused quantizer not used")
      continue
    for leaf in ("codes", "scale_outer"):
      f, r = np.asarray(getattr(fused, leaf)), np.asarray(getattr(xla, leaf))
      out.append(f"{name} {leaf}: {int((f != r).sum())} of {f.size} differ")
    f = np.asarray(fused.scale_inner.astype(jnp.float32))
    r = np.asarray(xla.scale_inner.astype(jnp.float32))
    out.append(f"{name} scale_inner: {int((f != r).sum())} of {f.size} differ")
  if all(v[0] is not None for v in ops.values()):
    xq, wq = ops["X"][1], ops["W^T"][1]
    g = gemm_nt(xq, wq, backend="pallas", out_dtype=jnp.float32)
    ref = gemm_nt(xq, wq, backend="reference", out_dtype=jnp.float32)
    out.append(f"GEMM on identical operands: rel err {rel_err(g, ref):.3g}")
  return "; ".join(out)


def test_wide_gemm_tiling_where_the_output_tiles_by_it(rng, monkeypatch):
  """TETRAJET_GEMM_TILING=wide: the layer's NVFP4 GEMMs run WIDE_CONFIG where [M, N] tiles by its
  128 x 256 CTA tile and the default tiling elsewhere (N = 384 here), each the reference's product
  to FP32 summation order (the GEMMs in Mosaic GPU's interpreter); "narrow" never takes it."""
  from tetrajet_jax import kernels  # noqa: PLC0415
  from tetrajet_jax.kernels import _platform  # noqa: PLC0415
  from tetrajet_jax.kernels.nvfp4_gemm import DEFAULT_CONFIG, WIDE_CONFIG  # noqa: PLC0415

  monkeypatch.setattr(_platform, "GEMM_TILING", "wide")
  calls = record_kernel_calls(monkeypatch, ["nvfp4_gemm"], lambda name, args, kwargs: kwargs["config"])
  for n in (256, 384):
    a, b = (tj.quantize_nvfp4(jnp.asarray(rng.standard_normal((r, 256)), jnp.float32)) for r in (128, n))
    with interpret_kernels("gemm"):
      out = gemm_nt(a, b, backend="pallas", out_dtype=jnp.float32)
    assert rel_err(out, gemm_nt(a, b, backend="reference", out_dtype=jnp.float32)) < 1e-5
  assert calls == [WIDE_CONFIG, DEFAULT_CONFIG]
  monkeypatch.setattr(_platform, "GEMM_TILING", "narrow")
  assert kernels.layer_gemm_config(256, 512) is DEFAULT_CONFIG


def test_overlap_gemm_tiling_gives_the_narrow_bits(rng, monkeypatch):
  """TETRAJET_GEMM_TILING=overlap: the layer's NVFP4 GEMMs run OVERLAP_CONFIG (the narrow tiles with
  the promotion overlapped) and give the bits of "narrow" (the GEMMs in Mosaic GPU's interpreter)."""
  from tetrajet_jax.kernels import _platform  # noqa: PLC0415
  from tetrajet_jax.kernels.nvfp4_gemm import DEFAULT_CONFIG, OVERLAP_CONFIG  # noqa: PLC0415

  a, b = (tj.quantize_nvfp4(jnp.asarray(rng.standard_normal((r, 512)), jnp.float32)) for r in (256, 128))
  calls = record_kernel_calls(monkeypatch, ["nvfp4_gemm"], lambda name, args, kwargs: kwargs["config"])
  outs = []
  for tiling in ("overlap", "narrow"):
    monkeypatch.setattr(_platform, "GEMM_TILING", tiling)
    with interpret_kernels("gemm"):
      outs.append(np.asarray(gemm_nt(a, b, backend="pallas", out_dtype=jnp.float32)))
  assert calls == [OVERLAP_CONFIG, DEFAULT_CONFIG]
  np.testing.assert_array_equal(*outs)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["tetrajet_v2", "tetrajet_v2_outcontrol", "nvidia_nvfp4"])
def test_pallas_path_matches_exact_on_gpu(rng, key, recipe):
  """backend='pallas' (fused RTN quantizer + exact-product GEMM) vs the FP32 reference path."""
  from tetrajet_jax import kernels  # noqa: PLC0415

  m, k, n = 1024, 1024, 512
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((k, n)) * 0.05, jnp.float32)
  dy = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
  xq = tj.quantize_nvfp4(x)
  assert kernels.can_use_nvfp4_gemm(xq, tj.quantize_nvfp4(w, axis=0)), "the Pallas path must be taken"
  idx = jnp.arange(128, dtype=jnp.int32) * 3 if recipe == "tetrajet_v2_outcontrol" else None
  p = grads(recipe, x, w, dy, key, backend="auto", outlier_idx=idx)
  e = grads(recipe, x, w, dy, key, backend="reference", outlier_idx=idx)
  assert rel_err(p[0], e[0]) < 2e-3, _pallas_forward_diagnosis(x, w)  # same operands, exact products
  if recipe == "nvidia_nvfp4":
    # dX has no RHT (XLA quantizers, same draws): equal up to accumulation order.
    assert rel_err(p[1], e[1]) < 2e-3
  # Gradients through the fused RHT + SR kernel: its own random draws, so another
  # sample of the same estimator; its error vs the exact-path sample is
  # the size of two independent SR errors, not of a wrong computation.
  for a, b in zip(p[1:], e[1:]):
    assert rel_err(a, b) < 0.5


def _assert_same_estimator(recipe, m, k, n, rng, key):
  """Over 128 keys, the kernels' gradients (Q3..Q6 in the fused RHT + SR
  kernel, its own generator) have the same mean (two-sample z-test against
  the XLA path) and the same spread as the XLA path's."""
  x = jnp.asarray(rng.standard_t(3.0, (m, k)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((k, n)) * 0.05, jnp.float32)
  dy = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
  keys = jax.random.split(key, 128)

  def sample(backend):  # a loop, not vmap: the Mosaic GPU kernel need not batch
    fn = jax.jit(lambda kk: grads(recipe, x, w, dy, kk, backend=backend)[1:])
    draws = [fn(kk) for kk in keys]
    return [np.stack([np.asarray(d[i], np.float64) for d in draws]) for i in range(2)]

  fused, xla = sample("auto"), sample("reference")
  for name, a, b in zip(("dx", "dw"), fused, xla):
    se = np.sqrt(a.var(0, ddof=1) / a.shape[0] + b.var(0, ddof=1) / b.shape[0])
    z = np.abs(a.mean(0) - b.mean(0)) / np.maximum(se, 1e-12)
    # Up to 65536 elements, Student-t tails of 127 d.o.f.: P(|z| > 6.5) ~ 1e-9 each.
    assert z.max() < 6.5, f"{recipe} {name}: means differ (max |z| {z.max():.2f})"
    spread = a.var(0).mean() / b.var(0).mean()
    assert 0.8 < spread < 1.25, f"{recipe} {name}: SR variance ratio fused/XLA {spread:.3f}"


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["tetrajet_v2", "nvidia_nvfp4"])
def test_pallas_backward_is_the_same_estimator_on_gpu(rng, key, recipe):
  """The fused backward quantizer in the layer at 256^3 on the H200."""
  from tetrajet_jax import kernels  # noqa: PLC0415

  assert kernels.can_use_pallas_backward_quantizer((256, 256), jnp.bfloat16, axis=-1)
  _assert_same_estimator(recipe, 256, 256, 256, rng, key)


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="CPU only: on a GPU backend='auto' also runs the Pallas RTN quantizers and GEMMs, whose "
                    "sums are ordered differently (test_pallas_backward_is_the_same_estimator_on_gpu covers it)")
def test_pallas_backward_gives_the_xla_gradients_bitwise_interpret(rng, key, monkeypatch):
  """On the CPU, the layer's backward with the fused RHT + SR kernel in Mosaic
  GPU's interpreter (interpret_kernels("backward"); backend "auto" keeps the RTN
  quantizers and GEMMs on XLA here) gives the XLA path's dX and dW bit for
  bit at 128^3: both draw SR's bits from the same counter-based generator.
  The kernel must have been called (the Mosaic family, TETRAJET_QUANTIZER_KERNELS=mosaic: here the
  module setting)."""
  from tetrajet_jax.kernels import _platform  # noqa: PLC0415

  monkeypatch.setattr(_platform, "QUANTIZER_KERNELS", "mosaic")
  calls = record_kernel_calls(monkeypatch, ["quantize_nvfp4_backward"], lambda name, args, kwargs: kwargs.get("axis"))
  # Its own recipe name, so no function compiled without the interpreter is reused.
  recipe = dataclasses.replace(recipes.TETRAJET_V2, name="tetrajet_v2_interpreted")
  x = jnp.asarray(rng.standard_t(3.0, (128, 128)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((128, 128)) * 0.05, jnp.float32)
  dy = jnp.asarray(rng.standard_normal((128, 128)), jnp.float32)
  with interpret_kernels("backward"):
    fused = jax.jit(lambda k: grads(recipe, x, w, dy, k, backend="auto")[1:])(key)
  xla = jax.jit(lambda k: grads(recipe, x, w, dy, k, backend="xla")[1:])(key)
  for what, a, b in zip(("dx", "dw"), fused, xla):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=what)
  # Q3..Q6: two calls per axis each time the backward is traced.
  assert calls and calls.count(-1) == calls.count(0) == len(calls) // 2 and len(calls) % 4 == 0, calls


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="CPU only: on a GPU backend='auto' also runs the Pallas GEMMs, whose sums are "
                    "ordered differently")
@pytest.mark.parametrize("setting, outcontrol", [("triton", False), ("triton", True), ("triton_rtn", True)])
def test_triton_quantizers_give_the_xla_layer_bitwise_interpret(rng, key, monkeypatch, setting, outcontrol):
  """With TETRAJET_QUANTIZER_KERNELS=triton (here: the module setting), every block-scaled
  quantizer of a TetraJet-v2 layer runs on the Triton kernels (interpreted; GEMMs on XLA): Q1
  along K (OutControl's 115 FP4 channels zero-padded to 128), Q2 of the weights in the flat view,
  Q3..Q5 with RHT + SR (Q4, of the weights, in the flat view), and Q6 read from Q1's codes (no
  float32 X_hat). Their RHT is the XLA butterfly's operations in order, so y, dX and dW equal the
  XLA path's bit for bit, and every kernel was called. With triton_rtn,
  Q1 and Q2 run on Triton and the RHT + SR quantizers (Q6 of X_hat) on the Mosaic kernel."""
  from tetrajet_jax.kernels import _flat_rows, _platform  # noqa: PLC0415

  monkeypatch.setattr(_flat_rows, "MIN_BUCKET_ROWS", 64)  # the default bucket is slow to interpret
  calls = record_kernel_calls(
      monkeypatch, ["quantize_nvfp4_rtn", "quantize_nvfp4_rtn_triton", "quantize_nvfp4_backward",
                    "quantize_nvfp4_backward_triton", "requantize_nvfp4_backward_triton"],
      lambda name, args, kwargs: (name, kwargs.get("axis"), kwargs.get("flat_rows", False)))
  monkeypatch.setattr(_platform, "QUANTIZER_KERNELS", setting)
  recipe = dataclasses.replace(recipes.TETRAJET_V2, name=f"tetrajet_v2_{setting}_{outcontrol}")
  x = jnp.asarray(rng.standard_t(3.0, (128, 128)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((128, 128)) * 0.05, jnp.float32)
  dy = jnp.asarray(rng.standard_normal((128, 128)), jnp.float32)
  outliers = jnp.arange(0, 128, 10) if outcontrol else None
  with interpret_kernels("rtn", "backward"):
    fused = jax.jit(lambda k: grads(recipe, x, w, dy, k, backend="auto", outlier_idx=outliers))(key)
  xla = jax.jit(lambda k: grads(recipe, x, w, dy, k, backend="xla", outlier_idx=outliers))(key)
  for what, a, b in zip(("y", "dx", "dw"), fused, xla):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), err_msg=what)
  triton = setting == "triton"
  backward = "quantize_nvfp4_backward_triton" if triton else "quantize_nvfp4_backward"
  assert {c[0] for c in calls} == {"quantize_nvfp4_rtn_triton", backward} | (
      {"requantize_nvfp4_backward_triton"} if triton else set())
  assert {c[2] for c in calls if c[0] == "quantize_nvfp4_rtn_triton"} == {False, True}  # Q1; Q2 flat
  assert {c[1:] for c in calls if c[0] == backward} == {(-1, False), (-1, True), (0, False)}  # Q4 flat
  if triton:  # Q5 along M from dY; Q6 only from the codes
    assert sum(c[0] == backward and c[1] == 0 for c in calls) == sum(
        c[0] == "requantize_nvfp4_backward_triton" for c in calls)


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="CPU only: on a GPU backend='auto' also runs the Pallas GEMMs, whose sums are "
                    "ordered differently")
def test_backward_gemm_operands_from_the_kernels_give_the_same_gradients_interpret(rng, key, monkeypatch):
  """TETRAJET_BACKWARD_OPERANDS=bf16 (here: the module setting): Q3 and Q5 (dY) and Q6 (from Q1's
  codes) hand the backward GEMMs their Triton kernels' bf16 operands, q s_in, instead of codes
  (interpreted; GEMMs on XLA), and Q4 of the weights stays codes: y, dX and dW are the codes'
  bit for bit, with OutControl's channel split, and each of those kernels was asked for operands."""
  from tetrajet_jax.kernels import _flat_rows, _platform  # noqa: PLC0415

  monkeypatch.setattr(_flat_rows, "MIN_BUCKET_ROWS", 64)  # the default bucket is slow to interpret
  calls = record_kernel_calls(
      monkeypatch, ["quantize_nvfp4_backward_triton", "requantize_nvfp4_backward_triton"],
      lambda name, args, kwargs: (name, kwargs.get("axis"), kwargs.get("operand", False)))
  monkeypatch.setattr(_platform, "QUANTIZER_KERNELS", "triton")
  x = jnp.asarray(rng.standard_t(3.0, (128, 128)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((128, 128)) * 0.05, jnp.float32)
  dy = jnp.asarray(rng.standard_normal((128, 128)), jnp.float32)
  outliers = jnp.arange(0, 128, 10)
  results = {}
  for operands in ("codes", "bf16"):
    monkeypatch.setattr(_platform, "BACKWARD_OPERANDS", operands)
    recipe = dataclasses.replace(recipes.TETRAJET_V2, name=f"tetrajet_v2_backward_{operands}")
    with interpret_kernels("rtn", "backward"):
      results[operands] = jax.jit(lambda k, r=recipe: grads(r, x, w, dy, k, backend="auto", outlier_idx=outliers))(key)
  for what, a, b in zip(("y", "dx", "dw"), results["bf16"], results["codes"]):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), err_msg=what)
  asked = {c for c in calls if c[2]}
  assert asked == {("quantize_nvfp4_backward_triton", -1, True), ("quantize_nvfp4_backward_triton", 0, True),
                   ("requantize_nvfp4_backward_triton", None, True)}, calls
  assert ("quantize_nvfp4_backward_triton", -1, False) in calls  # Q4: the weights' codes, either way


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="CPU only: on a GPU the GEMMs also run on Pallas (test_pallas_backward_is_the_same_"
                    "estimator_on_gpu covers the layer there)")
def test_nvidia_quantizers_on_the_kernels_give_the_xla_layer_bitwise_interpret(rng, key, monkeypatch):
  """NVIDIA's recipe with its per-tensor scales on the quantizer kernels (interpreted; GEMMs on
  XLA): Q1 on the RTN kernel under the amax XLA reduces; Q3 (SR, no RHT) and Q5/Q6 (SR/RTN
  after the fixed-sign RHT) on the backward kernel, Q5/Q6 under the amax of the kernel's own
  transform; the 16x16 weight blocks (Q2, Q4) stay on XLA. y, dX and dW equal the XLA path's
  bit for bit at 128^3, and every kernel was called as described."""
  def describe(name, args, kwargs):  # args[1]: the RHT signs of the backward kernel and the amax
    return (name, kwargs.get("axis"), args[1] is not None if len(args) > 1 else None, kwargs.get("rounding"),
            kwargs.get("tensor_scale") is not None)

  calls = record_kernel_calls(monkeypatch, ["quantize_nvfp4_rtn", "quantize_nvfp4_backward", "transformed_amax"],
                              describe)
  recipe = dataclasses.replace(recipes.NVIDIA_NVFP4, name="nvidia_nvfp4_interpreted")
  x = jnp.asarray(rng.standard_t(3.0, (128, 128)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((128, 128)) * 0.05, jnp.float32)
  dy = jnp.asarray(rng.standard_normal((128, 128)), jnp.float32)
  with interpret_kernels("rtn", "backward"):
    fused = jax.jit(lambda k: grads(recipe, x, w, dy, k, backend="auto"))(key)
  xla = jax.jit(lambda k: grads(recipe, x, w, dy, k, backend="xla"))(key)
  for what, a, b in zip(("y", "dx", "dw"), fused, xla):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), err_msg=what)
  assert set(calls) == {
      ("quantize_nvfp4_rtn", None, None, None, True),  # Q1: X along K
      ("quantize_nvfp4_backward", -1, False, "stochastic", True),  # Q3: dY along N, no RHT
      ("quantize_nvfp4_backward", 0, True, "stochastic", True),  # Q5: H dY^T along M
      ("quantize_nvfp4_backward", 0, True, "nearest", True),  # Q6: H X^T along M
      ("transformed_amax", 0, True, None, False),  # the amax of H dY^T and of H X^T
  }, calls


def test_rtn_kernel_takes_outcontrol_fp4_channels_padded_interpret(rng, key, monkeypatch):
  """With OutControl the FP4 part has K - round(0.1 K) channels (230 of 256 here), not a multiple
  of 128: the RTN kernel gets them zero-padded to 256, for X (Q1) and W (Q2), and the forward
  equals the XLA path's bit for bit (the GEMMs stay on XLA here). The Mosaic RTN kernel
  (TETRAJET_QUANTIZER_KERNELS=mosaic); the Triton one takes the same padding in
  test_triton_quantizers_give_the_xla_layer_bitwise_interpret."""
  from tetrajet_jax import kernels  # noqa: PLC0415
  from tetrajet_jax.kernels import _platform  # noqa: PLC0415

  monkeypatch.setattr(_platform, "QUANTIZER_KERNELS", "mosaic")
  shapes = record_kernel_calls(monkeypatch, ["quantize_nvfp4_rtn"], lambda name, args, kwargs: tuple(args[0].shape))
  asked = []  # what the layer asks whether the kernel takes (on a GPU: the padded shape, or XLA)
  monkeypatch.setattr(kernels, "can_use_pallas_quantizer", lambda shape, dtype: asked.append(tuple(shape)) or True)
  recipe = dataclasses.replace(recipes.get("tetrajet_v2_outcontrol", backend="auto"),
                               name="tetrajet_v2_outcontrol_interpreted")
  k = 256
  idx = jnp.asarray(rng.choice(k, outlier_count(k, 0.1), replace=False), jnp.int32)
  x = jnp.asarray(rng.standard_t(3.0, (128, k)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((k, 128)) * 0.05, jnp.float32)
  fwd = lambda r: jax.jit(lambda x, w: tj.linear(x, w, recipe=r, key=key, outlier_idx=idx))(x, w)
  with interpret_kernels("rtn"):
    fused = fwd(recipe)
  xla = fwd(dataclasses.replace(recipe, backend="xla", name="tetrajet_v2_outcontrol_xla"))
  assert sorted(shapes) == sorted(asked) == [(128, 256), (128, 256)], (shapes, asked)  # X and W^T [., K'p]
  np.testing.assert_array_equal(np.asarray(fused, np.float32), np.asarray(xla, np.float32))
  # The padded kernel's tensor is the XLA quantizer's, logical shape included.
  from tetrajet_jax.linear.gemm import rtn_quantize  # noqa: PLC0415
  with interpret_kernels("rtn"):
    t = rtn_quantize(x[:, :230], "auto")
  ref = tj.quantize_nvfp4(x[:, :230], axis=-1)
  assert (t.shape, t.axis) == (ref.shape, ref.axis) == ((128, 230), 1)
  for leaf in ("codes", "scale_inner", "scale_outer"):
    np.testing.assert_array_equal(np.asarray(getattr(t, leaf)).view(np.uint8),
                                  np.asarray(getattr(ref, leaf)).view(np.uint8), err_msg=leaf)


def test_pallas_backend_raises_where_the_kernels_cannot_run(rng, key):
  """backend='pallas' never falls back silently: off Hopper (or on an
  unsupported shape) it raises BackendUnavailableError, a ValueError."""
  from tetrajet_jax import kernels  # noqa: PLC0415
  from tetrajet_jax.linear import BackendUnavailableError  # noqa: PLC0415

  if kernels.hopper_available():
    pytest.skip("the kernels run on this device")
  x = jnp.asarray(rng.standard_normal((128, 256)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((256, 128)), jnp.float32)
  with pytest.raises(BackendUnavailableError, match="backend='auto'"):
    tj.linear(x, w, recipe=recipes.get("tetrajet_v2", backend="pallas"), key=key)
  assert issubclass(BackendUnavailableError, ValueError)
