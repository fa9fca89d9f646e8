"""Training: arms, schedules, the jitted train step and loop, checkpoints, metrics."""

from tetrajet_jax.train.arms import ARMS, Arm, get_arm, parse_arms
from tetrajet_jax.train.checkpointing import Checkpointer, CheckpointError
from tetrajet_jax.train.metrics import MetricsWriter, read_jsonl
from tetrajet_jax.train.schedule import (CalibrationWindow, OsciResetScheduleError, OsciResetWindows, Schedule,
                                         default_lr_steps, scaled_calibration, scaled_osci_reset)
from tetrajet_jax.train.config import TrainConfig, TrainData, TrainResult
from tetrajet_jax.train.optimizer import build_optimizer
from tetrajet_jax.train.trainer import NonFiniteLossError, Trainer

__all__ = [
    "ARMS", "Arm", "CalibrationWindow", "CheckpointError", "Checkpointer", "MetricsWriter", "NonFiniteLossError",
    "OsciResetScheduleError", "OsciResetWindows", "Schedule", "TrainConfig", "TrainData", "TrainResult", "Trainer",
    "build_optimizer", "default_lr_steps", "get_arm", "parse_arms", "read_jsonl", "scaled_calibration",
    "scaled_osci_reset",
]
