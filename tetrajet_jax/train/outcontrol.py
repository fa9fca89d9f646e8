"""OutControl's phases in a run: ``fp4`` -> ``calibrate`` -> ``frozen``.

The calibration window (`schedule.CalibrationWindow`) says which phase is in
force for each update; moving from ``calibrate`` to ``frozen`` freezes each
layer's top-p input channels from the statistics it accumulated
(`nn.freeze_outlier_channels`). The phase is a static attribute of the
model's QuantLinears, so a phase's graph is its compiled step.

A run executes its ``fp4`` updates with the calibrating graph (`PHASE_GRAPH`)
and zeroes the statistics when the window opens: the two graphs compute the
same forward and backward, and calibrating only adds a per-channel norm of
each layer's input, so a run compiles two train steps instead of three (the
FP4 step's compile is most of an OutControl run's start-up).
"""

from __future__ import annotations

from flax import nnx

from tetrajet_jax import nn as qnn
from tetrajet_jax.train.config import TrainConfig


# The QuantLinear phase whose graph runs each run phase (see the module docstring).
PHASE_GRAPH = {"fp4": "calibrate", "calibrate": "calibrate", "frozen": "frozen"}


def phase_for_update(config: TrainConfig, step: int) -> str:
  """The phase in force for update ``step`` ("fp4" for arms without OutControl)."""
  return config.calibration.phase(step) if config.arm_spec.outcontrol else "fp4"


def enter_phase(model: nnx.Module, current: str, want: str) -> None:
  """Moves `model` (in place) from phase `current` to `want`, freezing the
  channels when calibration ends."""
  if want == "frozen" and current == "calibrate":
    qnn.freeze_outlier_channels(model)  # top-p channels from the accumulated statistics
  elif want == "calibrate" and current == "fp4":
    qnn.reset_outlier_stats(model)  # the window starts here; earlier updates only ran its graph
  else:
    qnn.set_outcontrol_phase(model, PHASE_GRAPH[want])


def phase_graphdef(model: nnx.Module, phase: str) -> nnx.GraphDef:
  """The graph that runs run phase `phase` (`PHASE_GRAPH`; `model` is modified in place)."""
  qnn.set_outcontrol_phase(model, PHASE_GRAPH[phase])
  return nnx.graphdef(model)
