#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment in .venv at the
# repository root. Finds a Python >= 3.12 by itself: python3.13/python3.12 on
# PATH (only if they actually run: pyenv shims exist for versions that are
# not active), else pyenv's installed 3.12/3.13. Re-running is fast: the
# install is skipped while pyproject.toml is unchanged.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"

python_ok() {  # $1: interpreter; succeeds if it runs and is >= 3.12
  "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1
}

find_python() {
  local cand
  for cand in python3.12 python3.13 python3; do
    if command -v "$cand" >/dev/null 2>&1 && python_ok "$cand"; then
      command -v "$cand"; return 0
    fi
  done
  local pyenv_root="${PYENV_ROOT:-$HOME/.pyenv}"
  if command -v pyenv >/dev/null 2>&1; then pyenv_root="$(pyenv root)"; fi
  for cand in "$pyenv_root"/versions/3.12*/bin/python3 "$pyenv_root"/versions/3.13*/bin/python3; do
    if [ -x "$cand" ] && python_ok "$cand"; then echo "$cand"; return 0; fi
  done
  return 1
}

if [ ! -x "$venv/bin/python" ] || ! python_ok "$venv/bin/python"; then
  py="$(find_python)" || {
    echo "setup: no Python >= 3.12 found (tried python3.12, python3.13, python3 and pyenv's versions)." >&2
    echo "setup: install one (e.g. 'pyenv install 3.12') and re-run." >&2
    exit 1
  }
  echo "setup: creating .venv with $py ($("$py" --version))"
  rm -rf "$venv"
  "$py" -m venv "$venv"
fi

stamp="$venv/.tetrajet-installed"
want="$(cat "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup: installing tetrajet-jax (editable) with dev extras"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -e "$root[dev,data]"
echo "$want" > "$stamp"
echo "setup: done ($("$venv/bin/python" --version))"
