#!/usr/bin/env bash
# An NVFP4 training ablation on a GPU host, within one time limit.
# ABLATION_SET (scripts/ablation_flags.sh) names the flags and the results
# folder, experiments/results/<set>/seed<N>. Runs (or resumes) the arms of one
# or more seeds and packs the finished arms' raw metrics (run.json,
# provenance.json, <arm>/{config.json,metrics.jsonl.xz,final.json,
# latent_histogram.json}) into $OUT/ablation.tgz: unpack it in the repo root
# and commit it. A later run resumes with the remaining arms (finished arms are
# reused, never re-run), so all arms keep the same data order, seed and schedule.
#
# The arms train in runs/<set>/seed<N> (ignored by git, so that a machine
# kept between commands keeps it): that folder starts as a copy of the
# committed one, and an arm cut off by LIMIT resumes from its checkpoints there
# in the next command on the same machine (on a fresh machine it restarts).
#
# Why one process per arm (PARALLEL=1, the default): compiling an FP4 arm's
# train step takes minutes of CPU time on this machine while a 20m model
# leaves most of the H200 idle, so the arms compile side by side on the 16
# cores and then share the GPU. Their tokens/s then measure a shared GPU; the
# throughput of each arm alone comes from the probe at the end (PROBE_STEPS>0):
# the same compiled steps, reloaded from the persistent compilation cache,
# run one arm at a time for PROBE_STEPS steps.
# PRECOMPILE_LIMIT>0 (the default) first compiles every unfinished arm's steps
# and the probe's into that cache, all side by side (`--precompile`: no GPU
# memory held), so the probe loads instead of compiling, and no arm's
# compilation overlaps another arm's training. Each 20m arm holds ~20-25 GiB
# of GPU memory while it trains (XLA attention's score tensors): five at once
# ran out of the H200's memory, so give at most four arms at a time.
#
#   [ABLATION_SET=stage1_20m] JOBS="0:bf16,nvidia_nvfp4,tetrajet_v2,tetrajet_v2_outcontrol,tetrajet_v2_oscireset,tetrajet_v2_full 1:bf16,tetrajet_v2_full" \
#   LIMIT=420 [DEADLINE=540] [PARALLEL=0] [PRECOMPILE_BACKGROUND=1] PROBE_STEPS=30 PROBE_LIMIT=120 [PROBE_ARMS=bf16,...] [PRECOMPILE_LIMIT=180] \
#   bash scripts/gpu_ablation.sh
# Long arms under a per-command time limit (stage1_20m: 6.5-10.5 minutes each on an H100):
# PARALLEL=0 PRECOMPILE_LIMIT=0 DEADLINE=<limit>, so each arm compiles alone when it starts
# and the next command picks up where this one stopped (docs/TRAINING.md).
# Then: python -m experiments.report  (docs/RESULTS.md from the committed files)
set -uo pipefail
RETURN="${OUT:-results/h200}"
WORK=/tmp/h200
mkdir -p "$RETURN" "$WORK"
LOG="$RETURN/ablation.log"  # in $OUT from the start: a run cut off by its limit still leaves it
JOBS="${JOBS:?space-separated SEED:arm,arm,... groups}"
LIMIT="${LIMIT:-420}"
PARALLEL="${PARALLEL:-1}"
PROBE_STEPS="${PROBE_STEPS:-0}"
PROBE_LIMIT="${PROBE_LIMIT:-120}"
PRECOMPILE_LIMIT="${PRECOMPILE_LIMIT:-180}"
# PRECOMPILE_BACKGROUND=1: the arms start at once and the precompilation runs beside them,
# so with PARALLEL=0 the later arms compile on the host's cores while the first one trains
# (the GPU does not wait for compilation it does not need yet).
PRECOMPILE_BACKGROUND="${PRECOMPILE_BACKGROUND:-0}"
source scripts/tree_commit.sh
COMMIT="${COMMIT:-$(tree_commit)}"
source scripts/ablation_flags.sh || exit 2
FLAGS=("${ABLATION_FLAGS[@]}")
run_dir() { echo "runs/$ABLATION_SET/seed$1"; }
for job in $JOBS; do  # start each seed's folder from its committed raw files
  dir=$(run_dir "${job%%:*}")
  [ -d "$dir" ] || { mkdir -p "$dir"; committed="$ABLATION_DIR/seed${job%%:*}"; [ -d "$committed" ] && cp -r "$committed/." "$dir/"; }
done

source scripts/gpu_env.sh

