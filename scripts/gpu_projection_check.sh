#!/usr/bin/env bash
# On the GPU machine: run the C51 projection tests against the real Pallas kernel, then the
# benchmark (and, with --tune, the launch sweep). Logs go to $OUT (default: ./gpu_logs).
# The GPU image may lack hypothesis (the property test then skips) and so tests/conftest.py
# (which imports it and pins JAX to the CPU) is not loaded. TEST_FILTER=expr passes -k expr.
set -uo pipefail
out="${OUT:-gpu_logs}"
mkdir -p "$out"
python="${PYTHON:-python3}"
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$python" -c 'import jax; print("jax", jax.__version__, jax.devices())'
  "$python" -c 'import hypothesis; print("hypothesis", hypothesis.__version__)' 2>&1 | tail -1
} 2>&1 | tee "$out/env.log"
"$python" -m pytest --noconftest -q -p no:cacheprovider -rs tests/test_c51_projection.py \
  ${TEST_FILTER:+-k "$TEST_FILTER"} 2>&1 | tee "$out/test.log"
test_rc=${PIPESTATUS[0]}
"$python" -m jdqn.bench.projection "$@" 2>&1 | tee "$out/bench.log"
bench_rc=${PIPESTATUS[0]}
# The tests decide the exit status; a failing benchmark still fails the script.
[ "$test_rc" -ne 0 ] && exit "$test_rc"
exit "$bench_rc"
