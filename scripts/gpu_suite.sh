#!/usr/bin/env bash
# The GPU test suite and benchmarks on an H200 host: checks and times
# everything that needs the GPU, in priority order, each stage under its own
# time limit:
#   1. GPU test suite: numerics (incl. the jit cast-elision check), Pallas
#      kernels (GPU-marked tests at real shapes), linear layer, OsciReset
#      against its NumPy reference (XLA's GPU division path, batched leaves);
#   2. Mosaic lowering time per kernel on this host (python -m experiments.bench lowering);
#   3. linear fwd+bwd per recipe vs bf16 (python -m experiments.bench recipes);
#   4. Pallas kernel benchmark (python -m experiments.bench kernels);
#   5. train steps per arm vs bf16 (python -m experiments.bench train: tokens/s,
#      compile time, peak memory; the same attention for every arm);
#   6. (stage profile_<arm>, PROFILE_ARMS) where a step's GPU time goes
#      (python -m experiments.bench profile).
# Run from the repo root, with the data bundle in .bundle and extra wheels in
# .whl (scripts/gpu_wheels.sh fetches them; scripts/gpu_env.sh installs them):
#   OUT=results/h200 bash scripts/gpu_suite.sh
# Every stage writes its log straight into $OUT, so a run stopped at a time
# limit still leaves what it finished: suite.log, one <stage>.log per stage,
# kernels_bench.json, bench_train.json.
# Each stage gets TERM at its limit and KILL 10 s later (a compiling process
# may not react to TERM).
set -uo pipefail
OUT="${OUT:-results/h200}"
mkdir -p "$OUT"
LOG="$OUT/suite.log"
STAGES="${STAGES:-tests tests_jit bench_lowering bench_linear bench_kernels bench_train}"
# Also: kbench_linear kbench_gemm kbench_quant kbench_bwdquant (kernel bench by
# section, limits T_KBENCH_<SECTION>).
source scripts/tree_commit.sh
export BENCH_COMMIT="${BENCH_COMMIT:-$(tree_commit)}"

source scripts/gpu_env.sh

# Stage logs go to $STAGE_LOGS ($OUT by default; point it elsewhere to keep
# $OUT small when many stages run: suite.log keeps each log's tail).
STAGE_LOGS="${STAGE_LOGS:-$OUT}"
mkdir -p "$STAGE_LOGS"
enabled() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

stage() {  # stage NAME LIMIT_S CMD...
  local name=$1 limit=$2; shift 2
  enabled "$name" || return 0
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s)" | tee -a "$LOG"
  timeout -k 10 "$limit" "$@" >"$STAGE_LOGS/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$STAGE_LOGS/$name.log" >>"$LOG"
  echo "=== $name rc=$rc in $((SECONDS - t0))s" | tee -a "$LOG"
}

# TEST_MARK=gpu runs only the GPU-marked tests (the kernels and the layer at
# real shapes), when the rest already passed on this code; TEST_K selects by
# name (pytest -k). test_linear.py goes first: its Mosaic layer compiles are
# the slowest tests (~130 s), so they must not start last.
stage tests "${T_TESTS:-200}" python3 -m pytest -v -p no:cacheprovider -n 8 -rfE --tb=short --durations=20 -W ignore \
  ${TEST_MARK:+-m "$TEST_MARK"} ${TEST_K:+-k "$TEST_K"} \
  tests/test_linear.py tests/test_numerics.py tests/test_backend_agreement.py tests/test_pallas_gemm.py \
  tests/test_pallas_quantize.py tests/test_pallas_backward_quantize.py tests/test_flat_rows.py tests/test_kernel_division.py \
  tests/test_osci_reset.py tests/test_triton_quantize.py
# The jit checks on this backend: quantization really happens (no cast round
# trip elided) and NonFiniteError reaches the caller from a GPU computation.
stage tests_jit "${T_TESTS_JIT:-90}" python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -W ignore \
  tests/test_numerics.py -k "really_happens_under_jit or nonfinite_error_under_jit"
