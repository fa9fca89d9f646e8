#!/usr/bin/env bash
# One device call of the issue-10 ablation on the H200: runs (or resumes) the
# arms of one seed's results folder under experiments/results/h200_20m/, stops
# cleanly before the call's limit, and returns the finished arms' raw metrics
# (run.json, <arm>/{config.json,metrics.jsonl,final.json}) plus a provenance
# record, packed as $OUT/ablation_seed<SEED>.tgz. Unpack that into the repo
# and commit it; the next call resumes with the remaining arms (finished arms
# are reused, never re-run), so all arms keep the same data, seed and schedule.
#
#   SEED=0 ARMS=bf16,nvidia_nvfp4,tetrajet_v2,tetrajet_v2_outcontrol,tetrajet_v2_oscireset,tetrajet_v2_full \
#   LIMIT=540 bash scripts/h200_ablation.sh
# Then: python -m experiments.report  (docs/RESULTS.md from the committed files)
set -uo pipefail
RETURN="${OUT:-results/h200}"
mkdir -p "$RETURN" /tmp/h200
LOG=/tmp/h200/ablation.log
SEED="${SEED:-0}"
ARMS="${ARMS:?comma-separated arms}"
LIMIT="${LIMIT:-540}"
COMMIT="${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
# The ablation's fixed settings: change them only with a new results folder.
RUN_DIR="experiments/results/h200_20m/seed$SEED"
FLAGS=(--model 20m --tokens 10485760 --batch-size 32 --seq-len 1024 --data bpe16384 --seed "$SEED"
       --data-seed 0 --eval-every 40 --eval-batches 8 --downstream all --downstream-limit 500
       --keep-checkpoints 0 --no-progress)

source scripts/device_env.sh

t0=$SECONDS
date_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)
cmd="python -m experiments.ablation ${FLAGS[*]} --arms $ARMS --out $RUN_DIR --resume"
echo "$cmd" | tee -a "$LOG"
# SIGTERM at LIMIT: the runner stops the current arm (it restarts from scratch
# next call: its checkpoints stay on this machine) and finished arms are kept.
timeout --signal=TERM --kill-after=20 "$LIMIT" python3 -m experiments.ablation "${FLAGS[@]}" --arms "$ARMS" \
  --out "$RUN_DIR" --resume 2>&1 | tee -a "$LOG" | grep -v "^\s*$" | tail -n 60
rc=${PIPESTATUS[0]}
wall=$((SECONDS - t0))
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
python3 - "$RUN_DIR" "$COMMIT" "$device" "$cmd" "$wall" "$date_utc" "$rc" <<'PY'
import json, sys
from pathlib import Path
run_dir, commit, device, cmd, wall, date, rc = sys.argv[1:]
finished = sorted(p.parent.name for p in Path(run_dir).glob("*/final.json"))
path = Path(run_dir) / "provenance.json"
records = json.loads(path.read_text()) if path.is_file() else []
records = records if isinstance(records, list) else [records]
records.append({"commit": commit, "device": device, "command": cmd, "wall_s": float(wall), "date": date,
                "exit_code": int(rc), "finished_arms": finished})
path.write_text(json.dumps(records, indent=2) + "\n")
print("finished arms:", ", ".join(finished) or "none", f"(exit {rc}, {wall} s)")
PY
# Only finished arms travel back: an unfinished one restarts next call.
files=("$RUN_DIR/run.json" "$RUN_DIR/provenance.json")
for d in "$RUN_DIR"/*/; do
  d=${d%/}
  [ -f "$d/final.json" ] && files+=("$d/config.json" "$d/metrics.jsonl" "$d/final.json")
done
tar -czf "$RETURN/ablation_seed$SEED.tgz" "${files[@]}"
cp "$LOG" "$RETURN/"
