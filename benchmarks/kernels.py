"""Per-kernel device profile of the in-scan learner step: which kernels run, how long
each takes on the device, and which part of the step launched it.

The step is one executable, so per-operation timers cannot see inside it; ``jax.profiler`` can.
The scan of learner steps runs under a trace; the trace's per-op events (those with an
``hlo_op`` argument, on the GPU's device streams when there is a GPU) are summed per kernel, and
each kernel is attributed to a part of the step through the ``op_name`` metadata of the compiled
HLO (the learner's ``jax.named_scope`` names, ``jdqn.agent.step.SCOPES``; ops of the backward
pass carry ``transpose(...)``). Device busy time per step against wall time per step says
whether the step is launch-bound (the device idles between kernels) or kernel-bound.

On the GPU, XLA runs the scan body as CUDA graphs (command buffers) by default, and the trace
then shows one ``command_buffer_N`` event per graph instead of its kernels: the wall time is the
real one, the per-kernel table is not. ``--no-command-buffers`` re-runs the profile in a fresh
process with ``--xla_gpu_enable_command_buffer=`` (kernels launched one by one: per-kernel device
times are right, the wall time then includes launch gaps).

    python -m benchmarks.kernels [--steps 200] [--seeds 1] [--top 25] [--json FILE]
                                 [--hlo FILE] [--set KEY=VALUE ...] [--no-command-buffers]

``--hlo`` writes the profiled program's compiled HLO, whose fusion names are the table's kernel
names: what each kernel computes, on which shapes, is read there.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

from jdqn import bench
from jdqn.accel.xla_flags import configure
from jdqn.agent.step import SCOPES
from jdqn.bench.fixture import filled_learner, scan_steps_fn, time_repeated
from jdqn.config import SMOKETEST, Config, apply_overrides

NO_COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer="  # every kernel launched on its own
_METADATA = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+) = .*?metadata=\{op_name="([^"]*)"')


def op_names(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> its ``op_name`` metadata, from compiled (optimised) HLO text."""
    names = {}
    for line in hlo_text.splitlines():
        match = _METADATA.match(line)
        if match:
            names[match.group(1)] = match.group(2)
    return names


def scope_of(op_name: str) -> str:
    """The part of the step an op belongs to: ``backward`` for transposed (VJP) ops, else the
    innermost learner scope in its name stack, else ``other``."""
    if "transpose(" in op_name:
        return "backward"
    parts = re.split(r"[/()]", op_name)
    for part in reversed(parts):
        if part in SCOPES:
            return part
    return "other"


def device_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Complete events of XLA ops: on ``/device:GPU*`` processes when the trace has any (kernels
    as the GPU ran them), else the host's XLA thunks (the CPU backend)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    processes = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    gpu = {pid for pid, name in processes.items() if name.startswith("/device:GPU")}
    ops = [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]
    return [e for e in ops if e["pid"] in gpu] if gpu else ops


def traced_device_events(work: Callable[[], object]) -> tuple[list[dict[str, Any]], float]:
    """Runs ``work()`` under ``jax.profiler``: its XLA op events (``device_events``) and the
    traced wall seconds. ``work`` must block until its results are ready."""
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir, create_perfetto_trace=True):
            start = time.perf_counter()
            work()
            traced_s = time.perf_counter() - start
        (path,) = Path(log_dir).rglob("perfetto_trace.json.gz")
        with gzip.open(path, "rt") as f:
            trace = json.load(f)
    return device_events(trace), traced_s


def summarise(
    events: Sequence[dict[str, Any]], names: dict[str, str], n_steps: int
) -> dict[str, Any]:
    """Per-kernel and per-scope device microseconds per step, and kernels per step."""
    per_kernel: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        per_kernel[e["args"]["hlo_op"]].append(float(e.get("dur", 0.0)))
    kernels: list[dict[str, Any]] = [
        {
            "kernel": op,
            "scope": scope_of(names.get(op, "")),
            "launches_per_step": len(durs) / n_steps,
            "us_per_step": sum(durs) / n_steps,
            "op_name": names.get(op, ""),
        }
        for op, durs in per_kernel.items()
    ]
    kernels.sort(key=lambda k: -k["us_per_step"])
    scopes: dict[str, dict[str, float]] = collections.defaultdict(
        lambda: {"kernels_per_step": 0.0, "us_per_step": 0.0}
    )
    for k in kernels:
        scopes[k["scope"]]["kernels_per_step"] += k["launches_per_step"]
        scopes[k["scope"]]["us_per_step"] += k["us_per_step"]
    return {
        "kernels_per_step": sum(k["launches_per_step"] for k in kernels),
        "busy_us_per_step": sum(k["us_per_step"] for k in kernels),
        "kernels": kernels,
        "scopes": dict(sorted(scopes.items(), key=lambda s: -s[1]["us_per_step"])),
    }


