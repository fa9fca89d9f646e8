"""The ablation runner: train several arms on the same data, seed and schedule.

With no arguments it runs the embedded demo (the README's main command): the
``tiny`` model, arms ``bf16``, ``nvidia_nvfp4`` and ``tetrajet_v2_full`` (so
the table has a gap closure), a few minutes on two CPU cores, building a
small corpus and tokenizer under ``<repo>/cache/demo`` first if needed. Then
it prints the comparison table, a plain-language verdict (`experiments.verdict`:
which differences exceed the evaluation noise, which accuracies are within
chance) and writes the plots.

    python -m experiments.ablation                       # = --preset demo
    python -m experiments.ablation --model 70m \\
        --arms bf16,nvidia_nvfp4,tetrajet_v2,tetrajet_v2_outcontrol,tetrajet_v2_oscireset,tetrajet_v2_full \\
        --tokens 400_000_000 --batch-size 64 --seq-len 1024 --out results/70m
    python -m experiments.ablation ... --resume          # continue / add arms
    python -m experiments.ablation ... --resume --retry tetrajet_v2 --lr 1e-3   # rerun one arm on purpose

Results folder (``--out``)::

    run.json                the shared settings (checked on --resume), retries' history
    <arm>/config.json       the arm's full config and derived schedule windows
    <arm>/metrics.jsonl     every step's metrics (+ tb/ TensorBoard events)
    <arm>/checkpoints/      orbax checkpoints (--keep-checkpoints 0: deleted at the end)
    <arm>/final.json        final validation (with per-batch losses) and downstream results
    <arm>/history/<time>/   an earlier run of the arm, moved there by --retry
    results.md, results.csv the comparison table
    loss.png, oscillation.png

Gap closure of an FP4 arm: (PPL_nvidia - PPL_arm) / (PPL_nvidia - PPL_bf16),
reported when both ``bf16`` and ``nvidia_nvfp4`` are in the results folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from experiments import plots
from experiments import retry as retry_lib
from experiments.arm_run import enable_compile_cache, precompile, run_arm
from experiments.run_checks import ArgumentParser, UsageError, check_execution, check_out_writable
from experiments.tables import comparison, throughput_table, write_json_atomic, write_tables
from experiments.verdict import verdict
from tetrajet_jax.linear import recipes
from tetrajet_jax.data import cache as data_cache
from tetrajet_jax.model.configs import ATTENTIONS, CONFIGS, get_config
from tetrajet_jax.numerics.nvfp4 import OUTER_BLOCK
from tetrajet_jax.train.arms import ARMS, parse_arms

DEMO_TOKENIZER_VOCAB = 4096
DEMO_SOURCES = ("sotu",)

# The demo's OsciReset window and period are its own: 200 steps have no room
# for the reference's T=50 / P=200 (the runner refuses those), so it sets
# them explicitly and says so when it starts.
PRESETS: dict[str, dict[str, Any]] = {
    "demo": {
        "model": "tiny", "arms": "bf16,nvidia_nvfp4,tetrajet_v2_full", "steps": 200, "batch_size": 8,
        "seq_len": 128, "data": "demo", "eval_every": 50, "eval_batches": 4, "final_eval_batches": 32,
        "downstream": "arc_easy,piqa", "downstream_limit": 100, "checkpoint_every": 100,
        "keep_checkpoints": 1, "osci_window": 10, "osci_period": 20,
    },
}
VERDICT_ARM = "tetrajet_v2_full"  # the FP4 arm the verdict judges when it ran


def build_parser() -> argparse.ArgumentParser:
  p = ArgumentParser(prog="python -m experiments.ablation", description=__doc__,
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
  p.add_argument("--retry", default=None,
                 help="comma-separated arms to start over (e.g. one that diverged): the old run moves to "
                      "<arm>/history/<time>/, and optimizer settings such as --lr may differ from the "
                      "folder's for these arms (recorded in run.json)")
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
                 help="one lax.scan per run of identical transformer blocks (compiles faster, steps "
                      "slower on a GPU; docs/notes/training.md); default: scan on the CPU, unroll on GPUs")
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
  if args.keep_checkpoints < 0:
    raise UsageError(f"--keep-checkpoints {args.keep_checkpoints}: give a count >= 1, or 0 to delete the "
                     "checkpoints at the end.")
  retry_lib.parse_retry(args.retry, [a.name for a in arms])
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


def check_results_dir(plan: Plan) -> dict[str, Any] | None:
  """Refuses to mix runs: the folder's run.json must match (up to the optimizer
  settings of ``--retry`` arms), and unfinished arms need --resume.

  Returns:
    The folder's run.json, or None for a new folder.
  """
  run_json = plan.out / "run.json"
  retry = retry_lib.parse_retry(plan.args.retry, [a.name for a in plan.arms])
  saved = None
  if run_json.is_file():
    saved = json.loads(run_json.read_text(encoding="utf-8"))
    now = json.loads(json.dumps(_run_identity(plan)))
    keys = [k for k in sorted(set(saved["train"]) | set(now["train"])) if saved["train"].get(k) != now["train"].get(k)]
    optim = [k for k in keys if k in retry_lib.RETRY_FIELDS]
    diffs = [f"{k}: folder has {saved['train'].get(k)!r}, this command {now['train'].get(k)!r}"
             for k in keys if k not in retry_lib.allowed_differences(retry)]
    if saved.get("data") != now["data"]:
      diffs.append(f"data: folder has {saved.get('data')!r}, this command {now['data']!r}")
    if diffs:
      hint = (" To rerun an arm with other optimizer settings, name it with --retry ARM."
              if optim and len(optim) == len(keys) else "")
      raise UsageError(f"{plan.out} holds a run with other settings:\n  " + "\n  ".join(diffs)
                       + "\nAll arms of one results folder share data, seed and schedule; use another --out."
                       + hint)
  if not plan.args.resume:
    started = [a.name for a in plan.arms if a.name not in retry and (
        (plan.out / a.name / "checkpoints").exists() or (plan.out / a.name / "final.json").exists())]
    if started:
      raise UsageError(f"{plan.out} already has results for {', '.join(started)}; pass --resume to continue "
                       "or reuse them, --retry ARM to start an arm over, or choose another --out.")
  return saved


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


def _prepare(argv: list[str]) -> tuple[Plan, Any, dict[str, Any] | None]:
  """Parses and checks everything before compute or writing: (plan, data, the folder's run.json).

  Raises:
    UsageError, ValueError, FileNotFoundError: printed by `main` as one ``error:`` line.
  """
  args = parse_args(argv)
  from tetrajet_jax.train import distributed  # pylint: disable=import-outside-toplevel

  distributed.initialize(args.coordinator, args.num_processes, args.process_id)  # before any device use
  plan = make_plan(args)  # model, arms, shapes, schedule: before any data or compute
  check_out_writable(plan.out)
  check_execution(args, plan.configs)
  saved = check_results_dir(plan)
  from tetrajet_jax.data import locate  # pylint: disable=import-outside-toplevel

  data = demo_data() if args.data == "demo" else locate.locate_data(args.data)
  plan = make_plan(args, data.vocab_size, int(data.tokens("train").shape[0]))
  retry = retry_lib.parse_retry(args.retry, [a.name for a in plan.arms])
  return dataclasses.replace(plan, configs=retry_lib.settle_configs(plan.configs, saved, retry)), data, saved


def _record_run(plan: Plan, saved: dict[str, Any] | None) -> None:
  """Writes run.json (the folder's shared settings, kept as they were) and starts ``--retry`` arms over."""
  record = saved if saved is not None else _run_identity(plan)
  for name in retry_lib.parse_retry(plan.args.retry, [a.name for a in plan.arms]):
    entry = retry_lib.start_over(plan.out, name, plan.configs[name], record)
    if entry is not None:
      changed = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in entry["changed"].items()) or "no settings changed"
      print(f"{name}: starting over (--retry); the earlier {entry['previous_status']} run moved to "
            f"{plan.out / entry['moved_to']} ({changed})", flush=True)
  # Atomic: runners of other arms (scripts/h200_ablation.sh starts one per
  # arm) may read it at the same moment in check_results_dir.
  write_json_atomic(plan.out / "run.json", record)


def _announce(plan: Plan, data) -> None:
  cfg0 = next(iter(plan.configs.values()))
  print(f"ablation: model {plan.args.model}, arms {', '.join(a.name for a in plan.arms)}, {plan.total_steps} "
        f"steps x {cfg0.tokens_per_step} tokens, data {data.root} ({data.origin}), out {plan.out}", flush=True)
  osci = [(a.name, plan.configs[a.name].osci_windows) for a in plan.arms if a.oscireset]
  if osci and (plan.args.osci_window is not None or plan.args.osci_period is not None):
    name, w = osci[0]
    print(f"{name}: OsciReset window T={w.window}, period P={w.period}, first window at step {w.start_step}, "
          f"set explicitly{' by the demo' if plan.args.preset == 'demo' else ''} (the reference's T=50, P=200 "
          f"need a longer run than {plan.total_steps} steps)", flush=True)


def _report(plan: Plan, finals: dict[str, dict[str, Any]], t0: float) -> None:
  """The table (with arms finished earlier or by other runners of this folder), the verdict and the plots."""
  for d in sorted(plan.out.iterdir()):
    if d.is_dir() and d.name not in finals and (d / "final.json").is_file():
      finals[d.name] = json.loads((d / "final.json").read_text(encoding="utf-8"))
  header, rows, notes = comparison(finals, plan.tasks)
  text = write_tables(plan.out, header, rows, notes)
  figs = plots.plot_all(plan.out, list(finals))
  print("\n" + text)
  fp4 = [a for a in finals if a in ARMS and ARMS[a].quantized and a != "nvidia_nvfp4"]
  if fp4:  # tetrajet_v2_full when it ran, else the last FP4 arm
    arm = VERDICT_ARM if VERDICT_ARM in fp4 else fp4[-1]
    print("\nverdict:\n" + "\n".join(f"- {line}" for line in verdict(finals, fp4_arm=arm)))
  print("plots: " + ", ".join(str(p) for p in figs))
  print(f"results: {plan.out} ({time.time() - t0:.0f} s)")


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  try:
    plan, data, saved = _prepare(argv)
  except (UsageError, ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  args = plan.args
  if args.precompile:
    return precompile(plan, data)
  if not args.no_compile_cache:
    enable_compile_cache()
  plan.out.mkdir(parents=True, exist_ok=True)
  _record_run(plan, saved)
  _announce(plan, data)
  eval_dir = data.eval_dir
  if eval_dir is None:
    from tetrajet_jax.data.locate import locate_eval_dir  # pylint: disable=import-outside-toplevel

    eval_dir = locate_eval_dir()
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
  _report(plan, finals, t0)
  return status


if __name__ == "__main__":
  sys.exit(main())
