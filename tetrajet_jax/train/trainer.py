"""Pretraining loop: one jitted, donated train step per batch, orbax checkpoints.

Typical use (the ablation runner does exactly this per arm)::

    cfg = TrainConfig(model="tiny", arm="tetrajet_v2_full", batch_size=8, seq_len=128,
                      total_steps=200)
    trainer = Trainer(cfg, data=TrainData.from_located(locate_data("bpe4096")),
                      workdir="results/demo/tetrajet_v2_full", resume=True)
    result = trainer.train()          # -> TrainResult(status="completed", ...)
    final = trainer.evaluate()        # full validation pass: loss, ppl, bits/byte

The train state is a plain pytree ``{"params", "model", "opt", "step"}``:
the model's float32 parameters, its other NNX variables (quantization key
streams, OutControl statistics and channels), the optax state (OsciReset's
included) and the number of completed updates. The step function is jitted
once per OutControl phase (``fp4`` -> ``calibrate`` -> ``frozen``; the phase
is static model structure) with explicit in/out shardings on a ``(data,
fsdp)`` mesh built from the config (all local devices on ``data`` by
default; every placement rule is in `tetrajet_jax.train.sharding`), and the
state is donated. On several processes (`tetrajet_jax.train.distributed`)
each one reads its own shard of the data (grain, sharded by process index)
and contributes its rows of every global batch; only process 0 writes
metrics, config.json and the progress bar, all processes write their shards
of each checkpoint.

Host loop: the metrics of step ``s`` are read after step ``s + 1`` has been
dispatched, so the device is never idle waiting on the host. Before every
checkpoint the newest step's metrics are checked, so no non-finite state is
ever saved; a NaN/Inf loss, gradient or parameter norm stops the run with
`NonFiniteLossError` naming the step and the last good checkpoint.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import math
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tetrajet_jax import nn as qnn
from tetrajet_jax.data.pipeline import make_train_dataset, make_val_dataset
from tetrajet_jax.evaluation.perplexity import batch_stats, padded_token_bytes, summarize_perplexity
from tetrajet_jax.model.configs import QUANT_BLOCK, ModelConfig, get_config
from tetrajet_jax.model.olmo2 import OLMo2, lm_loss
from tetrajet_jax.optim import osci_reset, osci_reset_metrics
from tetrajet_jax.train import sharding as sharding_lib
from tetrajet_jax.train.arms import Arm, get_arm
from tetrajet_jax.train.checkpointing import Checkpointer, CheckpointError
from tetrajet_jax.train.osci_monitor import find_monitor_state, osci_monitor
from tetrajet_jax.train.metrics import MetricsWriter, Throughput, peak_flops, to_host, truncate_jsonl
from tetrajet_jax.train.schedule import (CalibrationWindow, OsciResetWindows, Schedule, scaled_calibration,
                                         scaled_osci_reset)


_STEP_FNS: dict[Any, Callable] = {}
_EVAL_FNS: dict[Any, Callable] = {}


class NonFiniteLossError(RuntimeError):
  """The loss, gradient norm or parameter norm became NaN/Inf."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """Everything that determines a run's numbers (and what only affects logging).

  Attributes:
    model: model config name (`tetrajet_jax.model.CONFIGS`).
    arm: ablation arm (`tetrajet_jax.train.arms.ARMS`).
    batch_size: sequences per step (global).
    seq_len: tokens per sequence.
    total_steps: optimizer steps; the LR schedule ends here.
    warmup_steps: linear warmup; default 5% of total_steps (at least 1).
    peak_lr: default: the model config's ``peak_lr``.
    final_lr_ratio: LR at the end as a fraction of peak (spec: 0.1).
    weight_decay, b1, b2, eps, clip_norm: AdamW and clipping (spec 6).
    seed: model init and quantization key streams.
    data_seed: shuffle seed of the training windows.
    osci_start, osci_period, osci_window, osci_threshold: OsciReset
      placement; ``None`` = scaled to the schedule (`schedule.scaled_osci_reset`).
    calib_start, calib_steps: OutControl calibration window; ``None`` = scaled.
    layers: override the model config's number of blocks (quick experiments).
    monitor_oscillation: quantized arms without OsciReset measure the
      oscillating fraction on OsciReset's windows (`osci_monitor`).
    gemm: QuantLinear GEMM mode.
    scan_blocks: run identical blocks as one lax.scan (`OLMo2`; compiles
      one block graph instead of one per block); None: scan on the CPU,
      unroll on GPUs (`default_scan_blocks`).
    attention: ``"xla"`` or ``"cudnn"``.
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
  gemm: str = "fast"
  attention: str = "xla"
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
    if self.batch_size < 1 or self.seq_len < 1:
      raise ValueError(f"batch_size={self.batch_size} and seq_len={self.seq_len} must be >= 1.")
    tokens = self.batch_size * self.seq_len
    if arm.quantized and tokens % QUANT_BLOCK:
      raise ValueError(
          f"arm {self.arm!r}: batch_size x seq_len = {self.batch_size} x {self.seq_len} = {tokens} tokens "
          f"per step is not a multiple of {QUANT_BLOCK}; the weight-gradient quantizers (Q5/Q6) "
          f"quantize along tokens in 1x{QUANT_BLOCK} blocks. Use e.g. seq_len a multiple of {QUANT_BLOCK}.")
    if self.warmup_steps is None:
      object.__setattr__(self, "warmup_steps", max(1, round(0.05 * self.total_steps)))
    if self.peak_lr is None:
      object.__setattr__(self, "peak_lr", get_config(self.model).peak_lr)
    self.schedule  # pylint: disable=pointless-statement  (validates steps and LR)
    if self.layers is not None and self.layers < 1:
      raise ValueError(f"layers={self.layers} must be >= 1 (or None for the config's).")
    if arm.oscireset or (arm.quantized and self.monitor_oscillation):
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
                    final_ratio=self.final_lr_ratio)

  @property
  def osci_windows(self) -> OsciResetWindows:
    scaled = scaled_osci_reset(self.schedule, threshold=self.osci_threshold)
    return OsciResetWindows(
        start_step=scaled.start_step if self.osci_start is None else self.osci_start,
        period=scaled.period if self.osci_period is None else self.osci_period,
        window=scaled.window if self.osci_window is None else self.osci_window,
        threshold=self.osci_threshold)

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
  """

  train_tokens: Any
  val_tokens: Any
  vocab_size: int
  pad_id: int = 0
  token_bytes: np.ndarray | None = None
  name: str = ""

  @classmethod
  def from_located(cls, paths) -> "TrainData":
    """From `tetrajet_jax.data.locate_data(...)`'s result."""
    tok = paths.tokenizer()
    return cls(train_tokens=paths.split_path("train"), val_tokens=paths.split_path("val"),
               vocab_size=paths.vocab_size, pad_id=tok.pad_id, token_bytes=tok.token_byte_lengths(),
               name=paths.root.name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainResult:
  status: str  # "completed" | "interrupted" | "paused" (num_steps reached before the end)
  step: int
  last_metrics: dict[str, float]


def _decay_mask(params: Any) -> Any:
  """Weight decay on 2-D matrices except the embedding (spec 6); never on norm weights."""
  def decays(path, leaf):
    names = [str(getattr(k, "key", k)) for k in path]
    return leaf.ndim == 2 and not any("embed" in n for n in names)
  return jax.tree_util.tree_map_with_path(decays, params)


def build_optimizer(config: TrainConfig, *, param_filter: Callable | None = None
                    ) -> optax.GradientTransformationExtraArgs:
  """clip(1.0) -> AdamW(schedule) [-> OsciReset] over a pure param dict."""
  parts = [optax.clip_by_global_norm(config.clip_norm),
           optax.adamw(config.schedule.lr, b1=config.b1, b2=config.b2, eps=config.eps,
                       weight_decay=config.weight_decay, mask=_decay_mask)]
  w = config.osci_windows
  if config.arm_spec.oscireset:
    parts.append(osci_reset(start_step=w.start_step, period=w.period, window=w.window,
                            threshold=w.threshold, param_filter=param_filter))
  elif config.arm_spec.quantized and config.monitor_oscillation and param_filter is not None:
    # Same windows, measure only: the "without OsciReset" curve of the oscillation plot.
    parts.append(osci_monitor(start_step=w.start_step, period=w.period, window=w.window,
                              threshold=w.threshold, param_filter=param_filter))
  return optax.chain(*parts)


class Trainer:
  """Owns one run: model, optimizer, data iterator, checkpoints and metrics.

  Args:
    config: the run.
    data: token streams (`TrainData`).
    workdir: where ``metrics.jsonl``, ``tb/``, ``checkpoints/`` and
      ``config.json`` go; None keeps everything in memory (tests).
    resume: continue from the latest checkpoint in ``workdir`` if there is
      one (a corrupt or foreign checkpoint raises `CheckpointError`); without
      it, an existing checkpoint is an error, never silently overwritten.
    mesh: device mesh (default: `sharding.mesh_from_config(config)`).
    progress: show a tqdm bar (process 0 only).
    tensorboard: also write TensorBoard event files.
    async_checkpoints: orbax async saves.
  """

  def __init__(self, config: TrainConfig, data: TrainData, workdir: str | Path | None = None, *,
               resume: bool = False, mesh: jax.sharding.Mesh | None = None, progress: bool = True,
               tensorboard: bool = True, async_checkpoints: bool = True):
    self.config = config
    self.data = data
    self.arm = config.arm_spec
    self.workdir = Path(workdir) if workdir is not None else None
    self.is_main = jax.process_index() == 0
    self.progress = progress and self.is_main
    self.mesh = mesh if mesh is not None else sharding_lib.mesh_from_config(config)
    sharding_lib.check_batch(config.batch_size, self.mesh, seq_len=config.seq_len,
                             quantized=self.arm.quantized)
    base = get_config(config.model)
    self.model_config: ModelConfig = dataclasses.replace(
        base.with_vocab(data.vocab_size), attention=config.attention,
        num_layers=base.num_layers if config.layers is None else config.layers)

    model = OLMo2(self.model_config, recipe=self.arm.recipe, rngs=nnx.Rngs(config.seed), gemm=config.gemm,
                  scan_blocks=config.scan_blocks)
    self._param_filter = qnn.quantized_kernel_filter(model)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    self._graphdef = graphdef
    self._phase = "fp4"
    self.tx = build_optimizer(config, param_filter=self._param_filter)
    params = nnx.to_pure_dict(params)
    state = {"params": params, "model": nnx.to_pure_dict(rest), "opt": self.tx.init(params),
             "step": jnp.zeros((), jnp.int32)}
    self._state_shardings = sharding_lib.state_shardings(state, self.mesh, self._param_filter)
    self._batch_sharding = sharding_lib.batch_sharding(self.mesh)
    self.state = jax.device_put(state, self._state_shardings)
    self.step = 0

    # grain sharded by process: each process reads its windows and its rows of every batch.
    self._train_ds = make_train_dataset(data.train_tokens, seq_len=config.seq_len,
                                        batch_size=config.batch_size // jax.process_count(),
                                        seed=config.data_seed, shard_index=jax.process_index(),
                                        shard_count=jax.process_count())
    self._it = iter(self._train_ds)
    self.checkpointer = None
    self.writer = None
    self.throughput = Throughput(tokens_per_step=config.tokens_per_step,
                                 flops_per_token=self.model_config.flops_per_token(config.seq_len),
                                 peak=peak_flops())
    self.last_good_checkpoint: int | None = None
    self.history: list[dict[str, float]] = []  # host metrics of this session's steps
    self._t_train = time.perf_counter()  # reset by train()
    self._stop_signal: str | None = None
    if self.workdir is not None:
      self.workdir.mkdir(parents=True, exist_ok=True)
      # data_shards: the grain iterator state is per process, so the process count must match.
      meta = {"train": config.run_identity(), "model": dataclasses.asdict(self.model_config),
              "data": data.name, "data_shards": jax.process_count()}
      self.checkpointer = Checkpointer(self.workdir / "checkpoints", meta=meta,
                                       keep=config.keep_checkpoints, async_save=async_checkpoints,
                                       meta_defaults={"data_shards": 1})
      latest = self.checkpointer.latest_step()
      if latest is not None and not resume:
        raise CheckpointError(f"{self.workdir / 'checkpoints'} already holds checkpoint step {latest}; "
                              "pass resume=True (--resume) to continue it, or use another output folder.")
      if resume and latest is not None:
        self._restore(None)  # the newest intact checkpoint (damaged ones are skipped with a warning)
      elif resume and any(p.is_dir() for p in (self.workdir / "checkpoints").iterdir()):
        raise CheckpointError(f"{self.workdir / 'checkpoints'} has no complete checkpoint but is not "
                              f"empty ({sorted(p.name for p in (self.workdir / 'checkpoints').iterdir())});"
                              " refusing to start fresh over it. Inspect or delete it.")
      if self.is_main:
        (self.workdir / "config.json").write_text(json.dumps(
            {"train": dataclasses.asdict(config), "model": dataclasses.asdict(self.model_config),
             "data": data.name, "derived": self.derived()}, indent=2) + "\n", encoding="utf-8")
        truncate_jsonl(self.workdir / "metrics.jsonl", after_step=self.step)
        self.writer = MetricsWriter(self.workdir, tensorboard=tensorboard)

  # ---- state and phases ------------------------------------------------------------------

  def derived(self) -> dict[str, Any]:
    """Schedule-derived settings (for config.json and the docs)."""
    out: dict[str, Any] = {"tokens_per_step": self.config.tokens_per_step,
                           "total_tokens": self.config.tokens_per_step * self.config.total_steps,
                           "param_counts": self.model_config.param_counts(),
                           "bf16_blocks": sorted(self.model_config.bf16_blocks(self.arm.recipe)),
                           "mesh": dict(self.mesh.shape), "processes": jax.process_count()}
    if self.arm.oscireset:
      out["osci_reset"] = dataclasses.asdict(self.config.osci_windows)
    if self.arm.outcontrol:
      out["outcontrol_calibration"] = dataclasses.asdict(self.config.calibration)
    return out

  def model(self) -> OLMo2:
    """An NNX model holding the current state (a view; for evaluation and inspection)."""
    return nnx.merge(self._graphdef, self.state["params"], self.state["model"])

  def _phase_for_update(self, step: int) -> str:
    return self.config.calibration.phase(step) if self.arm.outcontrol else "fp4"

  def _ensure_phase(self, step: int) -> None:
    """Moves the OutControl phase to the one in force for update ``step``."""
    want = self._phase_for_update(step)
    if want == self._phase:
      return
    model = self.model()
    if want == "frozen" and self._phase == "calibrate":
      qnn.freeze_outlier_channels(model)  # top-p channels from the accumulated statistics
    else:
      qnn.set_outcontrol_phase(model, want)
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    self._graphdef = graphdef
    self.state = {**self.state, "model": jax.device_put(nnx.to_pure_dict(rest), self._state_shardings["model"])}
    self._phase = want
    self.throughput.reset()

  def _restore(self, step: int | None) -> None:
    restored_step, state = self.checkpointer.restore(self.state, self._it, step)
    self.state = jax.device_put(state, self._state_shardings)
    self.step = restored_step
    if int(self.state["step"]) != restored_step:
      raise CheckpointError(f"checkpoint {restored_step} holds state step {int(self.state['step'])}.")
    # The phase of the last completed update; `_ensure_phase` then does any
    # transition (incl. freezing) exactly as the uninterrupted run did.
    self._phase = self._phase_for_update(restored_step - 1) if restored_step > 0 else "fp4"
    if self._phase != "fp4":
      self._graphdef = self._phase_graphdef(self._phase)
    self.last_good_checkpoint = restored_step

  def _phase_graphdef(self, phase: str) -> nnx.GraphDef:
    """The model's graph with OutControl ``phase`` set (a static flag: it selects the compiled graphs)."""
    model = self.model()
    qnn.set_outcontrol_phase(model, phase)
    return nnx.graphdef(model)

  # ---- compiled functions ----------------------------------------------------------------

  def _make_step(self) -> Callable:
    graphdef, tx, cfg, mesh = self._graphdef, self.tx, self.config, self.mesh
    z_loss, schedule, oscireset = self.model_config.z_loss, cfg.schedule, self.arm.oscireset
    monitored = not oscireset and self.arm.quantized and cfg.monitor_oscillation
    param_shardings = self._state_shardings["params"]

    def train_step(state, batch):
      params, model_vars = state["params"], state["model"]

      def loss_of(p):
        model = nnx.merge(graphdef, sharding_lib.gather_for_compute(p, mesh), model_vars)
        logits = sharding_lib.constrain_activations(model(batch["inputs"]), mesh)
        loss, aux = lm_loss(logits, batch["targets"], z_loss=z_loss)
        return loss, (aux, nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.Param))))

      (loss, (aux, new_vars)), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
      grads = sharding_lib.constrain(grads, param_shardings)  # FSDP: reduce-scatter
      extra = {}
      if oscireset:
        extra["outlier_channels"] = qnn.outlier_channels_tree(nnx.merge(graphdef, params, new_vars), params)
      updates, opt = tx.update(grads, state["opt"], params, **extra)
      new_params = optax.apply_updates(params, updates)
      metrics = {"train/loss": loss, "train/ce": aux["ce"], "train/z_loss": aux["z_loss"],
                 "train/grad_norm": optax.tree.norm(grads),
                 "train/param_norm": optax.tree.norm(new_params),
                 "train/lr": schedule.lr(state["step"])}
      if oscireset:
        metrics.update(osci_reset_metrics(opt))
      elif monitored:
        metrics["osci/risk_frac"] = find_monitor_state(opt).risk_frac
      return {"params": new_params, "model": new_vars, "opt": opt, "step": state["step"] + 1}, metrics

    return jax.jit(train_step, in_shardings=(self._state_shardings, self._batch_sharding),
                   out_shardings=(self._state_shardings, sharding_lib.replicated(self.mesh)),
                   donate_argnums=0)

  def _cache_key(self) -> tuple:
    return (self._graphdef, json.dumps(self.config.run_identity(), sort_keys=True), self.mesh,
            jax.tree.structure(self.state))

  def _step_fn(self) -> Callable:
    # Shared across Trainer instances of the same run (resume, tests): the
    # function is fully determined by the key, so recompiling would be waste.
    key = self._cache_key()
    if key not in _STEP_FNS:
      _STEP_FNS[key] = self._make_step()
    return _STEP_FNS[key]

  def precompile(self, logits_shapes: Sequence[tuple[int, int]] = ()) -> list[str]:
    """Compiles what the rest of the run will: the train step of every OutControl
    phase it goes through, the validation pass (batch_size rows) of each phase
    it evaluates in and of the final one, and the forward (`logits_fn`) of the
    final phase at ``logits_shapes`` ([batch, length] token shapes, e.g.
    downstream scoring's length buckets).

    Nothing runs and the state is untouched. Useful with JAX's persistent
    compilation cache on (`jax_compilation_cache_dir`): several runs compile
    side by side on a many-core host, then each loads its functions from the
    cache when it takes its turn on the GPU. Returns the phases compiled.
    """
    cfg = self.config
    spec = jax.ShapeDtypeStruct((cfg.batch_size, cfg.seq_len), jnp.int32, sharding=self._batch_sharding)
    steps = range(self.step, cfg.total_steps)
    if not steps:  # the run is over
      return []
    phases = list(dict.fromkeys(self._phase_for_update(s) for s in steps))
    final_phase = self._phase_for_update(cfg.total_steps - 1)
    eval_phases = {self._phase_for_update(s) for s in steps if cfg.eval_every and (s + 1) % cfg.eval_every == 0}
    eval_phases.add(final_phase)  # periodic validation's last one, or a caller's final `evaluate`
    ds, tb = self._val_inputs(cfg.batch_size)
    local = next(iter(ds))
    val_batch = sharding_lib.global_batch({k: local[k] for k in ("inputs", "targets", "weights")}, self.mesh)
    params, model_vars = self.state["params"], self.state["model"]
    graphdef, lowered = self._graphdef, []
    try:
      for phase in phases:
        self._graphdef = graphdef if phase == self._phase else self._phase_graphdef(phase)
        lowered.append(self._step_fn().lower(self.state, {"inputs": spec, "targets": spec}))
        if phase in eval_phases:
          lowered.append(self._eval_fn().lower(params, model_vars, val_batch, tb))
        if phase == final_phase:
          rep = sharding_lib.replicated(self.mesh)
          lowered += [self._logits_jit().lower(params, model_vars, jax.ShapeDtypeStruct(shape, jnp.int32, sharding=rep))
                      for shape in logits_shapes]
    finally:
      self._graphdef = graphdef
    # XLA compiles outside the GIL: the functions compile at once.
    with concurrent.futures.ThreadPoolExecutor(len(lowered)) as pool:
      list(pool.map(lambda low: low.compile(), lowered))
    return phases

  def logits_fn(self) -> Callable[[jax.Array], jax.Array]:
    """``tokens int32[B,T] -> float32 logits`` with the current state (no state change).

    Any batch shape: the tokens (the same on every process) are replicated
    and so are the logits; parameters stay where they are (FSDP-split ones
    are gathered inside). For downstream scoring; `evaluate` is the sharded
    validation pass.
    """
    fn = self._logits_jit()
    params, model_vars = self.state["params"], self.state["model"]
    return lambda tokens: fn(params, model_vars,
                             sharding_lib.replicated_input(np.asarray(tokens, np.int32), self.mesh))

  def _logits_jit(self) -> Callable:
    """Jitted ``(params, model vars, tokens) -> logits``, all replicated but FSDP-split parameters."""
    key = ("logits", self._graphdef, self.mesh, jax.tree.structure(self.state))
    if key not in _EVAL_FNS:
      graphdef, mesh = self._graphdef, self.mesh
      rep = sharding_lib.replicated(mesh)
      _EVAL_FNS[key] = jax.jit(
          lambda params, model_vars, tokens: nnx.merge(
              graphdef, sharding_lib.gather_for_compute(params, mesh), model_vars)(tokens),
          in_shardings=(self._state_shardings["params"], self._state_shardings["model"], rep),
          out_shardings=rep)
    return _EVAL_FNS[key]

  def _eval_fn(self) -> Callable:
    """Jitted ``(params, model vars, batch, token bytes) -> (nll sum, tokens, bytes)``, batch split like training."""
    key = ("eval", self._graphdef, self.mesh, jax.tree.structure(self.state))
    if key not in _EVAL_FNS:
      graphdef, mesh = self._graphdef, self.mesh
      rep = sharding_lib.replicated(mesh)

      def stats(params, model_vars, batch, token_bytes):
        model = nnx.merge(graphdef, sharding_lib.gather_for_compute(params, mesh), model_vars)
        logits = sharding_lib.constrain_activations(model(batch["inputs"]), mesh)
        return batch_stats(logits, batch["targets"], batch["weights"], token_bytes)

      _EVAL_FNS[key] = jax.jit(
          stats, in_shardings=(self._state_shardings["params"], self._state_shardings["model"],
                               self._batch_sharding, rep),
          out_shardings=rep)
    return _EVAL_FNS[key]

  def _val_inputs(self, batch_size: int):
    """(this process's validation batches, replicated token byte lengths)."""
    sharding_lib.check_batch(batch_size, self.mesh, what="eval batch_size")
    ds = make_val_dataset(self.data.val_tokens, seq_len=self.config.seq_len,
                          batch_size=batch_size // jax.process_count(), shard_index=jax.process_index(),
                          shard_count=jax.process_count(), pad_id=self.data.pad_id)
    tb = sharding_lib.replicated_input(
        padded_token_bytes(self.data.token_bytes, self.model_config.padded_vocab), self.mesh)
    return ds, tb

  def evaluate(self, max_batches: int | None = None, batch_size: int | None = None) -> dict[str, float]:
    """Validation loss, perplexity and bits per byte (None: the whole split).

    The same numbers as `evaluation.perplexity.evaluate_perplexity` (tested),
    computed with the batch split over the mesh and the val split sharded by
    process; the sums are global (replicated) arrays.
    """
    ds, tb = self._val_inputs(batch_size or self.config.batch_size)
    fn = self._eval_fn()
    nll_sum, n_tok, n_bytes = 0.0, 0.0, 0.0
    for i, local in enumerate(ds):
      if max_batches is not None and i >= max_batches:
        break
      batch = sharding_lib.global_batch({k: local[k] for k in ("inputs", "targets", "weights")}, self.mesh)
      nll, count, nb = fn(self.state["params"], self.state["model"], batch, tb)
      nll_sum += float(nll)
      n_tok += float(count)
      n_bytes += float(nb)
    return summarize_perplexity(nll_sum, n_tok, n_bytes, has_bytes=self.data.token_bytes is not None)

  # ---- the loop --------------------------------------------------------------------------

  @contextlib.contextmanager
  def _signals(self):
    """SIGTERM/SIGINT ask the loop to checkpoint and stop after the current step."""
    if threading.current_thread() is not threading.main_thread():
      yield
      return

    def handler(signum, frame):
      del frame
      self._stop_signal = signal.Signals(signum).name

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
      yield
    finally:
      for s, h in old.items():
        signal.signal(s, h)

  def _consume(self, step: int, metrics: dict[str, Any], bar) -> dict[str, float]:
    """Reads one step's metrics (blocking on that step only), checks them, logs them."""
    host = to_host(metrics)
    host.update(self.throughput.tick())
    # Wall clock since this session's train() began: with the eval times it
    # shows where a run's time went (compiles, phase switches, evaluations).
    host["perf/elapsed_s"] = time.perf_counter() - self._t_train
    bad = [k for k in ("train/loss", "train/grad_norm", "train/param_norm") if not math.isfinite(host[k])]
    if self.writer is not None:
      self.writer.write(step, host)
    self.history.append({"step": step, **host})
    if bad:
      if self.checkpointer is not None:
        self.checkpointer.wait()
      where = (f"the last good checkpoint is step {self.last_good_checkpoint} in "
               f"{self.checkpointer.directory} (nothing was saved after the bad step); resume from it with "
               "--resume, e.g. with a lower LR" if self.checkpointer is not None and
               self.last_good_checkpoint is not None else "no checkpoint was written")
      raise NonFiniteLossError(
          f"step {step}: non-finite {', '.join(f'{k}={host[k]}' for k in bad)} (arm {self.arm.name}, "
          f"lr {host.get('train/lr', float('nan')):.3g}); stopping. {where}.")
    if bar is not None:
      bar.update(1)
      post = {"loss": f"{host['train/loss']:.3f}", "lr": f"{host['train/lr']:.2e}"}
      if "perf/tokens_per_s" in host:
        post["tok/s"] = f"{host['perf/tokens_per_s']:.0f}"
      bar.set_postfix(post, refresh=False)
    return host

  def save(self) -> None:
    if self.checkpointer is not None:
      self.checkpointer.save(self.step, self.state, self._it)
      self.last_good_checkpoint = self.step

  def _next_batch(self) -> dict[str, jax.Array]:
    batch = next(self._it)  # this process's rows
    return sharding_lib.global_batch({"inputs": batch["inputs"], "targets": batch["targets"]}, self.mesh)

  def train(self, num_steps: int | None = None) -> TrainResult:
    """Trains until the schedule ends (or ``num_steps`` more steps, or a signal).

    Raises:
      NonFiniteLossError: a NaN/Inf loss, gradient norm or parameter norm.
    """
    cfg = self.config
    end = cfg.total_steps if num_steps is None else min(cfg.total_steps, self.step + num_steps)
    bar = None
    if self.progress:
      from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel

      bar = tqdm(total=cfg.total_steps, initial=self.step, desc=f"{cfg.model}/{self.arm.name}",
                 dynamic_ncols=True, mininterval=1.0)
    last: dict[str, float] = {}
    pending = None
    self._stop_signal = None
    self.throughput.reset()
    self._t_train = time.perf_counter()
    try:
      with self._signals():
        while self.step < end:
          step = self.step
          self._ensure_phase(step)
          batch = self._next_batch()
          t_call = time.perf_counter()
          self.state, metrics = self._step_fn()(self.state, batch)
          if pending is None and not last and self.is_main:
            # The first call of a run compiles the step (minutes for FP4 arms on a GPU): say so.
            print(f"{self.arm.name}: step {step} compiled and dispatched in {time.perf_counter() - t_call:.1f} s",
                  flush=True)
          if pending is not None:
            last = self._consume(*pending, bar)
          pending = (step, metrics)
          self.step = step + 1
          save = self.checkpointer is not None and (
              (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0)
              or self.step == end or self._stop_signal is not None)
          evaluate = cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == cfg.total_steps)
          if save or evaluate:
            last = self._consume(*pending, bar)  # never checkpoint an unchecked state
            pending = None
          if save:
            self.save()
          if evaluate:
            t_eval = time.perf_counter()
            val = self.evaluate(max_batches=cfg.eval_batches)
            vals = {f"val/{k}": v for k, v in val.items() if k in ("loss", "ppl", "bits_per_byte")}
            vals["perf/eval_s"] = time.perf_counter() - t_eval  # the first one includes compiling
            if self.writer is not None:
              self.writer.write(step, vals)
            last.update(vals)
            self.throughput.reset()
          if self._stop_signal is not None:
            break
        if pending is not None:
          last = self._consume(*pending, bar)
    finally:
      if bar is not None:
        bar.close()
      if self.checkpointer is not None:
        self.checkpointer.wait()
    if self._stop_signal is not None:
      status = "interrupted"
    else:
      status = "completed" if self.step >= cfg.total_steps else "paused"
    return TrainResult(status=status, step=self.step, last_metrics=last)

  def close(self) -> None:
    if self.checkpointer is not None:
      self.checkpointer.close()
    if self.writer is not None:
      self.writer.close()


def inject_nan(trainer: Trainer, leaf_path: tuple[str, ...] = ("final_norm", "weight")) -> None:
  """Poisons one parameter with NaN (for testing the non-finite stop)."""
  params = trainer.state["params"]
  node = params
  for k in leaf_path[:-1]:
    node = node[k]
  node[leaf_path[-1]] = jnp.full_like(node[leaf_path[-1]], jnp.nan)
  trainer.state = {**trainer.state, "params": params}
