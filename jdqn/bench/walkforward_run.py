"""The README main command's work, timed cold and warm in fresh processes.

``jdqn walkforward`` on the smoketest profile (3 folds x 4 epochs, 60,000 synthetic bars) is run
twice, each time in a new Python process so nothing is shared but the persistent XLA compilation
cache (``JDQN_CACHE_DIR``, see ``jdqn.run.walkforward.enable_compilation_cache``):

- cold: a fresh, empty cache directory, so every executable is compiled;
- warm: the same directory again, so executables load from the caches: the training, init and
  evaluation programs from jdqn's own (``jdqn.accel.executables``: no tracing, no compile event;
  their load time is part of ``run``), the smaller programs from JAX's compilation cache.

Each worker reports the wall time of ``run_walkforward`` and, from JAX's monitoring events
(:class:`CompileTimes`; on a cache hit the backend event covers the cache load instead), the
seconds spent tracing, lowering and compiling, in all and for the training program alone.
Programs compile on several threads at once (``jdqn.run.walkforward`` compiles ahead of use), so
the summed compile seconds can exceed the run's wall time; ``run`` is ``total`` less the union of
the compile events' intervals (``compiling``). The parent also reports the whole process wall
time (interpreter start and imports included: what a user waits for). Outputs whose packages are
missing (TensorBoard, plots) are turned off, and the table says so.

    python -m jdqn.bench.walkforward_run            # parent: cold + warm
    python -m jdqn.bench.walkforward_run --worker   # one timed run (used by the parent)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jdqn.accel.xla_flags import configure
from jdqn.bench import markdown_table

RESULT_TAG = "JDQN_BENCH_RESULT "
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
# Optional output packages -> the override that makes the run not need them.
OPTIONAL_OUTPUTS = {
    "tensorboardX": "output.tensorboard=false",
    "matplotlib": "output.plots=false",
}


# The training program (``jdqn.run.walkforward``: one chunk of epochs for every run of a group).
TRAINING_PROGRAM = "run_chunk"


def program_name(fun_name: str) -> str:
    """``jit(run_chunk)`` (lowering and compile events) and ``run_chunk`` (tracing) -> one name."""
    if fun_name.startswith("jit(") and fun_name.endswith(")"):
        return fun_name[4:-1]
    return fun_name


class CompileTimes:
    """A ``jax.monitoring`` duration listener: seconds and counts per event, the compile
    seconds (trace + lower + backend compile) per program, from the events' ``fun_name``, and
    each compile event's interval on ``time.perf_counter``'s clock (JAX reports an event when
    it ends, on the thread that ran it)."""

    def __init__(self) -> None:
        self.durations: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.per_program: dict[str, float] = defaultdict(float)
        self.intervals: list[tuple[float, float]] = []

    def __call__(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        self.durations[event] += duration_secs
        self.counts[event] += 1
        if event in COMPILE_EVENTS:
            self.per_program[program_name(str(kwargs.get("fun_name", "?")))] += duration_secs
            end = time.perf_counter()
            self.intervals.append((end - duration_secs, end))

    def top_programs(self, n: int) -> dict[str, float]:
        """The n programs that took longest to compile, slowest first."""
        return dict(sorted(self.per_program.items(), key=lambda kv: -kv[1])[:n])


def covered_s(intervals: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` inside at least one of ``intervals`` (their union's length
    there: overlapping compiles on several threads count once)."""
    total, reach = 0.0, start
    for lo, hi in sorted(intervals):
        lo, hi = max(lo, reach), min(hi, end)
        if hi > lo:
            total += hi - lo
            reach = hi
    return total


def missing_outputs() -> list[str]:
    """Optional output packages not importable here."""
    return [name for name in OPTIONAL_OUTPUTS if importlib.util.find_spec(name) is None]


def worker(overrides: Sequence[str]) -> dict[str, Any]:
    """One main-command run in this process; timings in seconds."""
    start = time.perf_counter()
    import jax
    from jax import monitoring

    times = CompileTimes()
    monitoring.register_event_duration_secs_listener(times)
    durations, counts = times.durations, times.counts
    from jdqn.config import apply_overrides, profile
    from jdqn.run.walkforward import run_walkforward

    import_s = time.perf_counter() - start
    cfg = apply_overrides(profile("smoketest"), list(overrides))
    start = time.perf_counter()
    outcome = run_walkforward(
        cfg, progress=False, name="bench", log=lambda _: None, plot_processes=True
    )
    end = time.perf_counter()
    total_s = end - start
    compile_s = sum(durations[e] for e in COMPILE_EVENTS)
    compiling_s = covered_s(times.intervals, start, end)
    steps = sum(int(f["training"]["learner_steps"]) for f in outcome.results["folds"])
    return {
        "import_s": import_s,
        "walkforward_s": total_s,
        "compile_s": compile_s,
        "compiling_s": compiling_s,
        "run_s": total_s - compiling_s,
        "backend_compiles": counts["/jax/core/compile/backend_compile_duration"],
        "training_compile_s": times.per_program[TRAINING_PROGRAM],
        "program_compile_s": times.top_programs(6),
        "cache_hits_s_saved": durations["/jax/compilation_cache/compile_time_saved_sec"],
        "learner_steps": steps,
        "halted": outcome.halted,
        "backend": jax.default_backend(),
        "events": dict(durations),
    }