# LOWERING_ARGS: e.g. --kernels "" --steps 20m/bf16,20m/tetrajet_v2 (whole steps: lowering, compile, recompile).
stage bench_lowering "${T_BENCH_LOWERING:-150}" python3 -m experiments.bench lowering --out "$OUT/bench_lowering.json" \
  ${LOWERING_ARGS:-}
stage bench_linear "${T_BENCH_LINEAR:-150}" python3 -m experiments.bench recipes --backends xla,auto \
  --out "$OUT/bench_recipes.json"
stage bench_kernels "${T_BENCH_KERNELS:-90}" python3 -m experiments.bench kernels --out "$OUT/kernels_bench.json" --log /tmp/kernels_bench_tracebacks.log \
  ${BENCH_ONLY:+--only "$BENCH_ONLY"}
# The same bench, one process per section, each under its own limit (Mosaic
# compiles dominate a section's time; one slow section cannot starve the next).
# KBENCH_ARGS: extra bench flags for every section (e.g. --linear-parts-shapes).
for section in linear gemm quant bwdquant; do
  limit_var="T_KBENCH_$(echo "$section" | tr a-z A-Z)"
  stage "kbench_$section" "${!limit_var:-150}" python3 -m experiments.bench kernels --only "$section" \
    --out "$OUT/kbench_$section.json" --log "/tmp/kbench_${section}_tracebacks.log" ${KBENCH_ARGS:-}
done
# Whole train steps per arm vs bf16 (tokens/s, compile time, peak memory), one process per arm;
# TRAIN_QUANTIZER_KERNELS=mosaic,triton,triton_rtn times each FP4 arm with each quantizer family;
# TRAIN_GEMM_TILING=narrow,overlap,wide with each tiling of the layer's NVFP4 GEMMs;
# TRAIN_BACKWARD_OPERANDS=codes,bf16 with codes and with the quantizers' bf16 backward GEMM operands.
stage bench_train "${T_BENCH_TRAIN:-400}" python3 -m experiments.bench train --models "${TRAIN_MODELS:-20m}" \
  --arms "${TRAIN_ARMS:-bf16,nvidia_nvfp4,tetrajet_v2,tetrajet_v2_full}" --backend "${TRAIN_BACKEND:-auto}" \
  --scan-blocks "${TRAIN_SCAN:-default}" --steps "${TRAIN_STEPS:-20}" ${TRAIN_LAYERS:+--layers "$TRAIN_LAYERS"} \
  ${TRAIN_NO_MONITOR:+--no-oscillation-monitor} ${TRAIN_SEMANTICS:+--quantizer-semantics "$TRAIN_SEMANTICS"} \
  ${TRAIN_QUANTIZER_KERNELS:+--quantizer-kernels "$TRAIN_QUANTIZER_KERNELS"} \
  ${TRAIN_GEMM_TILING:+--gemm-tiling "$TRAIN_GEMM_TILING"} \
  ${TRAIN_BACKWARD_OPERANDS:+--backward-operands "$TRAIN_BACKWARD_OPERANDS"} --out "$OUT/bench_train.json"
# Where one arm's step spends its GPU time, per part and per instruction (one process per arm).
# The profile takes one model: PROFILE_MODEL, by default the first of TRAIN_MODELS.
for arm in ${PROFILE_ARMS:-bf16 tetrajet_v2}; do
  stage "profile_$arm" "${T_PROFILE:-240}" python3 -m experiments.bench profile \
    --model "${PROFILE_MODEL:-$(echo "${TRAIN_MODELS:-20m}" | cut -d, -f1)}" \
    --arm "$arm" --backend "${TRAIN_BACKEND:-auto}" --scan-blocks "${TRAIN_SCAN:-on}" \
    ${TRAIN_NO_MONITOR:+--no-oscillation-monitor} --out "$OUT/profile_$arm.json"
done
echo "=== summary"; grep -E "^=== |passed|failed" "$LOG" | tail -20