def run(
    cfg: Config = SMOKETEST,
    n_steps: int = 200,
    n_seeds: int = 1,
    repeats: int = 3,
    hlo_path: Path | None = None,
) -> dict[str, Any]:
    """Profile ``repeats`` scans of ``n_steps`` learner steps (``n_seeds`` vmapped when > 1);
    the compiled HLO goes to ``hlo_path`` when given."""
    if n_seeds > 1:
        from jdqn.bench.seeds import seeded_states

        learner, state = seeded_states(cfg, n_seeds)
    else:
        learner, state = filled_learner(cfg)
    # One compile: its HLO names the kernels, and the same executable is timed and traced.
    fn = scan_steps_fn(learner, n_steps, vmapped=n_seeds > 1).lower(state).compile()
    hlo = fn.as_text() or ""
    if hlo_path is not None:
        hlo_path.write_text(hlo)
    names = op_names(hlo)
    timing, state = time_repeated(fn, state, repeats)  # untraced wall clock (first call: warm-up)

    def scans():
        nonlocal state
        for _ in range(repeats):
            state, _ = fn(state)
        jax.block_until_ready(state)

    events, traced_s = traced_device_events(scans)
    summary = summarise(events, names, n_steps * repeats)
    return {
        "command_buffers": any(
            k["kernel"].startswith("command_buffer") for k in summary["kernels"]
        ),
        "device": f"{jax.devices()[0].device_kind} ({jax.default_backend()})",
        "jax": jax.__version__,
        "n_steps": n_steps,
        "n_seeds": n_seeds,
        "repeats": repeats,
        "wall_us_per_step": 1e6 * timing["median_s"] / n_steps,
        "traced_wall_us_per_step": 1e6 * traced_s / (n_steps * repeats),
        **summary,
    }


def table(result: dict[str, Any], top: int = 25) -> str:
    """Markdown: the headline, the per-scope table, then the ``top`` kernels by device time."""
    wall, busy = result["wall_us_per_step"], result["busy_us_per_step"]
    lines = [
        f"device: {result['device']}, jax {result['jax']}; {result['n_seeds']} seed(s), "
        f"{result['n_steps']} steps x {result['repeats']}",
        f"wall {wall:.1f} us/step (traced {result['traced_wall_us_per_step']:.1f}), device busy "
        f"{busy:.1f} us/step ({100 * busy / wall:.0f}% of wall), "
        f"{result['kernels_per_step']:.1f} kernels/step",
        "",
        *(
            [
                "kernels ran inside CUDA graphs (command_buffer_N rows); for the per-kernel "
                "table run with --no-command-buffers"
            ]
            if result["command_buffers"]
            else []
        ),
        "| scope | kernels/step | device us/step | share of busy |",
        "|---|---|---|---|",
    ]
    for scope, s in result["scopes"].items():
        lines.append(
            f"| {scope} | {s['kernels_per_step']:.1f} | {s['us_per_step']:.2f} | "
            f"{100 * s['us_per_step'] / max(busy, 1e-9):.0f}% |"
        )
    lines += ["", "| kernel | scope | launches/step | device us/step |", "|---|---|---|---|"]
    for k in result["kernels"][:top]:
        lines.append(
            f"| {k['kernel']} | {k['scope']} | {k['launches_per_step']:.1f} | "
            f"{k['us_per_step']:.2f} |"
        )
    return "\n".join(lines)


def _fresh_process_without_command_buffers(
    args: Sequence[str], capture: bool = False
) -> subprocess.CompletedProcess[str]:
    # XLA reads its flags when the backend starts, so a fresh process is the reliable way.
    flags = f"{os.environ.get('XLA_FLAGS', '')} {NO_COMMAND_BUFFERS}".strip()
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.kernels", *args],
        env=dict(os.environ, XLA_FLAGS=flags),
        capture_output=capture,
        text=True,
    )


def run_without_command_buffers(
    n_steps: int = 200, n_seeds: int = 1, hlo_path: Path | None = None
) -> dict[str, Any]:
    """:func:`run` in a fresh process with XLA's command buffers off (per-kernel GPU times)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "kernels.json"
        args = ["--steps", str(n_steps), "--seeds", str(n_seeds), "--json", str(out)]
        args += [] if hlo_path is None else ["--hlo", str(hlo_path)]
        done = _fresh_process_without_command_buffers(args, capture=True)
        if done.returncode != 0:
            raise RuntimeError(f"kernel profile failed: {done.stderr.strip()[-2000:]}")
        return dict(json.loads(out.read_text()))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--hlo", type=Path, default=None, help="write the compiled HLO here")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="config override KEY=VALUE"
    )
    parser.add_argument(
        "--no-command-buffers",
        action="store_true",
        help="profile in a fresh process with XLA's command buffers off (per-kernel GPU times)",
    )
    args = parser.parse_args(argv)
    if min(args.steps, args.seeds, args.repeats) < 1:
        parser.error("--steps, --seeds and --repeats must be >= 1")
    # Checked before minutes of profiling, not after.
    if args.json is not None and (problem := bench.json_problem(args.json)):
        parser.error(problem)
    if args.hlo is not None and not args.hlo.parent.is_dir():
        parser.error(f"--hlo {args.hlo}: no directory {args.hlo.parent}; fix: create it first")
    if args.no_command_buffers:
        given = argv if argv is not None else sys.argv[1:]
        rest = [a for a in given if a != "--no-command-buffers"]
        sys.exit(_fresh_process_without_command_buffers(rest).returncode)
    try:
        cfg = apply_overrides(SMOKETEST, args.overrides)
    except ValueError as error:
        parser.error(str(error))  # one line and exit status 2, before any profiling
    result = run(
        cfg, n_steps=args.steps, n_seeds=args.seeds, repeats=args.repeats, hlo_path=args.hlo
    )
    print(table(result, args.top))
    if args.json is not None:
        bench.write_json(args.json, result)


if __name__ == "__main__":
    configure()  # jdqn's XLA flags, before JAX starts a backend
    main()
