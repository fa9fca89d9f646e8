"""OutControl as the reference does it (docs/SPEC.md sections 3, 4): OsciReset's Q(w) is the
forward's W_hat bitwise in an OutControl layer, descending-norm channel
order in both parts and through a checkpoint, any outlier count (FP4 part
zero-padded along K) in the forward and the backward, the effective
fraction in the run's config."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import tetrajet_jax as tj
from tetrajet_jax import nn as qnn
from tetrajet_jax.linear import fp4_weight_values, outlier_count, recipes
from tetrajet_jax.optim import NVFP4WeightQuantizer, osci_reset, osci_reset_metrics
from tetrajet_jax.train import TrainConfig, Trainer
from tests import linear_reference as lref
from tests import numpy_reference as ref

F32 = np.float32
K, N = 512, 256
# Q1 off, FP32 output, exact GEMM: a one-hot input row j reads row j of the forward's W_hat exactly.
PROBE = dataclasses.replace(recipes.TETRAJET_V2_OUTCONTROL, name="probe", q1=recipes.OFF, out_dtype=jnp.float32,
                            backend="reference")


def _calibrated_layer(rng) -> tj.QuantLinear:
  """An OutControl layer after calibration on inputs with log-normal channel scales (a shuffled order)."""
  layer = tj.QuantLinear(K, N, recipe=PROBE, rngs=nnx.Rngs(int(rng.integers(1 << 30))))
  scale = np.exp(rng.normal(0.0, 1.0, K)).astype(F32)
  tj.set_outcontrol_phase(layer, "calibrate")
  for _ in range(2):
    layer(jnp.asarray(rng.standard_normal((128, K)) * scale, jnp.float32))
  tj.freeze_outlier_channels(layer)
  return layer


def _forward_w_hat(layer: tj.QuantLinear, kernel: jax.Array) -> np.ndarray:
  """Row j of the layer's forward W_hat, read from the forward GEMM with input e_j (float32 [K, N])."""
  layer.kernel[...] = kernel
  return np.asarray(layer(jnp.eye(K, dtype=jnp.float32)))


def test_osci_reset_q_is_the_forward_w_hat_bitwise(rng):
  layer = _calibrated_layer(rng)
  split = layer.channel_split()
  fp4 = np.asarray(split.fp4)
  assert fp4.shape == (K - outlier_count(K, 0.1),) and not np.array_equal(fp4, np.sort(fp4))
  w = jnp.asarray(rng.standard_normal((K, N)) * 0.02, jnp.float32)
  w_hat = _forward_w_hat(layer, w)
  q = np.asarray(jax.jit(NVFP4WeightQuantizer())(w, split.fp4))
  np.testing.assert_array_equal(q[fp4].view(np.uint32), w_hat[fp4].view(np.uint32))
  # The whole-kernel quantization (other 16/128-blocks) is off the forward's grid on most FP4 elements.
  whole = np.asarray(NVFP4WeightQuantizer()(w))
  assert np.mean(whole[fp4] != w_hat[fp4]) > 0.3


def test_osci_reset_in_an_outcontrol_layer_lands_on_the_forward_grid(rng):
  layer = _calibrated_layer(rng)
  out_rows = np.asarray(layer.oc_channels[...])
  params = nnx.to_pure_dict(nnx.state(layer, nnx.Param))
  tree = qnn.outlier_channels_tree(layer, params)
  tx = osci_reset(start_step=0, period=3, window=1, param_filter=qnn.quantized_kernel_filter(layer))
  state = tx.init(params)
  step = jax.jit(lambda u, s, p: tx.update(u, s, p, outlier_channels=tree))
  w0 = params["kernel"]
  # Update 0 (the window): a relative nudge of 1e-3 flips the elements next to a decision edge,
  # R = grid gap / tiny move >> 8. Update 1 (the reset): no upstream move.
  nudge = (w0 * 1e-3 * jnp.asarray(rng.choice([-1.0, 1.0], w0.shape), jnp.float32)).astype(jnp.float32)
  u, state = step({"kernel": nudge}, state, params)
  w1 = optax.apply_updates(params, u)
  u, state = step({"kernel": jnp.zeros_like(w0)}, state, w1)
  w2 = np.asarray(optax.apply_updates(w1, u)["kernel"])
  w1 = np.asarray(w1["kernel"])
  reset = w2 != w1
  assert 0 < reset.sum() == int(state.num_reset["kernel"])
  assert not reset[out_rows].any()  # MXFP8 rows never take part
  # The reset value is the forward's W_hat of w1, and a reset weight re-quantizes to itself.
  np.testing.assert_array_equal(w2[reset].view(np.uint32), _forward_w_hat(layer, w1)[reset].view(np.uint32))
  np.testing.assert_array_equal(_forward_w_hat(layer, w2)[reset].view(np.uint32), w2[reset].view(np.uint32))


