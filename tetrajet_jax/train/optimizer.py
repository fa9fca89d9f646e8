"""The optimizer: clip -> AdamW (decay mask) [-> OsciReset, or its monitor mode]."""

from __future__ import annotations

from typing import Any, Callable

import jax
import optax

from tetrajet_jax.optim import osci_reset, window_phase_of
from tetrajet_jax.train.config import TrainConfig
from tetrajet_jax.tree_paths import path_strs


def monitors_oscillation(config: TrainConfig) -> bool:
  """Quantized arms without OsciReset run its monitor mode (`monitor_oscillation`)."""
  arm = config.arm_spec
  return not arm.oscireset and arm.quantized and config.monitor_oscillation


def _decay_mask(params: Any) -> Any:
  """Weight decay on every matrix, norm weight and bias, not on the embedding (docs/SPEC.md
  section 6; the reference configs' decay_norm_and_bias)."""
  def decays(path, leaf):
    del leaf
    return not any("embed" in n for n in path_strs(path))
  return jax.tree_util.tree_map_with_path(decays, params)


def split_optimizer(config: TrainConfig, *, param_filter: Callable | None = None
                    ) -> tuple[optax.GradientTransformationExtraArgs, optax.GradientTransformationExtraArgs | None]:
  """(clip -> AdamW, then OsciReset, its monitor or None): `build_optimizer`'s chain
  as the two halves a split train step runs (`step.oscillation_step`). The
  chain's state is the tuple of its members' states, so the first half's state
  is the chain's minus its last entry and the second half's is that entry."""
  w = config.osci_windows
  windows = dict(start_step=w.start_step, period=w.period, window=w.window, threshold=w.threshold,
                 param_filter=param_filter)
  osci = None
  if config.arm_spec.oscireset:
    osci = osci_reset(**windows)
  elif monitors_oscillation(config) and param_filter is not None:
    # Same windows, measure only: the "without OsciReset" curve of the oscillation plot.
    osci = osci_reset(**windows, apply=False)
  return optax.chain(*_main_members(config)), osci


def osci_window_phase(config: TrainConfig, step: int) -> str:
  """Where update ``step`` falls in the windows of the OsciReset member (or monitor) that
  `split_optimizer` builds. The trainer passes it from the host, so the compiled update holds
  no device-side conditional, which on a GPU makes the host wait for the stream every update."""
  w = config.osci_windows
  return window_phase_of(step, start_step=w.start_step, period=w.period, window=w.window)


def _main_members(config: TrainConfig) -> list[optax.GradientTransformation]:
  return [optax.clip_by_global_norm(config.clip_norm),
          optax.adamw(config.schedule.lr, b1=config.b1, b2=config.b2, eps=config.eps,
                      weight_decay=config.weight_decay, mask=_decay_mask)]


def build_optimizer(config: TrainConfig, *, param_filter: Callable | None = None
                    ) -> optax.GradientTransformationExtraArgs:
  """clip(1.0) -> AdamW(schedule) [-> OsciReset] over a pure param dict (one flat chain)."""
  main, osci = split_optimizer(config, param_filter=param_filter)
  return main if osci is None else optax.chain(*_main_members(config), osci)
