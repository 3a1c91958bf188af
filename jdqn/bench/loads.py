"""A warm start's start-up, part by part, and whether a thread overlaps it (issue 6).

Before a warm run can train, its process imports JAX, starts the backend (CUDA's start on a
GPU), loads the stored programs (``jdqn.executables``: XLA rebuilds each executable's thunks
from its HLO) and imports the rest of jdqn (pandas, orbax, flax, ...). Each worker here does
exactly that in a fresh process, in one of two orders:

- ``serial``: the backend's start and every load, then the other imports;
- ``thread``: the start and the loads on a thread while the main thread imports.

If the start and the loads let go of Python's GIL, ``thread`` ends sooner by about the shorter
of the two; on the H200 it did not (BENCHMARKS.md, "Thirteenth session", W2).

The stored programs are those of the README main command's work: one ``jdqn.bench.timeline``
worker fills a fresh cache first (unless ``JDQN_CACHE_DIR`` is set), then the workers alternate
``serial`` and ``thread``. On CPU nothing is stored (``jdqn.executables``), so there the workers
time the imports and the backend's start only.

    python -m jdqn.bench.loads [--processes 4] [--quick] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from jdqn.bench import timeline
from jdqn.bench.walkforward_run import bench_overrides

MODES = ("serial", "thread")
TAG = "JDQN_LOADS "


def _emit(label: str, start: float) -> None:
    print(f"{TAG}{time.perf_counter() - start:.3f} {label}", flush=True)


def worker(mode: str) -> None:
    """One start-up in this process, in ``mode``; each step's end on stdout."""
    start = time.perf_counter()
    import jax

    import jdqn  # noqa: F401  (jdqn's XLA flags, as the command sets them, before the backend)

    _emit("import jax", start)
    from jdqn import executables
    from jdqn.xla_flags import cache_root

    paths = sorted((cache_root() / "executables").glob(f"*{executables.SUFFIX}"))

    def start_and_load() -> None:
        jax.devices()
        _emit("backend", start)
        for path in paths:
            if executables.load_file(path) is None:
                raise RuntimeError(f"{path}: stored program could not be loaded")
            _emit(f"load {path.name.split('-')[0]}", start)

    if mode == "serial":
        start_and_load()
        import jdqn.walkforward  # noqa: F401
    else:
        loading = threading.Thread(target=start_and_load)
        loading.start()
        import jdqn.walkforward  # noqa: F401

        _emit("imports", start)
        loading.join()
    if mode == "serial":
        _emit("imports", start)
    _emit("done", start)


def _spawn(mode: str, env: dict[str, str]) -> list[tuple[float, str]]:
    command = [sys.executable, "-m", "jdqn.bench.loads", "--worker", mode]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-2000:]
        raise RuntimeError(f"loads worker failed (exit {done.returncode}):\n{tail}")
    events = []
    for line in done.stdout.splitlines():
        if line.startswith(TAG):
            seconds, label = line[len(TAG) :].split(" ", 1)
            events.append((float(seconds), label))
    return events


def run(
    processes: int = 4, quick: bool = False, overrides: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """One timeline worker to store the programs (unless ``JDQN_CACHE_DIR`` is set), then
    ``processes`` start-ups alternating :data:`MODES`: the mode and events of each."""
    with tempfile.TemporaryDirectory(prefix="jdqn-loads-") as tmp:
        env = dict(os.environ)
        if "JDQN_CACHE_DIR" not in env:
            env["JDQN_CACHE_DIR"] = os.path.join(tmp, "cache")
            every = [*bench_overrides(quick), *overrides]
            every.append(f"output.out_dir={os.path.join(tmp, 'runs')}")
            timeline.spawn(every, env)
        return [
            {"mode": MODES[i % 2], "events": _spawn(MODES[i % 2], env)} for i in range(processes)
        ]


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Per start-up: seconds since its start at each step's end, and each load's own seconds."""
    lines = [
        "| mode | import jax | backend | loads (s each) | imports | done |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        events = row["events"]
        at = {label: seconds for seconds, label in events}
        loads, previous = [], at.get("backend", 0.0)
        for seconds, label in events:
            if label.startswith("load "):
                loads.append(f"{label[5:]} {seconds - previous:.3f}")
                previous = seconds
        cells = [f"{at[k]:.2f}" if k in at else "" for k in ("import jax", "backend")]
        cells.append(", ".join(loads) or "none stored")
        cells += [f"{at[k]:.2f}" if k in at else "" for k in ("imports", "done")]
        lines.append(f"| {row['mode']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=MODES, help="one start-up in this process")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return
    if args.processes < 1:
        parser.error(f"--processes {args.processes}: need at least 1")
    print(format_table(run(args.processes, args.quick, args.overrides)))


if __name__ == "__main__":
    main()
