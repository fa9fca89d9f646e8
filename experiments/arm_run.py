"""Running one arm of an ablation (`experiments.ablation`): train or resume it,
evaluate it, write its final.json; and the runner's compile-only mode."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from typing import Any

from experiments import retry as retry_lib
from experiments.tables import LATENT_HISTOGRAM, fmt, median_tokens_per_s, write_json_atomic
from tetrajet_jax.data import cache as data_cache


def _downstream(trainer, tokenizer, tasks: list[str], limit: int | None, eval_dir) -> dict[str, Any]:
  from tetrajet_jax.evaluation.downstream import evaluate_downstream  # pylint: disable=import-outside-toplevel
  from tetrajet_jax.train.evaluate_run import DOWNSTREAM_BATCH  # pylint: disable=import-outside-toplevel

  out = {}
  for task in tasks:
    try:
      res = evaluate_downstream(trainer.logits_fn(), tokenizer, [task], limit=limit,
                                max_len=trainer.config.seq_len, batch_size=DOWNSTREAM_BATCH, eval_dir=eval_dir)[task]
    except (OSError, ValueError, RuntimeError) as e:
      print(f"warning: downstream task {task} skipped: {type(e).__name__}: {e}", file=sys.stderr)
      continue
    out[task] = dataclasses.asdict(res)
  return out


def _compile_up_front(plan, arm, trainer) -> None:
  """Compiles, side by side before step 0, what the arm's run compiles: the
  train step of every OutControl phase, the validation pass and the
  downstream forward at each length bucket. Compiled one after another where
  first used, an FP4 arm's six downstream forwards took about 20 s of its end
  (tetrajet_v2 at 20m on an H100: downstream 25.7 s against 4.2 s for bf16),
  and an OutControl arm stalled twice mid-run. The loop's calls then load the
  executables from JAX's persistent compilation cache; without that cache
  only OutControl arms compile up front (their stalls would distort the
  progress bar's rate), since the others would compile twice."""
  from tetrajet_jax.evaluation.downstream import length_buckets  # pylint: disable=import-outside-toplevel
  from tetrajet_jax.train.evaluate_run import DOWNSTREAM_BATCH  # pylint: disable=import-outside-toplevel

  if plan.args.stop_after is not None or (plan.args.no_compile_cache and not arm.outcontrol):
    return
  t0 = time.time()
  if arm.outcontrol:
    cal = trainer.config.calibration
    print(f"{arm.name}: compiling the train step of every OutControl phase up front (pure FP4, calibrating "
          f"from step {cal.start}, frozen channels from step {cal.end}) ...", flush=True)
  shapes = [(DOWNSTREAM_BATCH, t) for t in length_buckets(trainer.config.seq_len)] if plan.tasks else []
  phases = trainer.precompile(logits_shapes=shapes)
  print(f"{arm.name}: compiled phases {', '.join(phases) or 'none (run finished)'}, validation and "
        f"{len(shapes)} downstream forwards up front in {time.time() - t0:.0f} s", flush=True)


def run_arm(plan, arm, data, eval_dir) -> dict[str, Any]:
  """Trains (or resumes) one arm and evaluates it; returns its final.json content."""
  from tetrajet_jax.nn import quantized_kernel_filter  # pylint: disable=import-outside-toplevel
  from tetrajet_jax.optim import latent_weight_histogram  # pylint: disable=import-outside-toplevel
  from tetrajet_jax.train.trainer import NonFiniteLossError, TrainData, Trainer  # pylint: disable=import-outside-toplevel

  arm_dir = plan.out / arm.name
  final_path = arm_dir / "final.json"
  if final_path.is_file():
    final = json.loads(final_path.read_text(encoding="utf-8"))
    if final.get("status") == "completed":
      print(f"{arm.name}: finished earlier, reusing {final_path}")
    else:  # never silently: a diverged arm is rerun only on request
      print(f"error: {arm.name}: {final.get('status')} earlier ({final.get('error', 'no details')}); not rerun. "
            f"To start it over, e.g. with a lower --lr, add --retry {arm.name} (the old run moves to "
            f"{arm_dir / retry_lib.HISTORY}/).", file=sys.stderr)
    return final
  t0 = time.time()
  trainer = Trainer(plan.configs[arm.name], TrainData.from_located(data), arm_dir, resume=plan.args.resume,
                    progress=not plan.args.no_progress)
  _compile_up_front(plan, arm, trainer)
  try:
    result = trainer.train(num_steps=plan.args.stop_after)
  except NonFiniteLossError as e:
    trainer.close()
    print(f"error: {arm.name}: {e}\nTo start this arm over (e.g. with a lower --lr), rerun the command with "
          f"--resume --retry {arm.name}.", file=sys.stderr)
    final = {"arm": arm.name, "status": "diverged", "error": str(e)}
    write_json_atomic(final_path, final)
    return final
  if result.status == "interrupted":
    trainer.close()
    return {"arm": arm.name, "status": "interrupted", "step": result.step}
  if result.status == "paused":  # --stop-after: a throughput probe
    trainer.close()
    rate = median_tokens_per_s(arm_dir)
    print(f"{arm.name}: stopped after {result.step} steps (--stop-after): median tokens/s {fmt(rate, ',.0f')}, "
          f"{time.time() - t0:.0f} s", flush=True)
    return {"arm": arm.name, "status": "paused", "step": result.step, "tokens_per_s": rate}
  t_train = time.time() - t0
  print(f"{arm.name}: trained in {t_train:.0f} s; final validation ...", flush=True)
  val = trainer.evaluate(max_batches=plan.args.final_eval_batches)
  t_val = time.time() - t0 - t_train
  downstream = _downstream(trainer, data.tokenizer(), plan.tasks, plan.args.downstream_limit, eval_dir)
  t_down = time.time() - t0 - t_train - t_val
  print(f"{arm.name}: final validation {t_val:.0f} s, downstream {t_down:.0f} s", flush=True)
  if arm.quantized and not arm.outcontrol:  # OutControl's MXFP8 rows are not on the FP4 grid
    # The FP4 kernels' latent weights w / s in grid units, every rounding threshold at a bin centre.
    edges, counts = latent_weight_histogram(trainer.state["params"],
                                            param_filter=quantized_kernel_filter(trainer.model()))
    write_json_atomic(arm_dir / LATENT_HISTOGRAM, {"step": result.step, "edges": edges.tolist(),
                                                   "counts": counts.tolist()})
  trainer.close()
  rate = median_tokens_per_s(arm_dir)
  final = {"arm": arm.name, "status": "completed", "steps": result.step,
           "tokens": result.step * plan.configs[arm.name].tokens_per_step,
           "val": val, "downstream": downstream,
           "tokens_per_s": rate,
           "model_tflops_per_s": (rate * trainer.model_config.flops_per_token(plan.args.seq_len) / 1e12
                                  if rate else None),
           "wall_s_this_session": time.time() - t0,
           "wall_s_parts": {"train": t_train, "final_validation": t_val, "downstream": t_down}}
  write_json_atomic(final_path, final)
  # One line per finished arm, so a run cut short still reports what it measured.
  print(f"{arm.name}: done: val loss {val['loss']:.4f}, PPL {val['ppl']:.3f}, median tokens/s "
        f"{fmt(final['tokens_per_s'], ',.0f')}, {final['wall_s_this_session']:.0f} s", flush=True)
  if plan.args.keep_checkpoints == 0:
    shutil.rmtree(arm_dir / "checkpoints", ignore_errors=True)
  return final


def enable_compile_cache() -> None:
  import jax  # pylint: disable=import-outside-toplevel

  jax.config.update("jax_compilation_cache_dir", str(data_cache.default_cache_dir() / "jax"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def precompile(plan, data) -> int:
  """--precompile: fills the persistent compilation cache with each unfinished arm's functions."""
  from tetrajet_jax.evaluation.downstream import length_buckets  # pylint: disable=import-outside-toplevel
  from tetrajet_jax.train.evaluate_run import DOWNSTREAM_BATCH  # pylint: disable=import-outside-toplevel
  from tetrajet_jax.train.trainer import TrainData, Trainer  # pylint: disable=import-outside-toplevel

  if plan.args.no_compile_cache:
    print("error: --precompile fills the persistent compilation cache; drop --no-compile-cache.", file=sys.stderr)
    return 2
  enable_compile_cache()
  for arm in plan.arms:
    if (plan.out / arm.name / "final.json").is_file():
      print(f"{arm.name}: finished earlier, nothing to compile", flush=True)
      continue
    t0 = time.time()
    trainer = Trainer(plan.configs[arm.name], TrainData.from_located(data), None, progress=False,
                      tensorboard=False)
    shapes = [(DOWNSTREAM_BATCH, t) for t in length_buckets(trainer.config.seq_len)] if plan.tasks else []
    phases = trainer.precompile(logits_shapes=shapes)
    print(f"{arm.name}: compiled train step (phases {', '.join(phases)}), validation and {len(shapes)} "
          f"downstream shapes in {time.time() - t0:.1f} s", flush=True)
    trainer.close()
  return 0
