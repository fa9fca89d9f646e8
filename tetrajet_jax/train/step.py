"""The compiled functions of a run: train step, validation statistics, logits.

Each is a module-level function of (state or params, batch, ...) with the
run's constants bound by keyword; `jit_*` wraps it with the run's shardings
(the train step donates its state). The model's OutControl phase is static
graph structure (`graphdef`), so a run compiles one train step per phase it
goes through. `CompiledCache` keeps the jitted functions by (kind, graph,
run identity, mesh, state structure): a function is fully determined by that
key, so Trainers of the same run (a resume, tests) share them.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import optax
from flax import nnx

from tetrajet_jax import nn as qnn
from tetrajet_jax.evaluation.perplexity import batch_stats
from tetrajet_jax.model.olmo2 import lm_loss
from tetrajet_jax.optim import osci_reset_metrics
from tetrajet_jax.train import sharding as sharding_lib
from tetrajet_jax.train.schedule import Schedule


def _loss_and_grads(params: Any, model_vars: Any, batch: dict[str, jax.Array], *, graphdef: nnx.GraphDef,
                    mesh: jax.sharding.Mesh, z_loss: float, param_shardings: Any):
  """(the model's new non-parameter variables, gradients, loss metrics) of one batch."""
  def loss_of(p):
    model = nnx.merge(graphdef, sharding_lib.gather_for_compute(p, mesh), model_vars)
    logits = sharding_lib.constrain_activations(model(batch["inputs"]), mesh)
    loss, aux = lm_loss(logits, batch["targets"], z_loss=z_loss)
    return loss, (aux, nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.Param))))

  (loss, (aux, new_vars)), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
  grads = sharding_lib.constrain(grads, param_shardings)  # FSDP: reduce-scatter
  metrics = {"train/loss": loss, "train/ce": aux["ce"], "train/z_loss": aux["z_loss"],
             "train/grad_norm": optax.tree.norm(grads)}
  return new_vars, grads, metrics


def train_step(state: dict[str, Any], batch: dict[str, jax.Array], *, graphdef: nnx.GraphDef,
               tx: optax.GradientTransformationExtraArgs, mesh: jax.sharding.Mesh, z_loss: float,
               schedule: Schedule, param_shardings: Any) -> tuple[dict[str, Any], dict[str, jax.Array]]:
  """One update: (state, {"inputs", "targets"}) -> (new state, metrics)."""
  params = state["params"]
  new_vars, grads, metrics = _loss_and_grads(params, state["model"], batch, graphdef=graphdef, mesh=mesh,
                                             z_loss=z_loss, param_shardings=param_shardings)
  updates, opt = tx.update(grads, state["opt"], params)
  new_params = optax.apply_updates(params, updates)
  metrics.update({"train/param_norm": optax.tree.norm(new_params), "train/lr": schedule.lr(state["step"])})
  return {"params": new_params, "model": new_vars, "opt": opt, "step": state["step"] + 1}, metrics


def update_step(params: Any, rest: dict[str, Any], batch: dict[str, jax.Array], *, graphdef: nnx.GraphDef,
                tx: optax.GradientTransformationExtraArgs, mesh: jax.sharding.Mesh, z_loss: float,
                schedule: Schedule, param_shardings: Any) -> tuple[dict[str, Any], Any, dict[str, jax.Array]]:
  """First half of a split update: `train_step` up to the updates, which it returns unapplied.

  ``rest`` is the state without "params" (passed apart so that the call can
  donate it and keep the parameters, which `oscillation_step` still reads);
  ``tx`` is the optimizer chain without its last member, which the second half
  runs. Returns (rest with the model variables and optimizer advanced, updates, metrics).
  """
  new_vars, grads, metrics = _loss_and_grads(params, rest["model"], batch, graphdef=graphdef, mesh=mesh,
                                             z_loss=z_loss, param_shardings=param_shardings)
  updates, opt = tx.update(grads, rest["opt"][:-1], params)
  metrics["train/lr"] = schedule.lr(rest["step"])
  return {**rest, "model": new_vars, "opt": (*opt, rest["opt"][-1])}, updates, metrics


def oscillation_step(params: Any, rest: dict[str, Any], updates: Any, window_phase: str | None, *,
                     graphdef: nnx.GraphDef, tx: optax.GradientTransformationExtraArgs, oscireset: bool
                     ) -> tuple[dict[str, Any], dict[str, jax.Array]]:
  """Second half of a split update: OsciReset (or its monitor mode) on the updates, then apply.

  Why split: OsciReset's window step quantizes every tracked weight in XLA,
  a large graph to compile (docs/TRAINING.md). As its own function it
  compiles beside the model's step, in parallel, and the step that lowers
  every Pallas kernel no longer carries it. ``tx`` is the
  optimizer chain's last member (`optimizer.split_optimizer`). ``window_phase``:
  where this update falls in OsciReset's windows (`optim.window_phase_of` of
  the update count, a static argument: one compiled program per phase and no
  device-side conditional), or None to let the device decide.
  """
  opt = rest["opt"]
  channels = qnn.outlier_channels_tree(nnx.merge(graphdef, params, rest["model"]), params)
  updates, osci = tx.update(updates, opt[-1], params, outlier_channels=channels, window_phase=window_phase)
  new_params = optax.apply_updates(params, updates)
  metrics = {"train/param_norm": optax.tree.norm(new_params)}
  risk = osci_reset_metrics(osci)
  metrics.update(risk if oscireset else {"osci/risk_frac": risk["osci/risk_frac"]})
  return {**rest, "params": new_params, "opt": (*opt[:-1], osci), "step": rest["step"] + 1}, metrics


