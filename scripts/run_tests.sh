#!/usr/bin/env bash
# Set up (first time) and run the lint and the test suite. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
cd "$root"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
set +e
# Two worker processes, a test file each: on a fresh machine (no compilation cache) most of the
# suite is XLA compiling, one core per program; extra arguments win, e.g. -n 0 for one process.
.venv/bin/python -m pytest -n 2 --dist loadfile "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then  # pytest: no tests collected
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
