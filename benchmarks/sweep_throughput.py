"""Issue 46's speed grid: one ``jdqn sweep`` against the same settings as separate ``jdqn
walkforward`` processes, in one call on one device.

The sweep runs first with an empty compilation cache (start to finish, both passes). Then
``--walkforwards`` of the grid's settings run one after another as their own processes, sharing
one cache: the first compiles, the others load. Their mean time without the first, times the
number of settings, is what running the whole grid as separate warm processes would take (the
settings differ only in values, so every warm process does the same work); the sweep's
throughput against them is that over the sweep's time.

    python3 -m benchmarks.sweep_throughput --json sweep.json   # the issue's 64 settings

Each process's wall time is measured here, around the command; ``-v`` logs go under ``--logs``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jdqn import bench
from jdqn.config import PROFILES
from jdqn.run.sweep import grid_settings

# The grid: learning rate, gamma, alpha schedule and exploration (64 settings).
GRID = (
    "optim.learning_rate=0.0003,0.0006,0.001,0.002",
    "loss.gamma=0.8,0.85",
    "loss.alpha_schedule=0,0.2,0.5,0.5/0,0.2",
    "train.epsilon_end=0.02,0.05,0.1,0.2",
)


def settings(profile: str, grid: tuple[str, ...]) -> list[list[str]]:
    """Every setting of ``grid`` as ``--set`` overrides, in the sweep's order (its own parser)."""
    return [[f"{k}={v}" for k, v in s] for s in grid_settings(PROFILES[profile], grid)]


def timed(command: list[str], log: Path, cache: Path) -> float:
    """Seconds ``command`` took; its output goes to ``log``; a failure stops the benchmark."""
    env = {**os.environ, "JDQN_CACHE_DIR": str(cache)}
    started = time.perf_counter()
    with log.open("w") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
    seconds = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"{' '.join(command)} exited {done.returncode}; its log: {log}")
    return seconds


def run(
    profile: str,
    seeds: int,
    walkforwards: int,
    logs: Path,
    grid: tuple[str, ...] = GRID,
    overrides: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The sweep's and the walk-forwards' seconds and the sweep's throughput against them."""
    jdqn = [sys.executable, "-m", "jdqn"]
    common = ["--profile", profile, "--seeds", str(seeds), "--no-progress"]
    common += [arg for item in overrides for arg in ("--set", item)]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        sweep_s = timed(
            [
                *jdqn,
                "sweep",
                *common,
                *(a for g in grid for a in ("--grid", g)),
                "--out",
                str(root / "sweeps"),
                "-v",
            ],
            logs / "sweep.log",
            root / "sweep-cache",
        )
        every = settings(profile, grid)
        processes = []
        # The grid's first settings (again from the first where it has fewer).
        for k, setting in enumerate(itertools.islice(itertools.cycle(every), walkforwards)):
            values = [arg for item in setting for arg in ("--set", item)]
            command = [*jdqn, "walkforward", *common, *values, "--out", str(root / "runs")]
            processes.append(timed(command, logs / f"walkforward{k}.log", root / "wf-cache"))
    warm = statistics.mean(processes[1:])
    return {
        "profile": profile,
        "seeds": seeds,
        "settings": len(every),
        "sweep_s": sweep_s,
        "walkforward_s": processes,  # the first compiles
        "separate_warm_s": warm * len(every),
        "throughput_x": warm * len(every) / sweep_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="default")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--walkforwards", type=int, default=4, help="at least 2 (one compiles)")
    parser.add_argument("--logs", default=".", help="directory for the processes' logs")
    parser.add_argument("--json", help="also write the result as JSON to this file")
    parser.add_argument(
        "--grid", action="append", help="key=v1,v2 (repeatable; default: the issue's grid)"
    )
    parser.add_argument("--set", action="append", default=[], help="key=value for every run")
    args = parser.parse_args()
    if args.walkforwards < 2:
        parser.error("--walkforwards: at least 2, the first of which compiles")
    if args.json and (problem := bench.json_problem(args.json)):
        parser.error(problem)
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    grid = tuple(args.grid) if args.grid else GRID
    result = run(args.profile, args.seeds, args.walkforwards, logs, grid, tuple(args.set))
    print(json.dumps(result, indent=2))
    if args.json:
        bench.write_json(args.json, result)


if __name__ == "__main__":
    main()
