"""What a training run is: its configuration, its data and its result."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tetrajet_jax.linear import recipes
from tetrajet_jax.model.configs import get_config
from tetrajet_jax.numerics.nvfp4 import OUTER_BLOCK
from tetrajet_jax.train.arms import Arm, get_arm
from tetrajet_jax.train.schedule import (OSCI_PERIOD, OSCI_WINDOW, CalibrationWindow, OsciResetWindows, Schedule,
                                         default_lr_steps, scaled_calibration,
                                         scaled_osci_reset)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """Everything that determines a run's numbers (and what only affects logging).

  Attributes:
    model: model config name (`tetrajet_jax.model.CONFIGS`).
    arm: ablation arm (`tetrajet_jax.train.arms.ARMS`).
    batch_size: sequences per step (global).
    seq_len: tokens per sequence.
    total_steps: optimizer steps; the LR schedule ends here.
    warmup_steps: linear warmup; default 2% of t_max (`schedule.default_lr_steps`).
    t_max_steps: where the cosine reaches the floor (then flat to the end);
      default 95.3% of total_steps (the paper's 70M ratio).
    peak_lr: default: the model config's ``peak_lr``.
    final_lr_ratio: the LR floor (at t_max and after) as a fraction of peak (0.1).
    weight_decay, b1, b2, eps, clip_norm: AdamW and clipping (docs/SPEC.md section 6).
    seed: model init and quantization key streams.
    data_seed: shuffle seed of the training windows.
    osci_start, osci_period, osci_window, osci_threshold: OsciReset
      placement; ``None`` = the reference T = 50, P = 200 with S scaled to
      the schedule (`schedule.scaled_osci_reset`, which refuses a run with
      room for fewer than 3 resets unless period or window is given).
    calib_start, calib_steps: OutControl calibration window; ``None`` = scaled.
    layers: override the model config's number of blocks (quick experiments).
    monitor_oscillation: quantized arms without OsciReset measure the
      oscillating fraction on OsciReset's windows (`osci_reset(apply=False)`).
    backend: execution backend of the quantized linears (`Recipe.backend`:
      "auto", "xla", "pallas" or "reference").
    scan_blocks: run identical blocks as one lax.scan (`OLMo2`; compiles
      one block graph instead of one per block); None: scan on the CPU,
      unroll on GPUs (`default_scan_blocks`).
    attention: ``"auto"`` (cuDNN flash attention on a GPU, XLA elsewhere),
      ``"xla"`` or ``"cudnn"``.
    eval_every: periodic validation every N steps (0: only when asked).
    eval_batches: batches per periodic validation.
    checkpoint_every: save every N steps (0: only at the end and on signals).
    keep_checkpoints: how many checkpoints to keep.
    mesh_data: devices on the mesh's ``data`` axis; None = all devices not
      on ``fsdp``.
    mesh_fsdp: devices on the ``fsdp`` axis (parameters and optimizer state
      are split over it; `tetrajet_jax.train.sharding`).
  """

  model: str
  arm: str
  batch_size: int
  seq_len: int
  total_steps: int
  warmup_steps: int | None = None
  t_max_steps: int | None = None
  peak_lr: float | None = None
  final_lr_ratio: float = 0.1
  weight_decay: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  clip_norm: float = 1.0
  seed: int = 0
  data_seed: int = 0
  osci_start: int | None = None
  osci_period: int | None = None
  osci_window: int | None = None
  osci_threshold: float = 8.0
  calib_start: int | None = None
  calib_steps: int | None = None
  backend: str = "auto"
  attention: str = "auto"
  eval_every: int = 0
  eval_batches: int = 4
  checkpoint_every: int = 0
  keep_checkpoints: int = 2
  layers: int | None = None
  monitor_oscillation: bool = True
  mesh_data: int | None = None
  mesh_fsdp: int = 1
  scan_blocks: bool | None = None

  # Fields that do not change a single number of the run; a checkpoint may be
  # resumed with other values.
  LOGGING_FIELDS = ("eval_every", "eval_batches", "checkpoint_every", "keep_checkpoints")
  # Where and how the run is placed: changes numbers only by float reduction
  # order (tests/test_distributed.py; scanned vs unrolled blocks:
  # tests/test_model.py), so a checkpoint restores onto any mesh and layout.
  PLACEMENT_FIELDS = ("mesh_data", "mesh_fsdp", "scan_blocks")

  def __post_init__(self):
    get_config(self.model)  # unknown names list the valid ones
    arm = get_arm(self.arm)
    if self.backend not in recipes.BACKENDS:
      raise ValueError(f"backend={self.backend!r}; use one of {', '.join(recipes.BACKENDS)}.")
    if self.batch_size < 1 or self.seq_len < 1:
      raise ValueError(f"batch_size={self.batch_size} and seq_len={self.seq_len} must be >= 1.")
    tokens = self.batch_size * self.seq_len
    if arm.quantized and tokens % OUTER_BLOCK:
      raise ValueError(
          f"arm {self.arm!r}: batch_size x seq_len = {self.batch_size} x {self.seq_len} = {tokens} tokens "
          f"per step is not a multiple of {OUTER_BLOCK}; the weight-gradient quantizers (Q5/Q6) "
          f"quantize along tokens in 1x{OUTER_BLOCK} blocks. Use e.g. seq_len a multiple of {OUTER_BLOCK}.")
    warmup, t_max = default_lr_steps(self.total_steps, self.warmup_steps, self.t_max_steps)
    object.__setattr__(self, "warmup_steps", warmup)
    object.__setattr__(self, "t_max_steps", t_max)
    if self.peak_lr is None:
      object.__setattr__(self, "peak_lr", get_config(self.model).peak_lr)
    self.schedule  # pylint: disable=pointless-statement  (validates steps and LR)
    if self.layers is not None and self.layers < 1:
      raise ValueError(f"layers={self.layers} must be >= 1 (or None for the config's).")
    if arm.oscireset:  # measure-only monitoring just records nothing if its windows do not fit
      w = self.osci_windows
      if w.start_step + w.window > self.total_steps:
        raise ValueError(f"OsciReset's first window [{w.start_step}, {w.start_step + w.window}) ends "
                         f"after the run's {self.total_steps} steps; lower --osci-start or train longer.")
    if arm.outcontrol:
      self.calibration  # pylint: disable=pointless-statement
    for name in ("eval_every", "checkpoint_every"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 0 (0 disables).")
    if self.mesh_fsdp < 1 or (self.mesh_data is not None and self.mesh_data < 1 and self.mesh_data != -1):
      raise ValueError(f"mesh data={self.mesh_data}, fsdp={self.mesh_fsdp}: sizes must be >= 1 "
                       "(data None or -1: all remaining devices).")

  @property
  def arm_spec(self) -> Arm:
    return get_arm(self.arm)

  @property
  def tokens_per_step(self) -> int:
    return self.batch_size * self.seq_len

  @property
  def schedule(self) -> Schedule:
    return Schedule(total_steps=self.total_steps, warmup_steps=self.warmup_steps, peak_lr=self.peak_lr,
                    final_ratio=self.final_lr_ratio, t_max_steps=self.t_max_steps)

  @property
  def osci_windows(self) -> OsciResetWindows:
    # Measure-only monitoring (arms without OsciReset) never refuses a short run.
    if not self.arm_spec.oscireset and self.osci_period is None and self.osci_window is None:
      return scaled_osci_reset(self.schedule, threshold=self.osci_threshold, start=self.osci_start,
                               period=OSCI_PERIOD, window=OSCI_WINDOW)
    return scaled_osci_reset(self.schedule, threshold=self.osci_threshold, start=self.osci_start,
                             period=self.osci_period, window=self.osci_window)

  @property
  def calibration(self) -> CalibrationWindow:
    if self.calib_start is None and self.calib_steps is None:
      return scaled_calibration(self.schedule)
    scaled = scaled_calibration(self.schedule)
    return CalibrationWindow(start=scaled.start if self.calib_start is None else self.calib_start,
                             length=scaled.length if self.calib_steps is None else self.calib_steps)

  def run_identity(self) -> dict[str, Any]:
    """The fields a checkpoint must match to be resumed (logging fields excluded)."""
    d = dataclasses.asdict(self)
    for k in self.LOGGING_FIELDS + self.PLACEMENT_FIELDS:
      d.pop(k)
    return d

  def identity_key(self) -> tuple:
    """`run_identity` as a hashable key (for caching compiled functions)."""
    return tuple(sorted(self.run_identity().items()))


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainData:
  """Token streams and tokenizer facts the trainer needs.

  Attributes:
    train_tokens: the train split (``.npy`` path or 1-D array).
    val_tokens: the validation split.
    vocab_size: tokenizer vocabulary.
    pad_id: id used to pad validation windows (weight 0).
    token_bytes: UTF-8 bytes per id (for bits per byte), or None.
    name: tokenizer / data name (recorded in checkpoints).
    root: the data's ``tokenized/<name>`` folder, if known (recorded in
      config.json, so a saved run can be evaluated later).
    val_groups: ``{group: tokens}`` held-out documents per source group
      (``prose``, ``code``), each scored on its own by `Trainer.evaluate`;
      empty: the val split alone.
  """

  train_tokens: Any
  val_tokens: Any
  vocab_size: int
  pad_id: int = 0
  token_bytes: np.ndarray | None = None
  name: str = ""
  root: str = ""
  val_groups: dict[str, Any] = dataclasses.field(default_factory=dict)

  @classmethod
  def from_located(cls, paths) -> "TrainData":
    """From `tetrajet_jax.data.locate_data(...)`'s result."""
    tok = paths.tokenizer()
    return cls(train_tokens=paths.split_path("train"), val_tokens=paths.split_path("val"),
               vocab_size=paths.vocab_size, pad_id=tok.pad_id, token_bytes=tok.token_byte_lengths(),
               name=paths.root.name, root=str(paths.root), val_groups=paths.val_group_paths())


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainResult:
  status: str  # "completed" | "interrupted" | "paused" (num_steps reached before the end)
  step: int
  last_metrics: dict[str, float]