def eval_stats(params: Any, model_vars: Any, batch: dict[str, jax.Array], token_bytes: jax.Array, *,
               graphdef: nnx.GraphDef, mesh: jax.sharding.Mesh) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(nll sum, tokens, bytes) of one validation batch, split like training."""
  model = nnx.merge(graphdef, sharding_lib.gather_for_compute(params, mesh), model_vars)
  logits = sharding_lib.constrain_activations(model(batch["inputs"]), mesh)
  return batch_stats(logits, batch["targets"], batch["weights"], token_bytes)


def logits(params: Any, model_vars: Any, tokens: jax.Array, *, graphdef: nnx.GraphDef,
           mesh: jax.sharding.Mesh) -> jax.Array:
  """float32 logits of int32 tokens [B, T] (FSDP-split parameters gathered)."""
  return nnx.merge(graphdef, sharding_lib.gather_for_compute(params, mesh), model_vars)(tokens)


def jit_train_step(state_shardings: Any, batch_sharding: Any, mesh: jax.sharding.Mesh, **consts) -> Callable:
  """`train_step` with `consts` bound, jitted with the run's shardings; donates the state."""
  return jax.jit(functools.partial(train_step, mesh=mesh, param_shardings=state_shardings["params"], **consts),
                 in_shardings=(state_shardings, batch_sharding),
                 out_shardings=(state_shardings, sharding_lib.replicated(mesh)), donate_argnums=0)


def jit_update_step(state_shardings: Any, batch_sharding: Any, mesh: jax.sharding.Mesh, **consts) -> Callable:
  """`update_step` jitted with the run's shardings; donates the state without its parameters."""
  params, rest = without_params(state_shardings)
  return jax.jit(functools.partial(update_step, mesh=mesh, param_shardings=params, **consts),
                 in_shardings=(params, rest, batch_sharding),
                 out_shardings=(rest, params, sharding_lib.replicated(mesh)), donate_argnums=1)


def jit_oscillation_step(state_shardings: Any, mesh: jax.sharding.Mesh, **consts) -> Callable:
  """`oscillation_step` jitted with the run's shardings, its window phase static; donates the state
  (the new one takes its buffers; the updates are dropped after the call)."""
  params, rest = without_params(state_shardings)
  return jax.jit(functools.partial(oscillation_step, **consts), in_shardings=(params, rest, params),
                 out_shardings=(state_shardings, sharding_lib.replicated(mesh)), donate_argnums=(0, 1),
                 static_argnums=3)


def without_params(state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
  """(state["params"], the rest of the state): the arguments of a split update's halves."""
  return state["params"], {k: v for k, v in state.items() if k != "params"}


def run_update(fns: tuple[Callable, Callable | None], state: dict[str, Any], batch: dict[str, jax.Array],
               window_phase: str | None = None) -> tuple[dict[str, Any], dict[str, jax.Array]]:
  """One update through `fns` = (jitted train step, None) or (jitted `update_step`, jitted
  `oscillation_step`, run at ``window_phase``): (new state, metrics), dispatched, not awaited."""
  step_fn, oscillation_fn = fns
  if oscillation_fn is None:
    return step_fn(state, batch)
  params, rest = without_params(state)
  rest, updates, metrics = step_fn(params, rest, batch)
  state, more = oscillation_fn(params, rest, updates, window_phase)
  return state, {**metrics, **more}


def update_calls(fns: tuple[Callable, Callable | None], state: dict[str, Any], batch: dict[str, Any],
                 window_phases: Sequence[str | None] = (None,)) -> list[tuple[str, Callable, tuple]]:
  """[(kind, jitted function, arguments)] of the updates `run_update` runs at ``window_phases``,
  for lowering without running (`batch` may hold shape specs; the updates have the parameters'
  shapes and placement). Kinds: "train", and "oscillation/<phase>" per window phase."""
  step_fn, oscillation_fn = fns
  if oscillation_fn is None:
    return [("train", step_fn, (state, batch))]
  params, rest = without_params(state)
  return [("train", step_fn, (params, rest, batch))] + [
      (f"oscillation/{phase}", oscillation_fn, (params, rest, params, phase)) for phase in window_phases]


def jit_eval_stats(state_shardings: Any, batch_sharding: Any, mesh: jax.sharding.Mesh,
                   graphdef: nnx.GraphDef) -> Callable:
  rep = sharding_lib.replicated(mesh)
  return jax.jit(functools.partial(eval_stats, graphdef=graphdef, mesh=mesh),
                 in_shardings=(state_shardings["params"], state_shardings["model"], batch_sharding, rep),
                 out_shardings=rep)


def jit_logits(state_shardings: Any, mesh: jax.sharding.Mesh, graphdef: nnx.GraphDef) -> Callable:
  rep = sharding_lib.replicated(mesh)
  return jax.jit(functools.partial(logits, graphdef=graphdef, mesh=mesh),
                 in_shardings=(state_shardings["params"], state_shardings["model"], rep), out_shardings=rep)


class CompiledCache:
  """Jitted functions by a hashable key; `get(key, build)` builds once."""

  def __init__(self):
    self._fns: dict[tuple, Callable] = {}

  def get(self, key: tuple, build: Callable[[], Callable]) -> Callable:
    if key not in self._fns:
      self._fns[key] = build()
    return self._fns[key]

  def clear(self) -> None:
    self._fns.clear()


# Shared by the Trainers of one process (see the module docstring).
COMPILED = CompiledCache()
