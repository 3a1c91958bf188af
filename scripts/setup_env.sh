#!/usr/bin/env bash
# Create (or reuse) .venv with a Python >= 3.12 and install jdqn with its dev extras, and with
# its cuda extra (JAX's CUDA 12 wheels) where nvidia-smi finds a GPU (JDQN_CPU=1: never).
# Run by scripts/run_main.sh and scripts/run_tests.sh; a second run reuses the environment.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"

good_python() {  # prints the interpreter if it runs and is >= 3.12
  # ensurepip too: Debian's python without python3-venv has `venv` but cannot make a usable one.
  "$1" -c 'import sys, venv, ensurepip; sys.exit(0 if sys.version_info >= (3, 12) else 1)' \
    >/dev/null 2>&1 \
    && command -v "$1"
}

find_python() {
  local c
  for c in "${PYTHON:-}" python3.13 python3.12 python3 python; do
    [ -n "$c" ] && good_python "$c" && return 0
  done
  local pyenv_root="${PYENV_ROOT:-$HOME/.pyenv}"
  command -v pyenv >/dev/null 2>&1 && pyenv_root="$(pyenv root)"
  for c in $(ls -d "$pyenv_root"/versions/3.1[2-9]* 2>/dev/null | sort -rV); do
    good_python "$c/bin/python3" && return 0
  done
  return 1
}

extras=dev
if [ -z "${JDQN_CPU:-}" ] && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  extras=dev,cuda
fi
stamp="$venv/.jdqn-installed"
want="$extras $(sha256sum < "$root/pyproject.toml" | cut -d' ' -f1)"
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  py="$(find_python)" || {
    echo "error: no Python >= 3.12 (with venv and ensurepip) found; install one or set" \
      "PYTHON=/path/to/python3.12" >&2
    exit 1
  }
  # Build beside and move into place: a failed build never leaves a half-made .venv behind.
  rm -rf "$venv" "$venv.tmp"
  "$py" -m venv "$venv.tmp"
  mv "$venv.tmp" "$venv"
  rm -f "$stamp"
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setting up $venv with jdqn[$extras] (first run takes a few minutes) ..." >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$root[$extras]" >&2
  echo "$want" > "$stamp"
fi
