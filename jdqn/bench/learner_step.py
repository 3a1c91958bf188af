"""Benchmark of one learner step at the smoketest profile: per call vs inside ``lax.scan``.

Shapes: batch 64 (+16 HER donors), a full 256-slot buffer, hidden [64, 64], 51 atoms, 3 actions;
every component the smoketest profile turns on (PER, donors, spectral norm, double-DQN target
and projection, both loss parts, vaccine, budget, causal term, Adam, target sync, priorities,
guard). Three figures:

- compile: the first call of the jitted, donated step (trace + XLA compile), in seconds;
- per call: the jitted, donated step called from a Python loop, ``block_until_ready`` after
  each call, median over ``repeats`` calls (what a host-driven training loop pays per step);
- in scan: ``n_scan`` steps inside one ``lax.scan`` (one executable, no dispatch), total time /
  ``n_scan``, median over ``scan_repeats`` runs; its compile time is reported separately.

    python -m jdqn.bench.learner_step [--n-scan 1000] [--repeats 200]
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jdqn.accel.xla_flags import configure
from jdqn.bench.fixture import ALPHA, BETA, filled_learner, scan_steps_fn, time_repeated
from jdqn.config import SMOKETEST, Config


def run(
    cfg: Config = SMOKETEST,
    n_scan: int = 1000,
    repeats: int = 200,
    scan_repeats: int = 3,
) -> dict[str, Any]:
    """Time the learner step of ``cfg``; returns microseconds per step and compile seconds."""
    alpha, beta = jnp.float32(ALPHA), jnp.float32(BETA)

    learner, state = filled_learner(cfg)
    step = jax.jit(learner.step, donate_argnums=0)
    per_call, state = time_repeated(lambda s: step(s, alpha, beta), state, repeats, warmup=5)
    halted = bool(state.guard.halted)

    learner, state = filled_learner(cfg)
    # compile_s here includes one run of n_scan steps.
    in_scan, state = time_repeated(scan_steps_fn(learner, n_scan), state, scan_repeats)
    halted |= bool(state.guard.halted)

    per_call_us = 1e6 * per_call["median_s"]
    in_scan_us = 1e6 * in_scan["median_s"] / n_scan
    return {
        "device": f"{jax.devices()[0].device_kind} ({jax.default_backend()})",
        "jax": jax.__version__,
        "batch": cfg.train.batch_size,
        "capacity": cfg.replay.capacity,
        "hidden": list(cfg.network.hidden),
        "per_call_us": per_call_us,
        "per_call_min_us": 1e6 * per_call["min_s"],
        "repeats": repeats,
        "in_scan_us": in_scan_us,
        "n_scan": n_scan,
        "scan_repeats": scan_repeats,
        "compile_step_s": per_call["compile_s"],
        "compile_scan_s": in_scan["compile_s"],
        "per_call_over_in_scan": per_call_us / in_scan_us,
        "halted": halted,  # must be False: a halted learner does less work
    }


def table(result: dict[str, Any]) -> str:
    """Markdown table of :func:`run`'s result."""
    return "\n".join(
        [
            f"device: {result['device']}, jax {result['jax']}, host {platform.node()}; batch "
            f"{result['batch']}, buffer {result['capacity']} full, hidden {result['hidden']}",
            "",
            "| mode | us/step | detail |",
            "|---|---|---|",
            f"| per call (jit, donated, block each call) | {result['per_call_us']:.1f} | median "
            f"of {result['repeats']}, min {result['per_call_min_us']:.1f} |",
            f"| inside lax.scan | {result['in_scan_us']:.1f} | {result['n_scan']} steps, median "
            f"of {result['scan_repeats']} runs |",
            f"| compile: step / scan | {result['compile_step_s']:.1f} s / "
            f"{result['compile_scan_s']:.1f} s | the scan's includes its first run |",
            "",
            f"per call / in scan: {result['per_call_over_in_scan']:.1f}x; "
            f"guard halted: {result['halted']}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-scan", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--scan-repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(table(run(SMOKETEST, args.n_scan, args.repeats, args.scan_repeats)))


if __name__ == "__main__":
    configure()  # jdqn's XLA flags, before JAX starts a backend
    main()
