#!/usr/bin/env bash
# Set up (first time) and run the main job: a walk-forward run on the built-in synthetic ES bars.
# Extra arguments go to `jdqn walkforward` (e.g. --data FILE, --profile default, --out DIR).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
exec "$root/.venv/bin/jdqn" walkforward "$@"
