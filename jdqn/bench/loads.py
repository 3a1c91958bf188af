"""A warm start's start-up, part by part, and whether a thread overlaps it (issue 6).

Before a warm run can train, its process imports JAX, starts the backend (CUDA's start on a
GPU), loads the stored programs (``jdqn.executables``: XLA rebuilds each executable's thunks
from its HLO) and imports the rest of jdqn (pandas, orbax, flax, ...). Each worker here does
exactly that in a fresh process, in one of three orders:

- ``serial``: the backend's start and every load, then the other imports;
- ``thread``: the start and the loads on a thread while the main thread imports;
- ``backend``: the start alone on a thread while the main thread imports, then the loads.

If the start and the loads let go of Python's GIL, ``thread`` ends sooner by about the shorter
of the two; on the H200 it ended 0.05 s (W2) and 0.42 s (W5) sooner on the means of two calls,
inside the spread between processes, and ``backend`` 0.24 s (W5; BENCHMARKS.md, "Thirteenth
session").

The stored programs are those of the README main command's work: one ``jdqn.bench.timeline``
worker fills a fresh cache first (unless ``JDQN_CACHE_DIR`` is set), then the workers take the
modes in turn. On CPU nothing is stored (``jdqn.executables``), so there the workers
time the imports and the backend's start only.

    python -m jdqn.bench.loads [--processes 6] [--quick] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jdqn.bench import timeline
from jdqn.bench.walkforward_run import bench_overrides, run_worker

MODES = ("serial", "thread", "backend")
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

    def start_backend() -> None:
        jax.devices()
        _emit("backend", start)

    def load() -> None:
        for path in paths:
            if executables.load_file(path) is None:
                raise RuntimeError(f"{path}: stored program could not be loaded")
            _emit(f"load {path.name.split('-')[0]}", start)

    # Before the imports, on a thread while the main thread imports, and after the imports.
    before, on_thread, after = {
        "serial": ((start_backend, load), (), ()),
        "thread": ((), (start_backend, load), ()),
        "backend": ((), (start_backend,), (load,)),
    }[mode]
    for step in before:
        step()
    with ThreadPoolExecutor(1) as pool:
        steps = pool.submit(lambda: [step() for step in on_thread])
        import jdqn.walkforward  # noqa: F401

        _emit("imports", start)
        steps.result()  # the thread's error, if any, raised here
    for step in after:
        step()
    _emit("done", start)


def spawn(mode: str, env: dict[str, str]) -> list[tuple[float, str]]:
    """One start-up in a fresh process with ``env``: its events (seconds, label)."""
    command = [sys.executable, "-m", "jdqn.bench.loads", "--worker", mode]
    _, lines = run_worker(command, env, TAG)
    return [(float(seconds), label) for seconds, label in (line.split(" ", 1) for line in lines)]


def run(
    processes: int = 6, quick: bool = False, overrides: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """One timeline worker to store the programs (unless ``JDQN_CACHE_DIR`` is set), then
    ``processes`` start-ups taking :data:`MODES` in turn: the mode and events of each."""
    with tempfile.TemporaryDirectory(prefix="jdqn-loads-") as tmp:
        env = dict(os.environ)
        if "JDQN_CACHE_DIR" not in env:
            env["JDQN_CACHE_DIR"] = os.path.join(tmp, "cache")
            every = [*bench_overrides(quick), *overrides]
            every.append(f"output.out_dir={os.path.join(tmp, 'runs')}")
            timeline.spawn(every, env)
        modes = [MODES[i % len(MODES)] for i in range(processes)]
        return [{"mode": mode, "events": spawn(mode, env)} for mode in modes]


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
    parser.add_argument("--processes", type=int, default=6)
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
