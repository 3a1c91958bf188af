"""Where a main command's time goes: worker processes with a timeline of their phases.

``jdqn.bench.walkforward_run`` gives a start's totals; this gives its order. Each worker runs the
README main command's work (smoketest profile, plots in worker processes, as ``jdqn walkforward``
does) in a fresh process, with the run's host-side steps wrapped in timers: the data, the
run directory, the first device transfers, the stored programs' loads, each chunk's metrics and
checkpoint, the judge, the writes' wait, the results. Every event carries the seconds since the
parent started the process and the thread it ran on, so the interpreter's start, the imports,
the waits on worker threads and the teardown after the last line each get a figure.

The workers share one ``JDQN_CACHE_DIR`` (a temporary one unless the variable is set): the
first of them is cold when the cache is empty, the others warm.

    python -m benchmarks.timeline [--processes 3] [--events] [--quick] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from jdqn.accel.xla_flags import configure
from jdqn.bench.walkforward_run import bench_overrides, run_worker

EVENT_TAG = "JDQN_TIMELINE "
START_VAR = "JDQN_TIMELINE_T0"
# Timed steps: (module, attribute, label), wrapped where the run looks them up (a function that
# jdqn.run.walkforward imported by name is wrapped there). Methods are given as "Class.method".
TIMED = (
    ("jdqn.run.walkforward", "load_data", "load_data"),
    ("jdqn.run.rundir", "new_run_dir", "new_run_dir"),
    ("jdqn.run.walkforward", "_stack", "device transfer"),
    ("jdqn.run.walkforward", "make_train", "make_train"),
    ("jdqn.accel.executables", "ExecutableCache.load", "program load"),
    ("jdqn.accel.executables", "ExecutableCache.compile", "program compile or load"),
    ("jdqn.run.walkforward", "_baselines", "baselines"),
    ("jdqn.run.walkforward", "_train_group", "training"),
    ("jdqn.run.metrics_log", "MetricsLog.add", "chunk metrics"),
    ("jdqn.run.checkpoint", "Checkpointer.save", "checkpoint save"),
    ("jdqn.run.checkpoint", "Checkpointer.close", "checkpoint close"),
    ("jdqn.run.walkforward", "_judge_group", "judge"),
    ("jdqn.run.report", "BackgroundWrites.__exit__", "writes wait"),
    ("jdqn.run.rundir", "write_json", "results"),
    ("jdqn.run.rundir", "finalize", "finalize"),
)
# Marks of the summary table: the first event with each label.
MARKS = (
    "imports done",
    "< device transfer",
    "< training",
    "> judge",
    "> writes wait",
    "< writes wait",
    "run end",
)


def _emit(label: str, start: float) -> None:
    thread = threading.current_thread().name
    print(f"{EVENT_TAG}{time.time() - start:.3f} {thread} {label}", flush=True)


def _timed(function: Callable[..., Any], label: str, start: float) -> Callable[..., Any]:
    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        _emit(f"> {label}", start)
        try:
            return function(*args, **kwargs)
        finally:
            _emit(f"< {label}", start)

    return timed


def worker(overrides: Sequence[str]) -> None:
    """One main command's work in this process, its events on stdout; ends like the command."""
    start = float(os.environ[START_VAR])
    _emit("python up", start)
    import importlib

    from jdqn.cli import end_process
    from jdqn.config import apply_overrides, profile
    from jdqn.run.walkforward import run_walkforward

    for module_name, attribute, label in TIMED:
        owner: Any = importlib.import_module(module_name)
        *classes, name = attribute.split(".")
        for cls in classes:
            owner = getattr(owner, cls)
        setattr(owner, name, _timed(getattr(owner, name), label, start))
    _emit("imports done", start)
    cfg = apply_overrides(profile("smoketest"), list(overrides))
    run_walkforward(cfg, progress=False, name="timeline", log=lambda _: None, plot_processes=True)
    _emit("run end", start)
    end_process(0)


def spawn(overrides: Sequence[str], env: dict[str, str]) -> tuple[float, list[tuple[float, str]]]:
    """One worker process with ``overrides`` and ``env``: its wall seconds and its events."""
    command = [sys.executable, "-m", "benchmarks.timeline", "--worker"]
    command += [f"--set={o}" for o in overrides]
    wall, lines = run_worker(command, {**env, START_VAR: repr(time.time())}, EVENT_TAG)
    events = []
    for line in lines:
        seconds, thread, label = line.split(" ", 2)
        events.append((float(seconds), f"[{thread}] {label}"))
    return wall, events


def run(
    processes: int = 3, quick: bool = False, overrides: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """``processes`` workers in a row sharing one cache: wall seconds and events of each."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="jdqn-timeline-") as tmp:
        env = dict(os.environ)
        env.setdefault("JDQN_CACHE_DIR", os.path.join(tmp, "cache"))
        every = [
            *bench_overrides(quick),
            *overrides,
            f"output.out_dir={os.path.join(tmp, 'runs')}",
        ]
        for index in range(processes):
            wall, events = spawn(every, env)
            rows.append({"process": index, "wall_s": wall, "events": events})
    return rows


def marks(events: Sequence[tuple[float, str]]) -> dict[str, float]:
    """Seconds of the first event with each of :data:`MARKS`' labels."""
    found: dict[str, float] = {}
    for seconds, text in events:
        label = text.split("] ", 1)[1]
        if label in MARKS and label not in found:
            found[label] = seconds
    return found


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| process | wall s | " + " | ".join(MARKS) + " |",
        "|---|---|" + "---|" * len(MARKS),
    ]
    for row in rows:
        found = marks(row["events"])
        cells = [f"{found[m]:.2f}" if m in found else "" for m in MARKS]
        lines.append(f"| {row['process']} | {row['wall_s']:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help="one timed run in this process")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--events", action="store_true", help="every event of the last process")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.overrides)
    if args.processes < 1:
        parser.error(f"--processes {args.processes}: need at least 1")
    rows = run(args.processes, args.quick, args.overrides)
    print(format_table(rows))
    if args.events:
        print("\n".join(f"{seconds:8.3f} {text}" for seconds, text in rows[-1]["events"]))


if __name__ == "__main__":
    configure()  # jdqn's XLA flags, before JAX starts a backend
    main()
