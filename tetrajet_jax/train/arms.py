"""The ablation arms: a linear-layer recipe plus the optimizer-side flags.

An arm converts the model's block linears with `nn.quantize_linears` by a
path rule (`Arm.linear_pattern`); its properties derive from the recipe's
fields. OutControl is part of the recipe (`outlier_fraction > 0` quantizes
the retained channels in MXFP8 and needs a calibration window); OsciReset is
an optax transformation chained after AdamW.
"""

from __future__ import annotations

import dataclasses
import math

from flax import nnx

from tetrajet_jax import nn as qnn
from tetrajet_jax.linear import recipes

# The four block linears of `model.olmo2` by path inside a block.
BLOCK_LINEARS = ("attn/qkv", "attn/out", "mlp/up_gate", "mlp/down")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Arm:
  """One arm of the ablation.

  Attributes:
    name: arm name, used for result folders and tables.
    recipe: linear-layer recipe name (`tetrajet_jax.linear.recipes.get`).
    oscireset: chain OsciReset after AdamW.
    bf16_last_fraction: this fraction of the blocks (the last ones, rounded
      up) keeps bf16 linears (NVIDIA's recipe keeps ~15%, docs/SPEC.md section 5).
    description: one line for tables and ``--help``.
  """

  name: str
  recipe: str
  oscireset: bool = False
  bf16_last_fraction: float = 0.0
  description: str = ""

  def __post_init__(self):
    recipes.get(self.recipe)  # validates the name
    if not 0.0 <= self.bf16_last_fraction < 1.0:
      raise ValueError(f"Arm {self.name!r}: bf16_last_fraction={self.bf16_last_fraction} must be in [0, 1).")

  @property
  def outcontrol(self) -> bool:
    return recipes.get(self.recipe).outlier_fraction > 0

  @property
  def quantized(self) -> bool:
    return recipes.get(self.recipe).quantized

  def bf16_blocks(self, num_layers: int) -> frozenset[int]:
    """Indices of the blocks whose linears stay bf16 (none for a bf16 recipe: all are)."""
    if not self.quantized:
      return frozenset()
    n = math.ceil(self.bf16_last_fraction * num_layers)
    return frozenset(range(num_layers - n, num_layers))

  def linear_pattern(self, num_layers: int) -> str | None:
    """The `quantize_linears` rule: the block linears outside the bf16 blocks
    (None when no block is quantized)."""
    blocks = [i for i in range(num_layers) if i not in self.bf16_blocks(num_layers)]
    if not self.quantized or not blocks:
      return None
    return rf"^layers_({'|'.join(map(str, blocks))})/({'|'.join(BLOCK_LINEARS)})$"

  def quantize(self, model: nnx.Module, *, backend: recipes.Backend = "auto") -> list[str]:
    """Converts `model`'s block linears (an OLMo2 built from this arm's seed)
    to QuantLinear with the arm's recipe and `backend`, in place; returns the
    converted paths (none for a bf16 arm)."""
    pattern = self.linear_pattern(model.cfg.num_layers)
    if pattern is None:
      return []
    return qnn.quantize_linears(model, recipes.get(self.recipe, backend=backend), pattern=pattern)


ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm(name="bf16", recipe="bf16", description="bf16 GEMMs (the reference)"),
        Arm(name="nvidia_nvfp4", recipe="nvidia_nvfp4", bf16_last_fraction=0.15,
            description="NVIDIA's NVFP4 recipe (docs/SPEC.md section 5)"),
        Arm(name="tetrajet_v2", recipe="tetrajet_v2", description="TetraJet-v2 base"),
        Arm(name="tetrajet_v2_outcontrol", recipe="tetrajet_v2_outcontrol",
            description="base + OutControl"),
        Arm(name="tetrajet_v2_oscireset", recipe="tetrajet_v2", oscireset=True,
            description="base + OsciReset"),
        Arm(name="tetrajet_v2_full", recipe="tetrajet_v2_outcontrol", oscireset=True,
            description="base + OutControl + OsciReset"),
    )
}


def get_arm(name: str) -> Arm:
  """The named arm; unknown names raise a ValueError listing the valid ones."""
  if name not in ARMS:
    raise ValueError(f"unknown arm {name!r}; valid arms: {', '.join(ARMS)}")
  return ARMS[name]


def parse_arms(spec: str) -> list[Arm]:
  """``"bf16,tetrajet_v2_full"`` -> arms, validating every name before any work."""
  names = [s.strip() for s in spec.split(",") if s.strip()]
  if not names:
    raise ValueError(f"no arms given; choose from: {', '.join(ARMS)}")
  unknown = [n for n in names if n not in ARMS]
  if unknown:
    raise ValueError(f"unknown arm(s) {', '.join(map(repr, unknown))}; valid arms: {', '.join(ARMS)}")
  dupes = sorted({n for n in names if names.count(n) > 1})
  if dupes:
    raise ValueError(f"arm(s) listed twice: {', '.join(dupes)}")
  return [ARMS[n] for n in names]