t0=$SECONDS
date_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)
if [ "$PRECOMPILE_LIMIT" -gt 0 ]; then
  pids=()
  seen=""
  first=${JOBS%% *}
  probe_job=""
  [ "$PROBE_STEPS" -gt 0 ] && probe_job="${first%%:*}:${PROBE_ARMS:-${first#*:}}"
  for job in $JOBS "probe$probe_job"; do
    [ "$job" = probe ] && continue
    out=$(run_dir "${job%%:*}")
    case $job in probe*) job=${job#probe}; out="$WORK/probe" ;; esac  # the probe's own folder
    seed=${job%%:*}
    arms=${job#*:}
    for arm in ${arms//,/ }; do
      case " $seen " in *" $seed:$arm "*) continue ;; esac  # same seed, same arm: same compiled step
      seen="$seen $seed:$arm"
      timeout -k 10 "$PRECOMPILE_LIMIT" python3 -m experiments.ablation "${FLAGS[@]}" $(seed_flags "$seed") --arms "$arm" \
        --out "$out" --resume --precompile >"$WORK/precompile_${seed}_${arm}_$(basename "$out").log" 2>&1 &
      pids+=($!)
    done
  done
  precompile_pids=("${pids[@]}")
  if [ "$PRECOMPILE_BACKGROUND" != 1 ]; then
    wait "${precompile_pids[@]}"
    echo "=== precompiled in $((SECONDS - t0)) s:" | tee -a "$LOG"
    cat "$WORK"/precompile_*.log | grep -E "compiled|nothing to compile|rror" | tee -a "$LOG"
  fi
fi
# DEADLINE (seconds from this script's start): the arms get what is left of it
# after the precompilation, instead of a fixed LIMIT, less FINISH_RESERVE for what
# follows them: an arm told to stop saves a checkpoint (up to the 20 s before KILL),
# then the metrics are compressed and packed. Without it, an arm stopped at
# 8718 of 9156 steps left the script past a 600 s command limit, before the archive.
FINISH_RESERVE="${FINISH_RESERVE:-30}"
[ -n "${DEADLINE:-}" ] && LIMIT=$((DEADLINE - SECONDS - FINISH_RESERVE))
t_arms=$SECONDS
pids=()
n_procs=0
for job in $JOBS; do
  seed=${job%%:*}
  arms=${job#*:}
  if [ "$PARALLEL" = 1 ]; then groups=${arms//,/ }; else groups=$arms; fi
  for group in $groups; do
    n_procs=$((n_procs + 1))
    echo "python -m experiments.ablation ${FLAGS[*]} $(seed_flags "$seed") --arms $group --out $(run_dir "$seed") --resume" \
      | tee -a "$LOG"
    # TERM at LIMIT: the runner stops its arm (an unfinished arm restarts from
    # scratch in a later run on a fresh machine: its checkpoints stay here).
    timeout -k 20 "$LIMIT" python3 -m experiments.ablation "${FLAGS[@]}" $(seed_flags "$seed") --arms "$group" \
      --out "$(run_dir "$seed")" --resume >"$WORK/run_${seed}_${group//,/+}.log" 2>&1 &
    pids+=($!)
  done
done
wait "${pids[@]}"
wall=$((SECONDS - t_arms))
if [ "$PRECOMPILE_BACKGROUND" = 1 ] && [ "$PRECOMPILE_LIMIT" -gt 0 ]; then
  wait "${precompile_pids[@]}"
  echo "=== precompiled beside the arms:" | tee -a "$LOG"
  cat "$WORK"/precompile_*.log | grep -E "compiled|nothing to compile|rror" | tee -a "$LOG"
fi
for f in "$WORK"/run_*.log; do
  echo "--- $(basename "$f")" >>"$LOG"
  grep -E "compiled and dispatched|trained in|final validation|done:|error|Error|interrupted|warning" "$f" \
    | tail -n 8 >>"$LOG"
done

device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
files=()
for job in $JOBS; do
  seed=${job%%:*}
  dir=$(run_dir "$seed")
  python3 - "$dir" "$COMMIT" "$device" "${FLAGS[*]} $(seed_flags "$seed") --arms ${job#*:} --out $ABLATION_DIR/seed$seed --resume" "$wall" \
    "$date_utc" "$n_procs" <<'PY' | tee -a "$LOG"
import json, sys
from pathlib import Path
from tetrajet_jax.kernels import _platform
run_dir, commit, device, flags, wall, date, n_procs = sys.argv[1:]
finished = sorted(p.parent.name for p in Path(run_dir).glob("*/final.json"))
path = Path(run_dir) / "provenance.json"
records = json.loads(path.read_text()) if path.is_file() else []
records = records if isinstance(records, list) else [records]
records.append({"commit": commit, "device": device, "command": f"python -m experiments.ablation {flags}",
                "wall_s": float(wall), "date": date, "concurrent_processes": int(n_procs),
                # Which kernels the block-scaled quantizers ran on: the same bits, different tokens/s.
                "quantizer_kernels": _platform.quantizer_kernels(),
                # The layer's GEMM tiles: the same products, another FP32 summation order when wide.
                "gemm_tiling": _platform.gemm_tiling(),
                # What the backward quantizers hand the backward GEMMs: the same products either way.
                "backward_operands": _platform.backward_operands(),
                "note": ("arms trained side by side on one GPU; final.json tokens/s are shared-GPU figures"
                         if int(n_procs) > 1 else "one arm at a time on the GPU: final.json tokens/s are the arm's alone"),
                "finished_arms": finished})
path.write_text(json.dumps(records, indent=2) + "\n")
print(f"{run_dir}: finished arms: {', '.join(finished) or 'none'} ({wall} s, {n_procs} processes)")
PY
  files+=("$dir/run.json" "$dir/provenance.json")
  for d in "$dir"/*/; do
    d=${d%/}
    [ -f "$d/final.json" ] || continue
    # Committed compressed (METRICS_FILE.xz, tetrajet_jax.train.metrics): a 300M-token arm's
    # per-step records are ~4 MB as text, 0.75 MB compressed.
    [ -f "$d/metrics.jsonl" ] && xz -9 -T0 -k -f "$d/metrics.jsonl"
    files+=("$d/config.json" "$d/metrics.jsonl.xz" "$d/final.json")
    [ -f "$d/latent_histogram.json" ] && files+=("$d/latent_histogram.json")
  done
done
# Paths as committed: runs/<set>/... -> experiments/results/<set>/...
to_results=(--transform "s,^runs/$ABLATION_SET,$ABLATION_DIR,")
tar -czf "$RETURN/ablation.tgz" "${to_results[@]}" "${files[@]}"  # now, in case the probe is cut off
# Arms cut off by LIMIT: their metrics so far (perf/elapsed_s, perf/eval_s show
# where the time went), not results: they restart from scratch in a later run.
partial=()
for job in $JOBS; do
  for d in "$(run_dir "${job%%:*}")"/*/; do
    d=${d%/}
    [ ! -f "$d/final.json" ] && [ -f "$d/metrics.jsonl" ] && partial+=("$d/metrics.jsonl")
  done
done
[ ${#partial[@]} -gt 0 ] && tar -czf "$RETURN/partial_metrics.tgz" "${to_results[@]}" "${partial[@]}" "$WORK"/run_*.log

# Throughput of each arm alone (seed of the first job), same compiled steps;
# stored beside that seed's arms as throughput_alone.json (read by the report).
# PROBE_ARMS (default: the first job's arms) should include bf16, the ratios'
# baseline. Figures of earlier probes in throughput_alone.json are kept unless
# this probe measures the same arm again (a carried-in file is merged).
if [ "$PROBE_STEPS" -gt 0 ]; then
  first=${JOBS%% *}
  probe_arms=${PROBE_ARMS:-${first#*:}}
  alone="$(run_dir "${first%%:*}")/throughput_alone.json"
  echo "=== throughput probe: $probe_arms, $PROBE_STEPS steps each" | tee -a "$LOG"
  timeout -k 10 "$PROBE_LIMIT" python3 -m experiments.ablation "${FLAGS[@]}" $(seed_flags "${first%%:*}") \
    --arms "$probe_arms" --out "$WORK/probe" --stop-after "$PROBE_STEPS" --eval-every 0 \
    --checkpoint-every 100000 >"$RETURN/throughput_probe.log" 2>&1
  tail -n 12 "$RETURN/throughput_probe.log" | tee -a "$LOG"
  if [ -f "$WORK/probe/throughput.json" ]; then
    python3 - "$WORK/probe/throughput.json" "$alone" "$COMMIT" <<'PY'
import json, sys
from pathlib import Path
new, old, commit = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
merged = json.loads(old.read_text()) if old.is_file() else {}
merged.update({arm: dict(fig, commit=commit) for arm, fig in json.loads(new.read_text()).items()})
old.write_text(json.dumps(merged, indent=2) + "\n")
PY
    tar -czf "$RETURN/ablation.tgz" "${to_results[@]}" "${files[@]}" "$alone"
  fi
fi
echo "done in $((SECONDS - t0)) s" | tee -a "$LOG"
