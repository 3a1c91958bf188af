#!/usr/bin/env bash
# Set up (first time) and run the main job: a walk-forward run on the built-in synthetic ES bars.
# Extra arguments go to `jdqn walkforward` (e.g. --data FILE, --profile default, --out DIR).
# Without --profile, --config or --resume it runs --profile smoketest, the CI-sized learner that
# finishes in about two minutes on two CPU cores (`jdqn walkforward` alone uses `default`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
case " $* " in
  *" --profile"* | *" --config"* | *" --resume"*) ;;
  *) set -- --profile smoketest "$@" ;;
esac
exec "$root/.venv/bin/jdqn" walkforward "$@"
