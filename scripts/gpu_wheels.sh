#!/usr/bin/env bash
# Downloads into .whl the wheels the GPU image lacks for the test suite and
# the trainer (pytest, xdist, hypothesis, tensorboardX, tqdm, grain and its
# dependencies), at the versions installed in this checkout's .venv. The GPU
# host reaches no registry, so they travel with the repository (`.whl` is
# git-ignored; scripts/gpu_env.sh installs them there).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pkgs=(pytest pytest-xdist execnet pluggy iniconfig hypothesis sortedcontainers tensorboardX tqdm
      grain array_record cloudpickle portpicker)
pins=()
for p in "${pkgs[@]}"; do
  v=$(.venv/bin/python -m pip show "$p" 2>/dev/null | awk '/^Version:/{print $2}' || true)
  pins+=("$p${v:+==$v}")
done
mkdir -p .whl
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl "${pins[@]}"
ls .whl
