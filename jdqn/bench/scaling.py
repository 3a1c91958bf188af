"""Scaling over devices: seed-steps per second of the sharded learner step on 1..N devices.

Learners are placed as a walk-forward run places them (``jdqn.run.placement``: the learner axis
sharded over a one-axis mesh, each device stepping its own learners in ``lax.scan``). Weak
scaling keeps the learners per device fixed (the total grows with N); strong scaling keeps the
total fixed. Efficiency = throughput(N) / (N x throughput(1)), 1.0 being perfect.

On a CPU with one device the section runs in a fresh process on forced host devices
(``--xla_force_host_platform_device_count``): those share the host's cores, so the figures show
the placement's overhead, not a speed-up.

    python -m jdqn.bench.scaling [--quick] [--devices N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import jax

from jdqn.accel.xla_flags import configure
from jdqn.bench import markdown_table
from jdqn.bench.fixture import scan_steps, time_repeated
from jdqn.bench.seeds import seeded_states
from jdqn.bench.walkforward_run import run_worker
from jdqn.config import SMOKETEST, Config
from jdqn.run.placement import Placement

FORCED_CPU_DEVICES = 4


def device_counts(available: int) -> list[int]:
    """1, 2, 4, ... up to ``available``, and ``available`` itself."""
    counts = [n for n in (2**k for k in range(12)) if n <= available]
    return counts if counts[-1] == available else [*counts, available]


def _throughput(
    cfg: Config, devices: tuple[Any, ...], learners: int, steps: int, repeats: int
) -> dict[str, float]:
    place = Placement(devices, learners)
    learner, states = seeded_states(cfg, learners)
    # Each device steps its own learners.
    fn = place.local(scan_steps(learner, steps, vmapped=True), (True,), donate_argnums=0)
    timing, _ = time_repeated(fn, place.learner_arrays(states), repeats)
    return {
        "seed_steps_per_s": learners * steps / timing["median_s"],
        "compile_s": timing["compile_s"],
    }


def measure(cfg: Config, quick: bool, max_devices: int | None = None) -> list[dict[str, Any]]:
    """Weak and strong scaling rows on this process's devices."""
    devices = tuple(jax.local_devices())[: max_devices or None]
    per_device = 2 if quick else (16 if devices[0].platform == "cpu" else 256)
    steps, repeats = (10, 2) if quick else (50, 5)
    counts = device_counts(len(devices))
    rows = []
    for mode, learners_for in (
        ("weak", lambda n: per_device * n),
        ("strong", lambda n: per_device * counts[-1]),
    ):
        base = None
        for n in counts:
            learners = learners_for(n)
            timing = _throughput(cfg, devices[:n], learners, steps, repeats)
            base = base or timing["seed_steps_per_s"]
            rows.append(
                {
                    "scaling": mode,
                    "devices": n,
                    "learners": learners,
                    "seed_steps_per_s": timing["seed_steps_per_s"],
                    "efficiency": timing["seed_steps_per_s"] / (n * base),
                    "compile_s": timing["compile_s"],
                    "platform": devices[0].platform,
                }
            )
    return rows


def run(quick: bool, cfg: Config = SMOKETEST) -> list[dict[str, Any]]:
    """The section's rows: in this process, or, on a CPU with one device, in a fresh one on
    forced host devices."""
    if jax.default_backend() != "cpu" or len(jax.local_devices()) > 1:
        return measure(cfg, quick)
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={FORCED_CPU_DEVICES}"
    ).strip()
    command = [sys.executable, "-m", "jdqn.bench.scaling", "--json-only", "--config", cfg.to_json()]
    _, lines = run_worker([*command, *(["--quick"] if quick else [])], env, tag="")
    return list(json.loads(lines[-1]))


def section(quick: bool, cfg: Config) -> dict[str, Any]:
    """The ``scaling`` section of ``jdqn bench`` (rows and their table)."""
    rows = run(quick, cfg)
    return {"rows": rows, "table": format_table(rows)}


def format_table(rows: list[dict[str, Any]]) -> str:
    table = markdown_table(
        ("scaling", "devices", "learners", "seed-steps/s", "efficiency"),
        (
            (
                r["scaling"],
                r["devices"],
                r["learners"],
                f"{r['seed_steps_per_s']:,.0f}",
                f"{r['efficiency']:.2f}",
            )
            for r in rows
        ),
    )
    if rows and rows[0]["platform"] == "cpu":
        table += "\n\n(CPU: forced host devices share the cores; this shows overhead, not speed)"
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--devices", type=int, help="at most this many devices")
    parser.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cfg = Config.from_json(args.config) if args.config else SMOKETEST
    rows = measure(cfg, args.quick, args.devices)
    print(json.dumps(rows) if args.json_only else format_table(rows))


if __name__ == "__main__":
    configure()  # jdqn's XLA flags, before JAX starts a backend
    main()
