"""Toy problem where FP4 oscillation is certain, with and without OsciReset.

Straight-through-estimator QAT of one [256, 128] kernel (quantized along axis
0, as the forward does): loss = mean over elements of ((Q(W) - T) / s)^2,
gradient passed straight through Q. For a fraction of the elements (the
oscillating ones) the target T sits exactly on an RTN decision threshold
(the midpoint between two E2M1 neighbours, in the element's own scale s), so
whichever side W is on, the gradient pushes it back across: W hovers at the
threshold and Q(W) flips while W barely moves. The other elements' targets
are grid values that they already round to (zero gradient, they stay put).
One anchor per 16-element block (target and start exactly on the grid value
6, zero gradient) pins every block scale, so the grid never moves.

Run: python -m tetrajet_jax.optim.toy_oscillation [--steps 400 ...]
It prints flips per step (elements whose Q(W) changed) before and after the
first reset, the final loss, and the OsciReset state bytes per weight.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tetrajet_jax.optim.osci_reset import osci_reset
from tetrajet_jax.optim.weight_quantizer import NVFP4WeightQuantizer

# Decision thresholds below 4: an element oscillating between 4 and 6 would, once reset onto 6 * s
# (a hair above the anchor's 1.0 after rounding s_out), become the block max and move every scale of
# its block by an ulp. That is right (spec: w <- Q(w)) but would blur the flip count here.
_MIDPOINTS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5], np.float32)
_GAPS = np.array([0.5, 0.5, 0.5, 0.5, 1.0, 1.0], np.float32)


class ToyProblem(NamedTuple):
  w0: jax.Array      # float32 [in, out]: start weights (anchors on the grid, others near their threshold)
  target: jax.Array  # float32 [in, out]: T
  scale: jax.Array   # float32 [in, out]: element scale s = s_in * s_out (constant: anchors pin it)
  mask: jax.Array    # bool [in, out]: non-anchor elements (the loss averages over them)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyConfig:
  shape: tuple[int, int] = (256, 128)
  oscillating_fraction: float = 1.0  # elements whose optimum sits on a decision threshold
  steps: int = 400
  lr: float = 1e-4
  start_offset: float = 0.02  # start |W - T| <= start_offset * gap * s: all reach the threshold early
  start_step: int = 100
  period: int = 100
  window: int = 25
  threshold: float = 8.0


def make_problem(key: jax.Array, shape: tuple[int, int] = (256, 128), start_offset: float = 0.02,
                 oscillating_fraction: float = 1.0) -> ToyProblem:
  n_in, n_out = shape
  if n_in % 16:
    raise ValueError(f"make_problem: the quantized axis (in = {n_in}) must be a multiple of 16.")
  anchor = (np.arange(n_in) % 16 == 0)[:, None] & np.ones((1, n_out), bool)
  quantizer = NVFP4WeightQuantizer()
  # Every block amax is 1, so every element has the same scale; read it off the quantizer itself.
  s = quantizer.scale(jnp.where(anchor, 1.0, 0.0))[0, 0]
  k_mid, k_sign, k_off, k_osc = jax.random.split(key, 4)
  which = jax.random.randint(k_mid, shape, 0, len(_MIDPOINTS))
  sign = jnp.where(jax.random.bernoulli(k_sign, 0.5, shape), 1.0, -1.0)
  oscillating = jax.random.bernoulli(k_osc, oscillating_fraction, shape)
  # A stable element's target is the grid value just below its midpoint: it starts within that bin.
  level = jnp.where(oscillating, jnp.asarray(_MIDPOINTS)[which], jnp.asarray(_MIDPOINTS - _GAPS / 2)[which])
  target = sign * level * s
  offset = jax.random.uniform(k_off, shape, minval=-1.0, maxval=1.0) * start_offset * jnp.asarray(_GAPS)[which] * s
  w0 = jnp.where(anchor, 1.0, target + offset).astype(jnp.float32)
  # Anchors' target is their own quantized value: zero gradient, so Adam never moves them.
  target = jnp.where(anchor, quantizer(w0), target).astype(jnp.float32)
  return ToyProblem(w0=w0, target=target, scale=jnp.full(shape, s, jnp.float32), mask=jnp.asarray(~anchor))


@jax.custom_vjp
def _ste(w: jax.Array) -> jax.Array:
  return NVFP4WeightQuantizer()(w)


_ste.defvjp(lambda w: (_ste(w), None), lambda _, g: (g,))


def toy_loss(w: jax.Array, problem: ToyProblem) -> jax.Array:
  err = (_ste(w) - problem.target) / problem.scale
  return jnp.sum(jnp.where(problem.mask, err * err, 0.0)) / jnp.sum(problem.mask)


class ToyRun(NamedTuple):
  flips: np.ndarray   # int [steps]: elements whose Q(W) changed at each update
  loss: np.ndarray    # float [steps]: loss before each update
  w: jax.Array        # final weights
  opt_state: Any      # final optimizer state


def run(problem: ToyProblem, config: ToyConfig, *, track_fraction: float | None) -> ToyRun:
  """Adam (betas 0.9/0.95, no weight decay) on the toy loss; track_fraction None = no OsciReset."""
  parts = [optax.adam(config.lr, b1=0.9, b2=0.95)]
  if track_fraction is not None:
    parts.append(osci_reset(start_step=config.start_step, period=config.period, window=config.window,
                            threshold=config.threshold, track_fraction=track_fraction))
  tx = optax.chain(*parts)
  params = {"layer": {"kernel": problem.w0}}
  quantize = NVFP4WeightQuantizer()

  def step(carry, _):
    params, opt_state = carry
    loss, grads = jax.value_and_grad(lambda p: toy_loss(p["layer"]["kernel"], problem))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    new = optax.apply_updates(params, updates)
    flips = jnp.sum(quantize(new["layer"]["kernel"]) != quantize(params["layer"]["kernel"]))
    return (new, opt_state), (flips, loss)

  @jax.jit
  def go(params):
    return jax.lax.scan(step, (params, tx.init(params)), None, length=config.steps)

  (params, opt_state), (flips, loss) = go(params)
  return ToyRun(flips=np.asarray(flips), loss=np.asarray(loss), w=params["layer"]["kernel"], opt_state=opt_state)


def state_bytes_per_weight(opt_state: Any, n_weights: int) -> float:
  """Bytes of the OsciReset state's arrays per tracked weight (Adam's state excluded)."""
  from tetrajet_jax.optim.osci_reset import find_osci_reset_state
  st = find_osci_reset_state(opt_state)
  return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(st)) / n_weights


def summarize(config: ToyConfig, runs: dict[str, ToyRun]) -> str:
  reset_at = config.start_step + config.window  # first update after the first reset
  rows = [f"{'arm':<10} {'flips/step before':>18} {'flips/step after':>17} {'final loss':>11} {'bytes/weight':>13}"]
  n = int(np.prod(config.shape))
  for name, r in runs.items():
    before = r.flips[config.start_step - 25:config.start_step].mean()
    after = r.flips[reset_at:].mean()
    bpw = "-" if name == "baseline" else f"{state_bytes_per_weight(r.opt_state, n):.3f}"
    rows.append(f"{name:<10} {before:>18.1f} {after:>17.2f} {r.loss[-1]:>11.5f} {bpw:>13}")
  return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--steps", type=int, default=ToyConfig.steps)
  parser.add_argument("--lr", type=float, default=ToyConfig.lr)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  for frac in (1.0, 0.05):
    config = ToyConfig(steps=args.steps, lr=args.lr, oscillating_fraction=frac)
    problem = make_problem(jax.random.key(args.seed), config.shape, config.start_offset, frac)
    runs = {name: run(problem, config, track_fraction=f)
            for name, f in (("baseline", None), ("full", 1.0), ("lean-0.1", 0.1))}
    print(f"toy: {config}")
    print(f"flips/step before = mean over updates [{config.start_step - 25}, {config.start_step}); "
          f"after = mean over [{config.start_step + config.window}, {config.steps}) (after the first reset)")
    print(summarize(config, runs))
    print()


if __name__ == "__main__":
  main()
