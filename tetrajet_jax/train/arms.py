"""The ablation arms: a linear-layer recipe plus the optimizer-side flags.

OutControl is part of the recipe (``tetrajet_v2_outcontrol`` quantizes the
retained channels in MXFP8 and needs a calibration window); OsciReset is an
optax transformation chained after AdamW.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class Arm:
  """One arm of the ablation.

  Attributes:
    name: arm name, used for result folders and tables.
    recipe: linear-layer recipe name (`tetrajet_jax.linear.recipes.get`).
    oscireset: chain OsciReset after AdamW.
    description: one line for tables and ``--help``.
  """

  name: str
  recipe: str
  oscireset: bool = False
  description: str = ""

  @property
  def outcontrol(self) -> bool:
    return self.recipe == "tetrajet_v2_outcontrol"

  @property
  def quantized(self) -> bool:
    return self.recipe != "bf16"


ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm(name="bf16", recipe="bf16", description="bf16 GEMMs (the reference)"),
        Arm(name="nvidia_nvfp4", recipe="nvidia_nvfp4", description="NVIDIA's NVFP4 recipe (spec 5)"),
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
