"""OLMo-2 style decoder in Flax NNX with quantized block linears.

Architecture (OLMo-2, docs/SPEC.md section 6): token embedding -> L blocks -> RMSNorm ->
LM head (untied). Each block, with ``norm_after`` (the norm is applied to the
sublayer's output, before the residual add)::

    h = x + attn_norm(attention(x))
    y = h + mlp_norm(swiglu(h))

Attention: one fused QKV projection, QK-norm (RMSNorm over the full
projected q and k, before splitting heads, as OLMo-2 does), RoPE (theta 5e5,
rotate-half layout), causal softmax attention, output projection. MLP: one
fused up/gate projection (first half up, second half gate),
``silu(gate) * up``, down projection. No biases anywhere.

Numerics: parameters are float32 masters; everything computes in bfloat16
with float32 accumulation. The model knows nothing of quantization: the four
block linears (QKV, attention out, up/gate, down) are plain ``nnx.Linear``,
which `tetrajet_jax.nn.quantize_linears` converts by path pattern (the
trainer does so per arm, `tetrajet_jax.train.arms`). Each block linear draws
the seed of its call-time key stream right after its kernel, so a converted
model has the kernels and quantization keys of one built from quantized
layers with the same seed. The
residual stream is float32 (adds are cheap; bf16 residuals lose small
updates). Logits are float32.

Runs of identical blocks execute as one ``lax.scan`` over their stacked state
(``scan_blocks``; see ``_scan_blocks`` for why), with per-block parameters.

Parameter paths are what the optimizer's filters rely on: quantized kernels
are ``layers_{i}/attn/qkv/kernel`` etc., the embedding is ``embed/embedding``
and the head ``lm_head/kernel``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from tetrajet_jax import nn as qnn
from tetrajet_jax.model.configs import ModelConfig

COMPUTE_DTYPE = jnp.bfloat16


def truncated_normal_init(std: float):
  """N(0, std) truncated at +-3 std (OLMo's ``trunc_normal_(std, -3std, 3std)``).

  Not `jax.nn.initializers.truncated_normal`: that one rescales ``stddev`` by
  a constant that is only right for truncation at 2 sigma.
  """

  def init(key, shape, dtype=jnp.float32):
    return (std * jax.random.truncated_normal(key, -3.0, 3.0, shape, jnp.float32)).astype(dtype)

  return init


class RMSNorm(nnx.Module):
  """RMSNorm with a learned weight (init 1), computed in float32."""

  def __init__(self, dim: int, *, eps: float):
    self.eps = eps
    self.weight = nnx.Param(jnp.ones((dim,), jnp.float32))

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
    return (y * self.weight[...]).astype(COMPUTE_DTYPE)


def rope(x_BxTxHxD: jax.Array, positions_T: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding, rotate-half layout (HF/OLMo), computed in float32."""
  d = x_BxTxHxD.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))  # [D/2]
  angles_TxD2 = positions_T.astype(jnp.float32)[:, None] * inv_freq[None, :]
  cos = jnp.cos(jnp.concatenate([angles_TxD2, angles_TxD2], -1))[None, :, None, :]  # [1,T,1,D]
  sin = jnp.sin(jnp.concatenate([angles_TxD2, angles_TxD2], -1))[None, :, None, :]
  x = x_BxTxHxD.astype(jnp.float32)
  x1, x2 = x[..., : d // 2], x[..., d // 2 :]
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return (x * cos + rotated * sin).astype(COMPUTE_DTYPE)


def causal_attention(q_BxTxHxD: jax.Array, k_BxTxHxD: jax.Array, v_BxTxHxD: jax.Array,
                     *, impl: str = "xla") -> jax.Array:
  """Causal softmax attention: bf16 matmuls, float32 scores and softmax.

  impl: "xla", "cudnn" (flash kernel, GPU only) or "auto" (cudnn on a GPU).
  """
  if impl == "auto":
    impl = "cudnn" if jax.default_backend() == "gpu" else "xla"
  if impl == "cudnn":
    return jax.nn.dot_product_attention(q_BxTxHxD, k_BxTxHxD, v_BxTxHxD, is_causal=True,
                                        implementation="cudnn")
  T, D = q_BxTxHxD.shape[1], q_BxTxHxD.shape[-1]
  scores_BxHxTxS = jnp.einsum("bthd,bshd->bhts", q_BxTxHxD, k_BxTxHxD,
                              preferred_element_type=jnp.float32) / math.sqrt(D)
  mask_TxS = jnp.tril(jnp.ones((T, T), bool))
  scores_BxHxTxS = jnp.where(mask_TxS, scores_BxHxTxS, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores_BxHxTxS, axis=-1).astype(COMPUTE_DTYPE)
  return jnp.einsum("bhts,bshd->bthd", probs, v_BxTxHxD,
                    preferred_element_type=jnp.float32).astype(COMPUTE_DTYPE)


def _block_linear(cfg: ModelConfig, d_in: int, d_out: int, rngs: nnx.Rngs) -> nnx.Linear:
  """A block linear: bf16 operands, float32 accumulation and master weight,
  plus the seed of its call-time key stream (kept by `quantize_linears`)."""
  lin = nnx.Linear(d_in, d_out, use_bias=False, dtype=COMPUTE_DTYPE, param_dtype=jnp.float32,
                   kernel_init=truncated_normal_init(cfg.init_std), preferred_element_type=jnp.float32,
                   rngs=rngs)
  lin.key_seed = qnn.QuantKeyState(jax.random.key_data(qnn.stream_key(rngs)))
  return lin


def _bf16(y: jax.Array) -> jax.Array:
  return y.astype(COMPUTE_DTYPE)  # a converted layer's output already is


class Attention(nnx.Module):
  """Fused QKV, QK-norm over the full projected dims, RoPE, causal attention, out proj."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d = cfg.d_model
    self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
    self.rope_theta, self.impl = cfg.rope_theta, cfg.attention
    self.qkv = _block_linear(cfg, d, 3 * d, rngs)
    self.q_norm = RMSNorm(d, eps=cfg.norm_eps)
    self.k_norm = RMSNorm(d, eps=cfg.norm_eps)
    self.out = _block_linear(cfg, d, d, rngs)

  def __call__(self, x_BxTxD: jax.Array, positions_T: jax.Array) -> jax.Array:
    B, T, d = x_BxTxD.shape
    qkv_BxTx3D = _bf16(self.qkv(x_BxTxD.astype(COMPUTE_DTYPE)))
    q, k, v = jnp.split(qkv_BxTx3D, 3, axis=-1)  # each [B,T,D]
    q, k = self.q_norm(q), self.k_norm(k)
    split = lambda t: t.astype(COMPUTE_DTYPE).reshape(B, T, self.num_heads, self.head_dim)
    q_BxTxHxd = rope(split(q), positions_T, self.rope_theta)
    k_BxTxHxd = rope(split(k), positions_T, self.rope_theta)
    o_BxTxHxd = causal_attention(q_BxTxHxd, k_BxTxHxd, split(v), impl=self.impl)
    return _bf16(self.out(o_BxTxHxd.reshape(B, T, d)))


class MLP(nnx.Module):
  """SwiGLU with a fused up/gate projection: ``down(silu(gate) * up)``."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.up_gate = _block_linear(cfg, cfg.d_model, 2 * cfg.mlp_hidden, rngs)
    self.down = _block_linear(cfg, cfg.mlp_hidden, cfg.d_model, rngs)

  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    up, gate = jnp.split(_bf16(self.up_gate(x_BxTxD.astype(COMPUTE_DTYPE))), 2, axis=-1)  # [B,T,H] each
    h_BxTxH = (jax.nn.silu(gate.astype(jnp.float32)) * up.astype(jnp.float32)).astype(COMPUTE_DTYPE)
    return _bf16(self.down(h_BxTxH))


class Block(nnx.Module):
  """One OLMo-2 block with norm_after: ``h = x + norm(attn(x)); h + norm(mlp(h))``."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.attn = Attention(cfg, rngs=rngs)
    self.attn_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
    self.mlp = MLP(cfg, rngs=rngs)
    self.mlp_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)

  def __call__(self, x_BxTxD: jax.Array, positions_T: jax.Array) -> jax.Array:
    h = x_BxTxD + self.attn_norm(self.attn(x_BxTxD, positions_T)).astype(jnp.float32)
    return h + self.mlp_norm(self.mlp(h)).astype(jnp.float32)


class OLMo2(nnx.Module):
  """OLMo-2 decoder; ``model(tokens int32[B,T]) -> logits float32[B,T,V_padded]``.

  Args:
    cfg: the model config (``cfg.vocab_size`` must be set).
    scan_blocks: run each run of identical blocks as one lax.scan (compiles
      one block graph instead of one per block); False unrolls them; None
      (the default): `default_scan_blocks()` for the current backend.
    rngs: parameter init and quantization key streams.

  Example:
    >>> model = OLMo2(get_config("tiny").with_vocab(4096), rngs=nnx.Rngs(0))
    >>> logits = model(jnp.zeros((2, 128), jnp.int32))
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, scan_blocks: bool | None = None):
    self.cfg = cfg
    self.scan_blocks = default_scan_blocks() if scan_blocks is None else scan_blocks
    init = truncated_normal_init(cfg.init_std)
    V, d = cfg.padded_vocab, cfg.d_model
    self.embed = nnx.Embed(V, d, param_dtype=jnp.float32, embedding_init=init, rngs=rngs)
    for i in range(cfg.num_layers):
      # Named attributes, not a list: string keys all the way down keep the
      # checkpoint tree and the optimizer's path filters simple.
      setattr(self, f"layers_{i}", Block(cfg, rngs=rngs))
    self.final_norm = RMSNorm(d, eps=cfg.norm_eps)
    self.lm_head = nnx.Linear(d, V, use_bias=False, dtype=COMPUTE_DTYPE, param_dtype=jnp.float32,
                              kernel_init=init, preferred_element_type=jnp.float32, rngs=rngs)

  @property
  def blocks(self) -> list[Block]:
    return [getattr(self, f"layers_{i}") for i in range(self.cfg.num_layers)]

  def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
    T = tokens_BxT.shape[1]
    positions_T = jnp.arange(T, dtype=jnp.int32)
    h_BxTxD = self.embed(tokens_BxT).astype(jnp.float32)
    if self.scan_blocks:
      for graphdef, run in self._block_runs():
        h_BxTxD = (run[0](h_BxTxD, positions_T) if len(run) == 1
                   else _scan_blocks(graphdef, run, h_BxTxD, positions_T))
    else:
      for block in self.blocks:
        h_BxTxD = block(h_BxTxD, positions_T)
    return self.lm_head(self.final_norm(h_BxTxD)).astype(jnp.float32)  # [B,T,V]


  def _block_runs(self) -> list[tuple[nnx.GraphDef, list[Block]]]:
    """(graphdef, blocks) of each run of consecutive blocks with the same
    structure (recipe, OutControl phase, backend): one lax.scan each."""
    runs: list[tuple[nnx.GraphDef, list[Block]]] = []
    for block in self.blocks:
      graphdef = nnx.graphdef(block)
      if runs and graphdef == runs[-1][0]:
        runs[-1][1].append(block)
      else:
        runs.append((graphdef, [block]))
    return runs