def test_channel_order_descends_and_drives_the_fp4_blocks(rng):
  layer = _calibrated_layer(rng)
  stats = np.asarray(layer.oc_stats[...])
  order = np.concatenate([np.asarray(layer.oc_channels[...]), np.asarray(layer.oc_fp4_channels[...])])
  np.testing.assert_array_equal(order, np.argsort(-stats, kind="stable"))
  # The layer quantizes the FP4 rows in that order: its W_hat is fp4_weight_values with the order.
  w = jnp.asarray(rng.standard_normal((K, N)) * 0.02, jnp.float32)
  fp4 = np.asarray(layer.oc_fp4_channels[...])
  want = np.asarray(fp4_weight_values(w, layer.oc_fp4_channels[...]))
  np.testing.assert_array_equal(_forward_w_hat(layer, w)[fp4], want[fp4])
  with pytest.raises(ValueError, match="together list every channel"):
    layer.set_channel_order(np.r_[order[:-1], order[0]])
  with pytest.raises(ValueError, match="all 512 input channels"):
    layer.set_channel_order(order[:10])


def _padded_fake_quant(x: np.ndarray) -> np.ndarray:
  """lref.fake_quant_block along the last axis with zero padding to 128 (then cropped)."""
  k = x.shape[-1]
  xp = np.pad(np.asarray(x, F32), [(0, 0)] * (x.ndim - 1) + [(0, (-k) % 128)])
  return lref.fake_quant_block(xp)[..., :k]


def _mxfp8_values(x: np.ndarray) -> np.ndarray:
  k = x.shape[-1]
  xp = np.pad(np.asarray(x, F32), [(0, 0)] * (x.ndim - 1) + [(0, (-k) % 32)])
  v, e = ref.mxfp8(xp)
  return (v * np.repeat(np.exp2(e), 32, -1))[..., :k]


def test_any_outlier_count_forward_and_backward(rng):
  """51 outlier channels (not a multiple of 128 or 32), FP4 part of 333 in a shuffled order: forward,
  dX and dW against NumPy with explicit zero padding (deterministic recipe: RTN, no RHT)."""
  k, n, m = 384, 128, 128
  det = dataclasses.replace(recipes.TETRAJET_V2_OUTCONTROL, name="det", q3=recipes.RTN, q4=recipes.RTN,
                            q5=recipes.RTN, q6=recipes.RTN, rht_dgrad=False, rht_wgrad=False,
                            out_dtype=jnp.float32, backend="reference")
  perm = rng.permutation(k).astype(np.int32)
  out, fp4 = perm[:51], perm[51:]
  x = rng.standard_normal((m, k)).astype(F32)
  w = (rng.standard_normal((k, n)) * 0.05).astype(F32)
  dy = rng.standard_normal((m, n)).astype(F32)
  f = lambda x, w: tj.linear(x, w, recipe=det, outlier_idx=out, fp4_idx=fp4)
  y, vjp = jax.vjp(f, jnp.asarray(x), jnp.asarray(w))
  dx, dw = (np.asarray(a, np.float64) for a in vjp(jnp.asarray(dy)))
  x_hat = _padded_fake_quant(x[:, fp4]).astype(F32)  # [M, K'] in the FP4 order
  w_hat = np.zeros((k, n), F32)
  w_hat[fp4] = _padded_fake_quant(w[fp4].T).T
  w_hat[out] = _mxfp8_values(w[out].T).T
  want_y = x_hat.astype(np.float64) @ w_hat[fp4] + _mxfp8_values(x[:, out]).astype(np.float64) @ w_hat[out]
  np.testing.assert_allclose(np.asarray(y, np.float64), want_y, rtol=1e-5, atol=1e-5 * np.abs(want_y).max())
  want_dx = lref.fake_quant_block(dy) @ lref.fake_quant_block(w_hat).T  # both along N = 128
  np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-5 * np.abs(want_dx).max())
  want_dw_fp4 = lref.fake_quant_block(x_hat.T) @ lref.fake_quant_block(dy.T).T  # along M = 128
  np.testing.assert_allclose(dw[fp4], want_dw_fp4, rtol=1e-5, atol=1e-5 * np.abs(want_dw_fp4).max())
  x_out_hat = _mxfp8_values(x[:, out])
  want_dw_out = _mxfp8_values(x_out_hat.T).astype(np.float64) @ _mxfp8_values(dy.T).T
  np.testing.assert_allclose(dw[out], want_dw_out, rtol=1e-5, atol=1e-5 * np.abs(want_dw_out).max())


