"""OLMo-2 model configurations (paper sizes plus CPU-sized ones).

Every dimension that a quantized GEMM reduces over or produces (d_model,
3*d_model, the MLP hidden size and 2x it) must be a multiple of 128: NVFP4's
outer block is 1x128 along K, and the backward quantizes along N as well.
The vocabulary comes from the tokenizer (`ModelConfig.with_vocab`) and is
padded up to a multiple of 128 for the LM head (the padded ids are never
targets; they only take a little probability mass early in training, as in
OLMo's own padded vocabulary).
"""

from __future__ import annotations

import dataclasses

from tetrajet_jax.numerics.nvfp4 import OUTER_BLOCK

VOCAB_MULTIPLE = 128
ATTENTIONS = ("auto", "xla", "cudnn")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Shape and numerics of one OLMo-2 style decoder.

  Attributes:
    name: config name (``tiny``, ``20m``, ``70m``, ``150m``, ``370m``).
    num_layers: transformer blocks.
    d_model: residual width.
    num_heads: attention heads (head_dim = d_model / num_heads, even for RoPE).
    mlp_hidden: SwiGLU hidden size (the fused up/gate projection is 2x this).
    vocab_size: tokenizer vocabulary (0 = not set yet; see `with_vocab`).
    rope_theta: RoPE base.
    norm_eps: RMSNorm epsilon.
    init_std: std of the truncated (at 3 sigma) normal init of every matrix.
    z_loss: weight of the z-loss term ``z_loss * logsumexp(logits)**2``.
    attention: ``"auto"`` (cuDNN's flash attention on a GPU, XLA
      elsewhere: every arm, bf16 included, gets the fastest attention of the
      device), ``"xla"`` (einsum, any backend) or ``"cudnn"``
      (`jax.nn.dot_product_attention` flash kernel, GPU only).
    peak_lr: default peak learning rate for this size (docs/SPEC.md section 6: 4e-4 for 70M,
      3e-4 for 150M/370M; small models take larger ones).
  """

  name: str
  num_layers: int
  d_model: int
  num_heads: int
  mlp_hidden: int
  vocab_size: int = 0
  rope_theta: float = 5e5
  norm_eps: float = 1e-6
  init_std: float = 0.02
  z_loss: float = 1e-5
  attention: str = "auto"
  peak_lr: float = 3e-4

  def __post_init__(self):
    for field in ("num_layers", "d_model", "num_heads", "mlp_hidden"):
      if getattr(self, field) < 1:
        raise ValueError(f"{self.name}: {field}={getattr(self, field)} must be >= 1.")
    if self.d_model % self.num_heads:
      raise ValueError(f"{self.name}: d_model={self.d_model} is not divisible by "
                       f"num_heads={self.num_heads}.")
    if self.head_dim % 2:
      raise ValueError(f"{self.name}: head_dim={self.head_dim} must be even for RoPE.")
    for field in ("d_model", "mlp_hidden"):
      v = getattr(self, field)
      if v % OUTER_BLOCK:
        raise ValueError(f"{self.name}: {field}={v} must be a multiple of {OUTER_BLOCK} (the NVFP4 "
                         f"1x{OUTER_BLOCK} block along K); use {(-(-v // OUTER_BLOCK)) * OUTER_BLOCK}.")
    if self.vocab_size < 0:
      raise ValueError(f"{self.name}: vocab_size={self.vocab_size} must be >= 0.")
    if self.attention not in ATTENTIONS:
      raise ValueError(f"attention={self.attention!r}; use one of {', '.join(ATTENTIONS)}.")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def padded_vocab(self) -> int:
    if self.vocab_size < 1:
      raise ValueError(f"{self.name}: vocab_size is not set; call config.with_vocab(tokenizer.vocab_size).")
    return -(-self.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE

  def with_vocab(self, vocab_size: int) -> "ModelConfig":
    return dataclasses.replace(self, vocab_size=vocab_size)

  def param_counts(self) -> dict[str, int]:
    """Parameter counts by group, from the shapes alone.

    ``embed`` and ``lm_head`` use the padded vocabulary (what is allocated).
    """
    d, h, L, V = self.d_model, self.mlp_hidden, self.num_layers, self.padded_vocab
    per_block = {
        "qkv": d * 3 * d, "attn_out": d * d, "up_gate": d * 2 * h, "down": h * d,
        # q_norm, k_norm (over the full projected dim), post-attention and post-MLP norms.
        "norms": 4 * d,
    }
    counts = {"embed": V * d, "lm_head": d * V, "final_norm": d,
              "blocks": L * sum(per_block.values()),
              "quantized": L * (per_block["qkv"] + per_block["attn_out"] + per_block["up_gate"]
                                + per_block["down"])}
    counts["total"] = counts["embed"] + counts["lm_head"] + counts["final_norm"] + counts["blocks"]
    counts["non_embedding"] = counts["total"] - counts["embed"]
    return counts

  def flops_per_token(self, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward), PaLM appendix B convention.

    ``6 x`` the matmul parameters (block linears and LM head; the embedding
    lookup is not a matmul) plus ``12 x L x d x T`` for the attention
    score/value matmuls (not halved for the causal mask, as in PaLM, nanodo
    and maxtext).
    """
    c = self.param_counts()
    matmul_params = c["quantized"] + c["lm_head"]
    return 6.0 * matmul_params + 12.0 * self.num_layers * self.d_model * seq_len


CONFIGS: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        # CPU smoke size: the whole demo (two arms) trains in a few minutes on 2 cores.
        ModelConfig(name="tiny", num_layers=2, d_model=128, num_heads=2, mlp_hidden=256, peak_lr=3e-3),
        ModelConfig(name="20m", num_layers=6, d_model=384, num_heads=6, mlp_hidden=1024, peak_lr=1e-3),
        ModelConfig(name="70m", num_layers=8, d_model=512, num_heads=8, mlp_hidden=1024, peak_lr=4e-4),
        ModelConfig(name="150m", num_layers=12, d_model=768, num_heads=12, mlp_hidden=1536),
        ModelConfig(name="370m", num_layers=16, d_model=1024, num_heads=16, mlp_hidden=4096),
    )
}


def get_config(name: str) -> ModelConfig:
  """The named config; unknown names raise a ValueError listing the valid ones."""
  if name not in CONFIGS:
    raise ValueError(f"unknown model {name!r}; valid models: {', '.join(CONFIGS)}")
  return CONFIGS[name]
