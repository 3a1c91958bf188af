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
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then  # pytest: no tests collected
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
