"""Pretraining loop: one jitted, donated train step per batch, orbax checkpoints.

Typical use (the ablation runner does exactly this per arm)::

    cfg = TrainConfig(model="tiny", arm="tetrajet_v2_full", batch_size=8, seq_len=128, total_steps=200)
    trainer = Trainer(cfg, data=TrainData.from_located(locate_data("bpe4096")),
                      workdir="results/demo/tetrajet_v2_full", resume=True)
    result = trainer.train()          # -> TrainResult(status="completed", ...)
    final = trainer.evaluate()        # full validation pass: loss, ppl, bits/byte, per-batch losses

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
metrics, config.json and the progress bar; all write their checkpoint shards.

Host loop: the metrics of step ``s`` are read after step ``s + 1`` has been
dispatched, so the device is never idle waiting on the host. Before every
checkpoint the newest step's metrics are checked, so no non-finite state is
ever saved; a NaN/Inf loss, gradient or parameter norm stops the run with `NonFiniteLossError`.
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
from flax import nnx

from tetrajet_jax import nn as qnn
from tetrajet_jax.data.pipeline import make_train_dataset, make_val_dataset
from tetrajet_jax.evaluation.perplexity import padded_token_bytes
from tetrajet_jax.model.configs import ModelConfig, get_config
from tetrajet_jax.model.olmo2 import OLMo2
from tetrajet_jax.optim import is_layer_metric
from tetrajet_jax.train import outcontrol
from tetrajet_jax.train import sharding as sharding_lib
from tetrajet_jax.train import step as step_lib
from tetrajet_jax.train import validation
from tetrajet_jax.train.checkpointing import Checkpointer, CheckpointError
from tetrajet_jax.train.config import TrainConfig, TrainData, TrainResult
from tetrajet_jax.train.metrics import (METRICS_FILE, MetricsWriter, Throughput, peak_flops, to_host,
                                        truncate_jsonl)
from tetrajet_jax.train.optimizer import build_optimizer, osci_window_phase, split_optimizer

__all__ = ["NonFiniteLossError", "TrainConfig", "TrainData", "TrainResult", "Trainer", "build_optimizer"]


class NonFiniteLossError(RuntimeError):
  """The loss, gradient or parameter norm became NaN/Inf; the message names the step and last good checkpoint."""


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

    self._init_state()
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
      self._init_workdir(resume, tensorboard=tensorboard, async_checkpoints=async_checkpoints)

  def _init_state(self) -> None:
    """The model (block linears converted by the arm), optimizer and placed state."""
    config = self.config
    model = OLMo2(self.model_config, rngs=nnx.Rngs(config.seed), scan_blocks=config.scan_blocks)
    self.arm.quantize(model, backend=sharding_lib.layer_backend(config.backend, self.mesh))
    outcontrol.phase_graphdef(model, "fp4")  # the graph a run's first updates execute (train/outcontrol.py)
    self._param_filter = qnn.quantized_kernel_filter(model)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    self._graphdef = graphdef
    self._phase = "fp4"
    self.tx = build_optimizer(config, param_filter=self._param_filter)
    # OsciReset (or its monitor) runs as a second, separately compiled function (`step.oscillation_step`).
    self._tx_main, self._tx_osci = split_optimizer(config, param_filter=self._param_filter)
    params = nnx.to_pure_dict(params)
    state = {"params": params, "model": nnx.to_pure_dict(rest), "opt": self.tx.init(params),
             "step": jnp.zeros((), jnp.int32)}
    self._state_shardings = sharding_lib.state_shardings(state, self.mesh, self._param_filter)
    self._batch_sharding = sharding_lib.batch_sharding(self.mesh)
    self.state = jax.device_put(state, self._state_shardings)
    self.step = 0

  def _init_workdir(self, resume: bool, *, tensorboard: bool, async_checkpoints: bool) -> None:
    """Checkpointer (restoring when resuming), config.json and the metrics writer."""
    config, data = self.config, self.data
    self.workdir.mkdir(parents=True, exist_ok=True)
    self.checkpointer = Checkpointer(self.workdir / "checkpoints", meta=self.checkpoint_meta(),
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
           "data": data.name, "data_root": data.root, "derived": self.derived()}, indent=2) + "\n",
          encoding="utf-8")
      truncate_jsonl(self.workdir / METRICS_FILE, after_step=self.step)
      self.writer = MetricsWriter(self.workdir, tensorboard=tensorboard, changes_only=is_layer_metric)

  # ---- state and phases ------------------------------------------------------------------

  def derived(self) -> dict[str, Any]:
    """Schedule-derived settings (for config.json and the docs)."""
    out: dict[str, Any] = {"tokens_per_step": self.config.tokens_per_step,
                           "total_tokens": self.config.tokens_per_step * self.config.total_steps,
                           "param_counts": self.model_config.param_counts(),
                           "bf16_blocks": sorted(self.arm.bf16_blocks(self.model_config.num_layers)),
                           "mesh": dict(self.mesh.shape), "processes": jax.process_count()}
    if self.arm.oscireset:
      out["osci_reset"] = dataclasses.asdict(self.config.osci_windows)
    if self.arm.outcontrol:
      out["outcontrol_calibration"] = dataclasses.asdict(self.config.calibration)
      out["outcontrol_fraction"] = qnn.outlier_fractions(self.model())  # effective n/K per layer
    return out

  def model(self) -> OLMo2:
    """An NNX model holding the current state (a view; for evaluation and inspection)."""
    return nnx.merge(self._graphdef, self.state["params"], self.state["model"])

  def _phase_for_update(self, step: int) -> str:
    return outcontrol.phase_for_update(self.config, step)

  def _ensure_phase(self, step: int) -> None:
    """Moves the OutControl phase to the one in force for update ``step``."""
    want = self._phase_for_update(step)
    if want == self._phase:
      return
    model = self.model()
    outcontrol.enter_phase(model, self._phase, want)
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    self._graphdef = graphdef
    self.state = {**self.state, "model": jax.device_put(nnx.to_pure_dict(rest), self._state_shardings["model"])}
    self._phase = want
    self.throughput.reset()

  def checkpoint_meta(self) -> dict[str, Any]:
    """What this run's checkpoints record and restore checks (grain's state is per process: so is the count)."""
    return {"train": self.config.run_identity(), "model": dataclasses.asdict(self.model_config),
            "data": self.data.name, "data_shards": jax.process_count()}

  def restore(self, checkpointer: Checkpointer, step: int | None = None) -> int:
    """Loads ``step`` (None: the newest intact one) of ``checkpointer``'s run, e.g. to evaluate it; returns it."""
    self.checkpointer = checkpointer
    self._restore(step)
    return self.step

  def _restore(self, step: int | None) -> None:
    restored_step, state = self.checkpointer.restore(self.state, self._it, step)
    self.state = jax.device_put(state, self._state_shardings)
    self.step = restored_step
    if int(self.state["step"]) != restored_step:
      raise CheckpointError(f"checkpoint {restored_step} holds state step {int(self.state['step'])}.")
    # The phase of the last completed update; `_ensure_phase` then does any
    # transition (incl. freezing) exactly as the uninterrupted run did.
    self._phase = self._phase_for_update(restored_step - 1) if restored_step > 0 else "fp4"
    self._graphdef = self._phase_graphdef(self._phase)
    self.last_good_checkpoint = restored_step

  def _phase_graphdef(self, phase: str) -> nnx.GraphDef:  # OutControl's phase: a static flag of the graph
    return outcontrol.phase_graphdef(self.model(), phase)

  # ---- compiled functions ----------------------------------------------------------------

  def _compiled(self, kind: str, build: Callable[[], Callable]) -> Callable:
    key = (kind, self._graphdef, self.config.identity_key(), self.mesh, jax.tree.structure(self.state))
    return step_lib.COMPILED.get(key, build)

  def _step_fn(self) -> Callable:
    """The jitted train step, or with an OsciReset member the first half (`step.update_step`)."""
    consts = dict(graphdef=self._graphdef, z_loss=self.model_config.z_loss, schedule=self.config.schedule)
    if self._tx_osci is None:
      return self._compiled("train", lambda: step_lib.jit_train_step(
          self._state_shardings, self._batch_sharding, self.mesh, tx=self.tx, **consts))
    return self._compiled("update", lambda: step_lib.jit_update_step(
        self._state_shardings, self._batch_sharding, self.mesh, tx=self._tx_main, **consts))

  def _oscillation_fn(self) -> Callable:
    return self._compiled("oscillation", lambda: step_lib.jit_oscillation_step(
        self._state_shardings, self.mesh, graphdef=self._graphdef, tx=self._tx_osci,
        oscireset=self.arm.oscireset))

  def _window_phase(self, step: int) -> str | None:  # OsciReset's update count is the trainer's step
    return None if self._tx_osci is None else osci_window_phase(self.config, step)

  def _update_fns(self) -> tuple[Callable, Callable | None]:
    """The jitted functions of one update: (train step, None) or a split update's two halves."""
    return self._step_fn(), (None if self._tx_osci is None else self._oscillation_fn())

  def precompile(self, logits_shapes: Sequence[tuple[int, int]] = (), *, evaluation: bool = True) -> list[str]:
    """Compiles `lower_run`'s functions, each once lowered (XLA compiles outside the GIL, beside the next
    lowering); nothing runs. Fills JAX's persistent compilation cache if on. Returns the phases compiled."""
    with concurrent.futures.ThreadPoolExecutor() as pool:
      compiles = []
      phases, _ = self.lower_run(logits_shapes, evaluation=evaluation,
                                 on_lowered=lambda low: compiles.append(pool.submit(low.compile)))
      for c in compiles:
        c.result()
    return phases

  def lower_run(self, logits_shapes: Sequence[tuple[int, int]] = (), *, evaluation: bool = True,
                platforms: Sequence[str] | None = None,
                on_lowered: Callable[[Any], None] | None = None) -> tuple[list[str], dict[tuple, Any]]:
    """(OutControl phases, {key: Lowered}): every function the rest of the run compiles, lowered for
    `platforms` (default: this backend) and each handed to `on_lowered` at once: the train step of each
    OutControl phase (with its oscillation step per OsciReset window phase its updates meet), the
    validation pass of each phase it evaluates in, and the final phase's forward (`logits_fn`) at
    ``logits_shapes`` (e.g. downstream scoring's length buckets). evaluation=False: train steps only.
    Every phase's train step is lowered first: its XLA compile, the longest, then runs beside the rest's."""
    cfg = self.config
    spec = jax.ShapeDtypeStruct((cfg.batch_size, cfg.seq_len), jnp.int32, sharding=self._batch_sharding)
    batch = {"inputs": spec, "targets": spec}
    steps = range(self.step, cfg.total_steps)
    if not steps:  # the run is over
      return [], {}
    phases: dict[str, dict] = {}  # OutControl phase, in run order -> the OsciReset window phases its updates meet
    for s in steps:
      phases.setdefault(self._phase_for_update(s), {})[self._window_phase(s)] = None
    final_phase = self._phase_for_update(cfg.total_steps - 1)
    eval_phases = {self._phase_for_update(s) for s in steps if cfg.eval_every and (s + 1) % cfg.eval_every == 0}
    eval_phases.add(final_phase)  # periodic validation's last one, or a caller's final `evaluate`
    ds, tb = self._val_inputs(cfg.batch_size)
    val_batch = sharding_lib.global_batch(
        {k: v for k, v in next(iter(ds)).items() if k in ("inputs", "targets", "weights")}, self.mesh)
    params, model_vars, rep = self.state["params"], self.state["model"], sharding_lib.replicated(self.mesh)
    graphdef, calls = self._graphdef, []  # (key, jitted function, arguments); a key is (kind, graph)
    try:
      for phase in phases:
        g = self._graphdef = graphdef if phase == self._phase else self._phase_graphdef(phase)
        updates = step_lib.update_calls(self._update_fns(), self.state, batch, list(phases[phase]))
        calls += [((kind, g), fn, args) for kind, fn, args in updates]
        if evaluation and phase in eval_phases:
          calls.append((("eval", g), self._eval_fn(), (params, model_vars, val_batch, tb)))
        tokens = [jax.ShapeDtypeStruct(s, jnp.int32, sharding=rep) for s in logits_shapes]
        calls += [(("logits", t.shape), self._logits_jit(), (params, model_vars, t))
                  for t in (tokens if evaluation and phase == final_phase else ())]
    finally:
      self._graphdef = graphdef
    lowered = {}  # phases that run one graph share its functions
    for key, fn, args in sorted(calls, key=lambda call: call[0][0] != "train"):
      if key not in lowered:
        lowered[key] = fn.trace(*args).lower(lowering_platforms=tuple(platforms) if platforms else None)
        if on_lowered is not None:
          on_lowered(lowered[key])
    return list(phases), lowered

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
    return self._compiled("logits", lambda: step_lib.jit_logits(self._state_shardings, self.mesh, self._graphdef))

  def _eval_fn(self) -> Callable:
    """Jitted ``(params, model vars, batch, token bytes) -> (nll sum, tokens, bytes)``, batch split like training."""
    return self._compiled("eval", lambda: step_lib.jit_eval_stats(
        self._state_shardings, self._batch_sharding, self.mesh, self._graphdef))

  def _val_inputs(self, batch_size: int, tokens: Any = None):
    """(this process's validation batches of ``tokens`` (default: val split), replicated token byte lengths)."""
    sharding_lib.check_batch(batch_size, self.mesh, what="eval batch_size")
    ds = make_val_dataset(self.data.val_tokens if tokens is None else tokens, seq_len=self.config.seq_len,
                          batch_size=batch_size // jax.process_count(), shard_index=jax.process_index(),
                          shard_count=jax.process_count(), pad_id=self.data.pad_id)
    tb = sharding_lib.replicated_input(
        padded_token_bytes(self.data.token_bytes, self.model_config.padded_vocab), self.mesh)
    return ds, tb

  def evaluate(self, max_batches: int | None = None, batch_size: int | None = None) -> dict[str, Any]:
    """Validation loss, perplexity, bits per byte (None: the whole split), and each batch's mean
    loss and scored tokens (``batch_losses``, ``batch_tokens``) for paired comparisons of arms.

    With source groups (`TrainData.val_groups`) each group is scored on its
    own (``max_batches`` each) as ``<group>/loss`` etc., and the overall
    figures add their sums (`validation.summarize`). The same numbers as
    `evaluation.perplexity.evaluate_perplexity` (tested), with the batch
    split over the mesh and the val split sharded by process.
    """
    fn, size = self._eval_fn(), batch_size or self.config.batch_size
    scored = {}
    for group, tokens in (self.data.val_groups or {"all": None}).items():
      ds, tb = self._val_inputs(size, tokens)
      scored[group] = validation.score_batches(fn, self.state["params"], self.state["model"], ds, tb, self.mesh,
                                               max_batches)
    return validation.summarize(scored, grouped=bool(self.data.val_groups),
                                has_bytes=self.data.token_bytes is not None)

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
    # The jitted functions change only with the graph; a lookup costs milliseconds of host time per step.
    fns, fns_graph = None, None
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
          if self._graphdef is not fns_graph:
            fns, fns_graph = self._update_fns(), self._graphdef
          self.state, metrics = step_lib.run_update(fns, self.state, batch, self._window_phase(step))
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
            vals = {f"val/{k}": v for k, v in val.items()
                    if k.rsplit("/", 1)[-1] in ("loss", "ppl", "bits_per_byte")}  # overall and per group
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
    status = ("interrupted" if self._stop_signal is not None
              else "completed" if self.step >= cfg.total_steps else "paused")
    return TrainResult(status=status, step=self.step, last_metrics=last)

  def close(self) -> None:
    if self.checkpointer is not None:
      self.checkpointer.close()
    if self.writer is not None:
      self.writer.close()