def test_outlier_product_joins_the_fp4_gemm_interpret(rng, key, monkeypatch):
  """On the Pallas GEMM the MXFP8 outlier product is extra K chunks of the FP4 GEMM (one FP32
  sum, one cast to bf16, no second GEMM): y agrees with the FP32 reference backend's up to bf16
  rounding of nearly equal sums, while y without the outlier part is far off."""
  from tetrajet_jax import kernels  # noqa: PLC0415
  from tetrajet_jax.linear import interpret_kernels  # noqa: PLC0415

  extras = []
  run_gemm = kernels.nvfp4_gemm
  monkeypatch.setattr(kernels, "nvfp4_gemm", lambda a, b, **kw: extras.append(kw.get("extra")) or run_gemm(a, b, **kw))
  k = 256
  idx = jnp.asarray(rng.choice(k, outlier_count(k, 0.1), replace=False), jnp.int32)
  x = jnp.asarray(rng.standard_t(3.0, (128, k)) * np.where(np.isin(np.arange(k), idx), 20.0, 1.0), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((k, 128)) * 0.05, jnp.float32)
  fwd = lambda backend: jax.jit(lambda x, w: tj.linear(
      x, w, recipe=recipes.get("tetrajet_v2_outcontrol", backend=backend), key=key, outlier_idx=idx))(x, w)
  with interpret_kernels("gemm", "rtn"):
    fused = np.asarray(fwd("auto"), np.float64)
  assert len(extras) == 1 and extras[0] is not None and extras[0][0].shape == (128, 32 * -(-idx.size // 32))
  want = np.asarray(fwd("reference"), np.float64)
  np.testing.assert_allclose(fused, want, rtol=2**-8, atol=1e-6 * np.abs(want).max())
  fp4_only = fused - _mxfp8_values(np.asarray(x, np.float32)[:, idx]) @ _mxfp8_values(np.asarray(w)[idx].T).T
  assert np.abs(fp4_only - want).max() > 0.1 * np.abs(want).max()


# ------------------------------------------------------------------------ the trainer


def _cfg(**kw):
  base = dict(model="tiny", arm="tetrajet_v2_full", layers=1, batch_size=2, seq_len=64, total_steps=8,
              warmup_steps=1, peak_lr=3e-3, calib_start=0, calib_steps=2, osci_start=1, osci_period=3,
              osci_window=1)
  base.update(kw)
  return TrainConfig(**base)


def _orders(trainer: Trainer) -> dict[str, np.ndarray]:
  return {name: np.concatenate([np.asarray(layer.oc_channels[...]), np.asarray(layer.oc_fp4_channels[...])])
          for name, layer in ((("/".join(map(str, p))), l) for p, l in qnn.iter_quant_linears(trainer.model()))
          if layer.has_outcontrol}


def test_channel_order_survives_a_checkpoint_round_trip(tmp_path, data):
  first = Trainer(_cfg(), data, tmp_path, progress=False, tensorboard=False, async_checkpoints=False)
  first.train()  # calibrates on steps 0-1, freezes, then steps 2-7; checkpoint at the end
  first.close()
  orders = _orders(first)
  assert orders and all(not np.array_equal(o, np.arange(o.size)) for o in orders.values())
  back = Trainer(_cfg(), data, tmp_path, resume=True, progress=False, tensorboard=False, async_checkpoints=False)
  assert back.step == 8
  restored = _orders(back)
  assert restored.keys() == orders.keys()
  for name, order in orders.items():
    np.testing.assert_array_equal(restored[name], order, err_msg=name)
  back.close()


def test_effective_fraction_in_the_run_config(tmp_path, data):
  trainer = Trainer(_cfg(arm="tetrajet_v2_outcontrol"), data, tmp_path, progress=False, tensorboard=False)
  derived = json.loads((tmp_path / "config.json").read_text())["derived"]
  fractions = derived["outcontrol_fraction"]
  want = {name: outlier_count(layer.in_features, 0.1) / layer.in_features
          for name, layer in ((("/".join(map(str, p))), l) for p, l in qnn.iter_quant_linears(trainer.model()))
          if layer.has_outcontrol}
  assert fractions == want and len(want) >= 4  # qkv, out, up/gate, down of the one block
  assert fractions == qnn.outlier_fractions(trainer.model())
  assert set(fractions.values()) == {13 / 128}  # round(0.1 K) / K at K = 128 and 256 (26 / 256), not 0 or 1/2
  trainer.close()


def test_monitor_counts_only_fp4_rows_on_the_forward_grid(rng):
  layer = _calibrated_layer(rng)
  params = nnx.to_pure_dict(nnx.state(layer, nnx.Param))
  tree = qnn.outlier_channels_tree(layer, params)
  tx = osci_reset(start_step=0, period=3, window=1, threshold=8.0, param_filter=qnn.quantized_kernel_filter(layer),
                  apply=False)
  w = params["kernel"]
  nudge = (w * 1e-3 * jnp.asarray(rng.choice([-1.0, 1.0], w.shape), jnp.float32)).astype(jnp.float32)
  _, state = tx.update({"kernel": nudge}, tx.init(params), params, outlier_channels=tree)
  fp4 = layer.oc_fp4_channels[...]
  rows = np.asarray(fp4)
  d_q = np.abs(np.asarray(fp4_weight_values(w + nudge, fp4)) - np.asarray(fp4_weight_values(w, fp4)))[rows]
  d_w = np.abs(np.asarray(nudge))[rows]
  want = np.sum((d_w > 0) & (d_q >= 8.0 * d_w)) / d_q.size
  assert want > 0
  assert float(osci_reset_metrics(state)["osci/window_risk_frac"]) == pytest.approx(want, rel=1e-6)
