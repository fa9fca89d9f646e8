"""OutControl's phases in a run: ``fp4`` -> ``calibrate`` -> ``frozen``.

The calibration window (`schedule.CalibrationWindow`) says which phase is in
force for each update; moving from ``calibrate`` to ``frozen`` freezes each
layer's top-p input channels from the statistics it accumulated
(`nn.freeze_outlier_channels`). The phase is a static attribute of the
model's QuantLinears, so each phase has its own graph (and compiled step).
"""

from __future__ import annotations

from flax import nnx

from tetrajet_jax import nn as qnn
from tetrajet_jax.train.config import TrainConfig


def phase_for_update(config: TrainConfig, step: int) -> str:
  """The phase in force for update ``step`` ("fp4" for arms without OutControl)."""
  return config.calibration.phase(step) if config.arm_spec.outcontrol else "fp4"


def enter_phase(model: nnx.Module, current: str, want: str) -> None:
  """Moves `model` (in place) from phase `current` to `want`, freezing the
  channels when calibration ends."""
  if want == "frozen" and current == "calibrate":
    qnn.freeze_outlier_channels(model)  # top-p channels from the accumulated statistics
  else:
    qnn.set_outcontrol_phase(model, want)


def phase_graphdef(model: nnx.Module, phase: str) -> nnx.GraphDef:
  """The graph of `model` (modified in place) with OutControl `phase` set."""
  qnn.set_outcontrol_phase(model, phase)
  return nnx.graphdef(model)
