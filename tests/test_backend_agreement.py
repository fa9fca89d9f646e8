"""GPU-only: the GPU computes the same quantization as the CPU, stage by stage.

The CPU results are checked against the independent NumPy reference by the
rest of the suite; these tests pin the GPU to the CPU inside one process (the
GPU machine has both backends), so a GPU-only discrepancy (a division lowered
to an approximate instruction, a cast round trip dropped by a fusion, TF32 in a
matmul) shows up at the first stage where it happens, with a count of the
differing elements, instead of as a vague end-to-end error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tetrajet_jax as tj
from tetrajet_jax.numerics import dequantize, quantize_nvfp4, random_hadamard_16
from tests import layer_stages

pytestmark = pytest.mark.gpu


def _run(fn, args, device):
  with jax.default_device(device):
    out = jax.jit(fn)(*[jax.device_put(a, device) for a in args])
  return jax.tree.map(np.asarray, out)


def gpu_and_cpu(fn, *args):
  """fn jitted on the default GPU and on the host CPU, as NumPy pytrees."""
  return _run(fn, args, jax.devices("gpu")[0]), _run(fn, args, jax.devices("cpu")[0])


def assert_bitwise(gpu, cpu, what: str):
  for i, (g, c) in enumerate(zip(jax.tree.leaves(gpu), jax.tree.leaves(cpu))):
    g = np.asarray(g)
    c = np.asarray(c)
    gb = g.view(np.uint8) if g.dtype.itemsize == 1 else g.view(f"u{g.dtype.itemsize}")
    cb = c.view(np.uint8) if c.dtype.itemsize == 1 else c.view(f"u{c.dtype.itemsize}")
    bad = gb != cb
    assert not bad.any(), (f"{what}, leaf {i} ({g.dtype}{list(g.shape)}): {int(bad.sum())} of {bad.size} "
                           f"elements differ; first at {np.argwhere(bad)[0].tolist()}: gpu "
                           f"{g[tuple(np.argwhere(bad)[0])]!r} cpu {c[tuple(np.argwhere(bad)[0])]!r}")


@pytest.fixture
def data(rng):
  m, k, n = 200, 128, 256
  return {"x": rng.standard_normal((m, k)).astype(np.float32),
          "w": (rng.standard_normal((k, n)) * 0.05).astype(np.float32),
          "dy": np.asarray(jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16).astype(jnp.float32))}


def _pad_rows(a: np.ndarray) -> np.ndarray:
  return np.pad(a, [(0, -a.shape[0] % 128), (0, 0)])


def _leaves(t):
  return (t.codes, t.scale_inner.view(jnp.uint8), t.scale_outer)


def test_rht_bitwise(data, key):
  g, c = gpu_and_cpu(lambda a: random_hadamard_16(a, key, axis=-1), data["dy"])
  assert_bitwise(g, c, "random_hadamard_16 along the last axis")
  g, c = gpu_and_cpu(lambda a: random_hadamard_16(a, key, axis=0), _pad_rows(data["x"]))
  assert_bitwise(g, c, "random_hadamard_16 along axis 0")


def test_random_bits_bitwise(key):
  g, c = gpu_and_cpu(lambda: jax.random.uniform(key, (200, 256), jnp.float32))
  assert_bitwise(g, c, "jax.random.uniform")
  # Eagerly too (the NumPy references draw their uniforms and signs this way).
  eager = {}
  for dev in (jax.devices("gpu")[0], jax.devices("cpu")[0]):
    with jax.default_device(dev):
      k = jax.device_put(key, dev)
      ks = jax.random.split(k, 8)
      eager[dev.platform] = (np.asarray(jax.random.uniform(ks[4], (256, 256), jnp.float32)),
                             np.asarray(jax.random.rademacher(ks[1], (16,), dtype=jnp.float32)))
  assert_bitwise(eager["gpu"], eager["cpu"], "eager split + uniform + rademacher")


@pytest.mark.parametrize("axis", [-1, 0])
def test_rtn_quantizer_bitwise(data, axis):
  g, c = gpu_and_cpu(lambda a: _leaves(quantize_nvfp4(a, axis=axis)), data["x"])
  assert_bitwise(g, c, f"quantize_nvfp4 RTN axis={axis}")


@pytest.mark.parametrize("axis", [-1, 0])
def test_sr_quantizer_bitwise(data, key, axis):
  fn = lambda a: _leaves(quantize_nvfp4(random_hadamard_16(a, key, axis=axis), axis=axis,
                                        rounding="stochastic", key=key))
  g, c = gpu_and_cpu(fn, _pad_rows(data["dy"]))  # tokens padded to 128 as the layer does
  assert_bitwise(g, c, f"quantize_nvfp4 RHT+SR axis={axis}")


def test_dequantize_bitwise(data):
  fn = lambda a: dequantize(quantize_nvfp4(a, axis=0))
  g, c = gpu_and_cpu(fn, data["w"])
  assert_bitwise(g, c, "dequantize(quantize(W)) along K")


@pytest.mark.parametrize("bf16_inside_jit", [False, True])
@pytest.mark.parametrize("recipe", ["tetrajet_v2", "nvidia_nvfp4"])
def test_linear_grads_match(data, key, recipe, bf16_inside_jit):
  """Quantized operands agree bitwise (above); the GEMMs differ only in FP32
  accumulation order (cuBLAS vs Eigen), so the products agree to ~1e-6.

  bf16_inside_jit: x and dY arrive as float32 and are cast to bf16 inside the
  jitted function, the pattern XLA's GPU pipeline may fold away
  (f32 -> bf16 -> f32 into the quantizer); the layer must still quantize the
  bf16 values, as on the CPU."""
  dy = data["dy"] if not bf16_inside_jit else (data["dy"] + 1e-3 * data["x"][:, :1]).astype(np.float32)

  def grads(x, w, dy):
    if bf16_inside_jit:
      x = x.astype(jnp.bfloat16)
    y, vjp = jax.vjp(lambda x, w: tj.linear(x, w, recipe=tj.recipes.get(recipe, backend="reference"), key=key), x, w)
    return (y, *vjp(dy.astype(y.dtype)))

  g, c = gpu_and_cpu(grads, data["x"], data["w"], dy)
  for name, a, b in zip(("y", "dx", "dw"), g, c):
    # A bf16 result (y; dx for a bf16 x) is one rounding of an ~1e-7-off FP32 sum that may move an ulp.
    tol = 4e-3 if a.dtype == jnp.bfloat16 else 1e-5
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    err = np.linalg.norm(a - b) / np.linalg.norm(b)
    assert err < tol, f"{recipe} {name}: GPU vs CPU relative error {err:.3g} (bound {tol:g})"


def test_backward_operands_bitwise(data, key):
  """The four backward operands Q3..Q6 of the layer, as its backward builds them."""

  def operands(x, w, dy):
    ops = layer_stages.backward_operands(x, w, dy, key)
    return {k: _leaves(v) if isinstance(v, tj.NVFP4Tensor) else v for k, v in ops.items()}

  g, c = gpu_and_cpu(operands, data["x"], data["w"], data["dy"])
  for name in g:
    assert_bitwise(g[name], c[name], f"backward operand {name}")


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("kind", ["near_decisions", "subnormal_scale", "bf16_values", "saturation"])
def test_element_rule_bitwise_vs_reference(rng, key, kind, rounding):
  """The element rule on the GPU (jitted) at its hard cases, bitwise the NumPy
  reference's: products x r on and next to decision points, subnormal inputs
  and scales (the GPU keeps subnormals, XLA's CPU flushes them), saturation."""
  from tests import numpy_reference as ref  # noqa: PLC0415
  from tests.test_numerics import _data, near_decision_points  # noqa: PLC0415

  x = near_decision_points(rng, 64) if kind == "near_decisions" else _data(kind, rng, (64, 512))
  fn = lambda a: _leaves(quantize_nvfp4(a, rounding=rounding, key=key if rounding == "stochastic" else None))
  g, c = gpu_and_cpu(fn, x)
  assert_bitwise(g, c, f"quantize_nvfp4 {rounding} on {kind} data")
  seed = int(jax.random.bits(jax.device_put(key, jax.devices("cpu")[0]), (), jnp.uint32))
  codes, s_in, s_out = ref.nvfp4_block(x, seed=seed if rounding == "stochastic" else None)
  np.testing.assert_array_equal(np.stack([g[0] & 0xF, g[0] >> 4], -1).reshape(codes.shape), codes)
  np.testing.assert_array_equal(g[1].view(jnp.float8_e4m3fn).astype(np.float32), s_in)
  np.testing.assert_array_equal(g[2], s_out)
