"""Recipes: which quantizer runs where in the quantized linear layer.

A recipe is a frozen dataclass with one switch per quantizer (docs/SPEC.md section 2: Q1..Q6)
and per transform, so an ablation is a `dataclasses.replace` away. Named
presets live in PRESETS; `get(name)` returns one.

  GEMM            operand  tensor            along  TetraJet-v2     NVIDIA NVFP4
  Y  = X W^T      Q1       X                 K      RTN             RTN
                  Q2       W                 K      RTN (1x16)      RTN (16x16)
  dX = dY W       Q3       dY                N      SR + RHT        SR
                  Q4       W_hat^T           N      SR + RHT        RTN (=Q2^T)
  dW = dY^T X     Q5       dY^T              M      SR + RHT        SR + RHT
                  Q6       X_hat^T           M      SR + RHT        RTN + RHT
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax.numpy as jnp

Rounding = Literal["nearest", "stochastic"]
Scaling = Literal["block", "tensor"]
# How OutControl turns p*K into a channel count (`linear.outlier_count`).
OUTLIER_ROUNDINGS = ("nearest", "block128")
Backend = Literal["auto", "xla", "pallas", "reference"]
BACKENDS = ("auto", "xla", "pallas", "reference")


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantizerConfig:
  """One of the six quantizers. Disabled: the operand stays in high precision."""

  enabled: bool = True
  rounding: Rounding = "nearest"

  def __post_init__(self):
    if self.rounding not in ("nearest", "stochastic"):
      raise ValueError(f"QuantizerConfig: rounding must be 'nearest' or 'stochastic', got {self.rounding!r}.")


RTN = QuantizerConfig(rounding="nearest")
SR = QuantizerConfig(rounding="stochastic")
OFF = QuantizerConfig(enabled=False)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
  """How a linear layer quantizes its three GEMMs.

  Attributes:
    name: preset name (informational; recipes compare by all fields).
    quantized: False = a plain bf16 layer (every other field is ignored).
    scaling: "block" = TetraJet-v2 double-block (1x16 E4M3 in 1x128 FP32);
      "tensor" = NVIDIA's one FP32 scale per tensor.
    weight_block_2d: 16x16 inner blocks for the weight (NVIDIA), so Q2 and
      Q4 quantize W identically.
    q1..q6: the six quantizers (docs/SPEC.md section 2 table).
    rht_dgrad: RHT-16 along N on both dX operands (Q3, Q4).
    rht_wgrad: RHT-16 along M on both dW operands (Q5, Q6).
    rht_fixed_signs: one fixed sign vector (NVIDIA) instead of fresh signs
      per layer per step.
    aligned_backward: Q4/Q6 re-quantize the forward's dequantized W_hat/X_hat
      (unbiased w.r.t. the forward's computation); False: quantize the
      high-precision W/X (NVIDIA).
    outlier_fraction: OutControl's p: this fraction of input channels runs
      in MXFP8 once channels are frozen. 0 disables OutControl.
    outlier_rounding: how p*K becomes a channel count (`outlier_count`):
      "nearest" = round(p*K), the paper's accuracy setting; "block128" = up
      to a multiple of 128, capped at floor(K/128)*128 (the reference code's
      kernel-friendly count, far more than p at small K).
    out_dtype: dtype of Y (and the GEMM outputs).
    backend: how the quantizers and GEMMs execute (linear/gemm.py): "auto"
      = the Pallas kernels where they run (Hopper GPU, supported shape), XLA
      elsewhere; "xla" = XLA only (bf16 GEMM, FP32 accumulation); "pallas" =
      the kernels, raising BackendUnavailableError where they cannot run;
      "reference" = FP32 dequantized GEMMs (the test reference).
  """

  name: str = "custom"
  quantized: bool = True
  scaling: Scaling = "block"
  weight_block_2d: bool = False
  q1: QuantizerConfig = RTN
  q2: QuantizerConfig = RTN
  q3: QuantizerConfig = SR
  q4: QuantizerConfig = SR
  q5: QuantizerConfig = SR
  q6: QuantizerConfig = SR
  rht_dgrad: bool = True
  rht_wgrad: bool = True
  rht_fixed_signs: bool = False
  aligned_backward: bool = True
  outlier_fraction: float = 0.0
  outlier_rounding: Literal["nearest", "block128"] = "nearest"
  out_dtype: jnp.dtype = jnp.bfloat16
  backend: Backend = "auto"

  def __post_init__(self):
    if self.backend not in BACKENDS:
      raise ValueError(f"Recipe {self.name!r}: unknown backend {self.backend!r}; use one of {', '.join(BACKENDS)}.")
    if self.scaling not in ("block", "tensor"):
      raise ValueError(f"Recipe {self.name!r}: scaling must be 'block' or 'tensor', got {self.scaling!r}.")
    if not 0.0 <= self.outlier_fraction < 1.0:
      raise ValueError(f"Recipe {self.name!r}: outlier_fraction must be in [0, 1), got {self.outlier_fraction}.")
    if self.outlier_rounding not in OUTLIER_ROUNDINGS:
      raise ValueError(f"Recipe {self.name!r}: outlier_rounding must be one of {OUTLIER_ROUNDINGS}, got "
                       f"{self.outlier_rounding!r}.")
    if self.outlier_fraction > 0 and self.scaling != "block":
      raise ValueError(f"Recipe {self.name!r}: OutControl (outlier_fraction > 0) is defined for block "
                       "scaling; set scaling='block'.")
    for i, q in enumerate(self.quantizers, 1):
      if not isinstance(q, QuantizerConfig):
        raise TypeError(f"Recipe {self.name!r}: q{i} must be a QuantizerConfig, got {type(q).__name__}.")

  @property
  def quantizers(self) -> tuple[QuantizerConfig, ...]:
    return (self.q1, self.q2, self.q3, self.q4, self.q5, self.q6)

  @property
  def needs_key(self) -> bool:
    """Whether a PRNG key is required (stochastic rounding or fresh RHT signs)."""
    if not self.quantized:
      return False
    sr = any(q.enabled and q.rounding == "stochastic" for q in self.quantizers)
    fresh_rht = (self.rht_dgrad or self.rht_wgrad) and not self.rht_fixed_signs
    return sr or fresh_rht

  @property
  def k_multiple(self) -> int:
    """Required multiple of K and N: 128 for 1x128 outer blocks, else 16."""
    if not self.quantized:
      return 1
    return 128 if self.scaling == "block" else 16


BF16 = Recipe(name="bf16", quantized=False)

TETRAJET_V2 = Recipe(name="tetrajet_v2")

TETRAJET_V2_OUTCONTROL = dataclasses.replace(TETRAJET_V2, name="tetrajet_v2_outcontrol", outlier_fraction=0.1)

# Ablation helper: base TetraJet-v2 without the backward RHT.
TETRAJET_V2_NO_RHT = dataclasses.replace(TETRAJET_V2, name="tetrajet_v2_no_rht", rht_dgrad=False, rht_wgrad=False)

NVIDIA_NVFP4 = Recipe(
    name="nvidia_nvfp4",
    scaling="tensor",
    weight_block_2d=True,
    q1=RTN, q2=RTN, q3=SR, q4=RTN, q5=SR, q6=RTN,
    rht_dgrad=False,
    rht_wgrad=True,
    rht_fixed_signs=True,
    aligned_backward=False,
)

PRESETS: dict[str, Recipe] = {
    r.name: r for r in (BF16, NVIDIA_NVFP4, TETRAJET_V2, TETRAJET_V2_OUTCONTROL, TETRAJET_V2_NO_RHT)
}


def get(name: str | Recipe, *, backend: Backend | None = None) -> Recipe:
  """Returns the named preset (a Recipe passes through unchanged), with
  `backend` replaced when given.

  Raises:
    ValueError: unknown name or backend; the message lists the valid ones.
  """
  if isinstance(name, Recipe):
    recipe = name
  else:
    try:
      recipe = PRESETS[name]
    except KeyError:
      raise ValueError(f"Unknown recipe {name!r}. Valid recipes: {', '.join(sorted(PRESETS))}.") from None
  if backend is None or backend == recipe.backend:
    return recipe
  return dataclasses.replace(recipe, backend=backend)