def run_worker(command: Sequence[str], env: dict[str, str], tag: str) -> tuple[float, list[str]]:
    """Runs a bench worker process (``python -m MODULE --worker ...``): its wall seconds and the
    lines of its stdout that start with ``tag``, the tag removed; a failed worker, or one that
    printed no such line, raises with the end of its output."""
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - start
    lines = [line[len(tag) :] for line in done.stdout.splitlines() if line.startswith(tag)]
    if done.returncode != 0 or not lines:
        tail = (done.stdout + done.stderr)[-2000:]
        raise RuntimeError(f"{command[2]} worker failed (exit {done.returncode}):\n{tail}")
    return wall_s, lines


def _spawn(cache_dir: str, out_dir: str, overrides: Sequence[str]) -> dict[str, Any]:
    env = dict(os.environ, JDQN_CACHE_DIR=cache_dir)
    command = [sys.executable, "-m", "jdqn.bench.walkforward_run", "--worker"]
    command += [f"--set={o}" for o in (*overrides, f"output.out_dir={out_dir}")]
    wall_s, lines = run_worker(command, env, RESULT_TAG)
    result = json.loads(lines[-1])
    result["process_wall_s"] = wall_s
    return result


# The work of ``quick`` runs: 1 fold, 1 epoch, fewer bars, so CPU smoke runs stay short.
QUICK_OVERRIDES = (
    "data.synthetic_bars=12000",
    "walkforward.n_folds=1",
    "walkforward.train_bars=4000",
    "walkforward.test_bars=2000",
    "train.epochs=1",
)


def bench_overrides(quick: bool) -> list[str]:
    """What every main-command bench run adds to the smoketest profile: the outputs whose
    packages are missing turned off, and :data:`QUICK_OVERRIDES` when ``quick``."""
    extra = [OPTIONAL_OUTPUTS[name] for name in missing_outputs()]
    return [*extra, *QUICK_OVERRIDES] if quick else extra


def run(quick: bool = False, overrides: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Rows ``cold`` and ``warm`` of the main command (:func:`bench_overrides` + ``overrides``)."""
    # An override the caller also gives (the H200's ``output.tensorboard=false``) once.
    overrides = list(dict.fromkeys([*bench_overrides(quick), *overrides]))
    rows = []
    with tempfile.TemporaryDirectory(prefix="jdqn-bench-") as tmp:
        cache_dir = str(Path(tmp) / "xla-cache")
        for label in ("cold", "warm"):
            row = _spawn(cache_dir, str(Path(tmp) / "runs" / label), overrides)
            row.update(run=label, overrides=overrides)
            rows.append(row)
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    seconds = "process_wall_s walkforward_s compile_s compiling_s training_compile_s run_s import_s"
    header = ["run", "process wall s", "walkforward s", "compile s, summed", "compiling s, wall"]
    header += ["training-program compile s", "run s", "imports s", "compiles"]
    cells = [
        (r["run"], *(f"{r[k]:.1f}" for k in seconds.split()), r["backend_compiles"]) for r in rows
    ]
    lines = [markdown_table(header, cells)]
    lines.append(
        "\ncompile s, summed: trace + lower + compile over every program and thread; compiling "
        "s, wall: the time in which any of those ran; run s: walkforward s less that."
    )
    if rows and rows[0]["overrides"]:
        lines.append(f"\noverrides: {' '.join(rows[0]['overrides'])}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help="one timed run in this process")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    if args.worker:
        result = worker(args.overrides)
        print(RESULT_TAG + json.dumps(result), flush=True)
        # End as a finished ``jdqn walkforward`` does (jdqn.cli.console): without the
        # interpreter's teardown, which the process wall time would otherwise include.
        sys.stderr.flush()
        os._exit(0)
    else:
        print(format_table(run(args.quick, args.overrides)))


if __name__ == "__main__":
    configure()  # jdqn's XLA flags, before JAX starts a backend
    main()