def default_scan_blocks(backend: str | None = None) -> bool:
  """Scan the blocks on the CPU, unroll them elsewhere (GPUs; TPUs untested).

  A trade between compile time and step time, measured both ways
  (docs/notes/training.md): on the H200 the unrolled model trains faster
  and compiles slower than the scanned one; on CPU cores the scan costs
  little per step and saves most of the compile time. Long GPU runs
  amortize the compile; tests and CPU runs do not.
  """
  return (backend or jax.default_backend()) == "cpu"


def _scan_blocks(graphdef: nnx.GraphDef, run: list[Block], h_BxTxD: jax.Array,
                 positions_T: jax.Array) -> jax.Array:
  """Applies the blocks of one run in order through a lax.scan over their stacked state.

  Why: XLA then compiles one block's graph instead of L copies. A quantized
  block's fwd+bwd is large (six quantizers per linear, integer-exact scale
  division), and unrolled blocks made the 20m FP4 train step take minutes to
  compile on the H200 host. The parameters and the checkpoint layout stay
  per block (``layers_{i}``); only the call stacks them. The blocks' mutable
  state (quantization key counters, OutControl statistics) is written back
  after the scan, as the unrolled loop would leave it.
  """
  stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *[nnx.state(b) for b in run])

  def body(h, state):
    block = nnx.merge(graphdef, state)
    h = block(h, positions_T)
    return h, nnx.state(block, nnx.Not(nnx.Param))

  h_BxTxD, new_state = jax.lax.scan(body, h_BxTxD, stacked)
  for i, block in enumerate(run):
    nnx.update(block, jax.tree.map(lambda leaf, i=i: leaf[i], new_state))
  return h_BxTxD


def lm_loss(logits_BxTxV: jax.Array, targets_BxT: jax.Array, *, z_loss: float,
            weights_BxT: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean next-token cross-entropy plus ``z_loss * logsumexp(logits)**2`` (OLMo).

  Returns:
    (total loss, {"ce": mean cross-entropy, "z_loss": mean z-loss term}).
  """
  logits = logits_BxTxV.astype(jnp.float32)
  lse_BxT = jax.nn.logsumexp(logits, axis=-1)
  target_logit_BxT = jnp.take_along_axis(logits, targets_BxT[..., None], axis=-1)[..., 0]
  ce_BxT = lse_BxT - target_logit_BxT
  z_BxT = z_loss * jnp.square(lse_BxT)
  if weights_BxT is None:
    weights_BxT = jnp.ones_like(ce_BxT)
  denom = jnp.maximum(weights_BxT.sum(), 1.0)
  ce = (ce_BxT * weights_BxT).sum() / denom
  z = (z_BxT * weights_BxT).sum() / denom
  return ce + z, {"ce": ce, "z_loss": z}
