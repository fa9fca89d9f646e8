# Sourced by the GPU scripts (scripts/gpu_suite.sh, scripts/gpu_ablation.sh): installs the packages the
# GPU image lacks from carried wheels (.bundle/wheels: grain and its deps;
# .whl: test and logging deps; .whl/mpl: plotting, if missing) into /tmp/site
# and puts the repo and /tmp/site on PYTHONPATH. Logs to $LOG (default /tmp/gpu_env.log, so a shell
# can source it on its own before running a bench command).
: "${LOG:=/tmp/gpu_env.log}"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=2
shopt -s nullglob  # a missing folder contributes no wheels
wheels=()
declare -A seen  # one copy of each wheel (the bundle and .whl may both carry grain)
for w in .bundle/wheels/*.whl .whl/*.whl; do
  [ -n "${seen[$(basename "$w")]:-}" ] || { seen[$(basename "$w")]=1; wheels+=("$w"); }
done
python3 -c 'import matplotlib' 2>/dev/null || wheels+=(.whl/mpl/*.whl)
shopt -u nullglob
if [ ${#wheels[@]} -gt 0 ]; then  # none: a host that has every package already
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${wheels[@]}" >>"$LOG" 2>&1 || { echo "wheel install failed"; tail -5 "$LOG"; exit 1; }
fi
export PYTHONPATH="$PWD:/tmp/site"
nvidia-smi -L | tee -a "$LOG"
python3 -c 'import jax; print("jax", jax.__version__, jax.devices())' 2>&1 | tee -a "$LOG"
