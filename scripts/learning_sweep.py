"""Run the learning scorecard for several labelled override sets in parallel processes.

``python scripts/learning_sweep.py SWEEP.json OUT_DIR [--processes N]``: SWEEP.json maps a label to
``{"set": [...overrides], "cases": "a,b", "seeds": N, "profile": P}``; each label runs
``python -m jdqn.bench.learning`` in its own process (GPU memory shared: no preallocation) and
writes OUT_DIR/<label>.json and .log; OUT_DIR/sweep.json gathers every finished label.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("sweep")
    parser.add_argument("out")
    parser.add_argument("--processes", type=int, default=8)
    args = parser.parse_args()
    sweep = json.loads(Path(args.sweep).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "PYTHONUNBUFFERED": "1"}
    pending = list(sweep.items())
    running: list[tuple[str, subprocess.Popen]] = []
    start = time.time()
    while pending or running:
        while pending and len(running) < args.processes:
            label, spec = pending.pop(0)
            command = [sys.executable, "-m", "jdqn.bench.learning", "--label", label]
            command += ["--json", str(out / f"{label}.json"), "--cases", spec["cases"]]
            command += ["--seeds", str(spec.get("seeds", 4))]
            command += ["--profile", spec.get("profile", "default")]
            for item in spec.get("set", []):
                command += ["--set", item]
            log = open(out / f"{label}.log", "w")  # noqa: SIM115  # closed with the process
            running.append((label, subprocess.Popen(command, stdout=log, stderr=log, env=env)))
        time.sleep(2)
        for label, process in list(running):
            if process.poll() is not None:
                running.remove((label, process))
                print(f"{time.time() - start:6.0f} s {label} rc={process.returncode}", flush=True)
    gathered = {}
    for label in sweep:
        path = out / f"{label}.json"
        if path.exists():
            gathered[label] = json.loads(path.read_text())
    (out / "sweep.json").write_text(json.dumps(gathered, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
