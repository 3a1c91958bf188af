"""Many seeds: S learners as one ``jax.vmap`` over a leading seed axis, stepped in ``lax.scan``.

Seeds (and folds) are a batch axis of one executable (DESIGN section 11), so the figure of merit
is seed-steps per second: ``S * steps / seconds``. Each seed has its own full buffer of random
transitions and its own keys; all use the smoketest learner with every component on.

    python -m jdqn.bench.seeds [--quick]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import jax

from jdqn.bench.breakdown import (
    N_FEATURES,
    NON_CAUSAL,
    random_transitions,
    scan_steps_fn,
    time_repeated,
)
from jdqn.config import SMOKETEST, Config
from jdqn.learner import Learner, LearnerState, make_learner

SEEDS: tuple[int, ...] = (1, 16, 128, 1024)
QUICK_SEEDS: tuple[int, ...] = (1, 16)


def seeded_states(cfg: Config, n_seeds: int) -> tuple[Learner, LearnerState]:
    """The learner and ``n_seeds`` states (leaves ``[S, ...]``), each buffer full."""
    learner = make_learner(cfg, N_FEATURES, NON_CAUSAL)
    keys = jax.random.split(jax.random.PRNGKey(0), n_seeds)

    def one(key: jax.Array) -> LearnerState:
        init_key, data_key = jax.random.split(key)
        state = learner.init(init_key)
        data = random_transitions(data_key, cfg.replay.capacity, N_FEATURES, cfg)
        return learner.insert(state, data)

    return learner, jax.jit(jax.vmap(one))(keys)


def steps_for(n_seeds: int, quick: bool) -> int:
    """Scan length: about the same number of seed-steps per timed call for every S."""
    if quick:
        return 20
    return max(20, min(500, 100_000 // n_seeds))


def run(quick: bool = False, cfg: Config = SMOKETEST) -> list[dict[str, Any]]:
    """One row per S: seconds per vmapped step, seed-steps per second, compile seconds."""
    rows = []
    repeats = 3 if quick else 5
    for n_seeds in QUICK_SEEDS if quick else SEEDS:
        learner, states = seeded_states(cfg, n_seeds)
        n_steps = steps_for(n_seeds, quick)
        timing, _ = time_repeated(scan_steps_fn(learner, n_steps, vmapped=True), states, repeats)
        step_s = timing["median_s"] / n_steps
        rows.append(
            {
                "seeds": n_seeds,
                "n_steps": n_steps,
                "us_per_vmapped_step": 1e6 * step_s,
                "seed_steps_per_s": n_seeds / step_s,
                "seed_steps_per_s_best": n_seeds * n_steps / timing["min_s"],
                "compile_s": timing["compile_s"],
            }
        )
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| seeds S | us per vmapped step | seed-steps/s | vs S=1 | compile s |",
        "|---|---|---|---|---|",
    ]
    base = rows[0]["seed_steps_per_s"] if rows else 1.0
    for r in rows:
        lines.append(
            f"| {r['seeds']} | {r['us_per_vmapped_step']:.1f} | {r['seed_steps_per_s']:,.0f} | "
            f"{r['seed_steps_per_s'] / base:.1f}x | {r['compile_s']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    print(format_table(run(parser.parse_args(argv).quick)))


if __name__ == "__main__":
    main()
