"""Many seeds: S learners as one ``jax.vmap`` over a leading seed axis, stepped in ``lax.scan``.

Seeds (and folds) are a batch axis of one executable (docs/design.md, "Scale"), so the figure of
merit is seed-steps per second: ``S * steps / seconds``. Each seed has its own full buffer of
random transitions and its own keys; all use the smoketest learner with every component on.

    python -m jdqn.bench.seeds [--quick] [--seeds S ...] [--settings N] [--set KEY=VALUE ...]

``--set`` overrides the smoketest config (e.g. ``--set loss.causal_weight=0`` times the step
without the causal term). ``--settings N``: the S learners differ in their learning rate, N
values (a sweep's settings axis, issue 46), in the same program. ``benchmarks/ab.py`` times two
configs against each other.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jdqn.accel import choose
from jdqn.accel.xla_flags import configure
from jdqn.agent import Learner, LearnerState, make_learner
from jdqn.bench import markdown_table
from jdqn.bench.fixture import (
    N_FEATURES,
    NON_CAUSAL,
    filled_state,
    scan_steps_fn,
    time_repeated,
)
from jdqn.config import SMOKETEST, Config, apply_overrides

SEEDS: tuple[int, ...] = (1, 16, 128, 1024)
QUICK_SEEDS: tuple[int, ...] = (1, 16)


def seeded_states(cfg: Config, n_seeds: int, settings: int = 1) -> tuple[Learner, LearnerState]:
    """The learner and ``n_seeds`` states (leaves ``[S, ...]``), each buffer full; learner i
    with the (i mod ``settings``)-th of ``settings`` learning rates log-spaced over 0.1 to 10
    times the config's (one: the config's)."""
    learner = make_learner(cfg, N_FEATURES, NON_CAUSAL, learners=n_seeds)
    keys = jax.random.split(jax.random.PRNGKey(0), n_seeds)
    fill = partial(filled_state, learner, cfg=cfg, n_features=N_FEATURES)
    states = jax.jit(jax.vmap(fill))(keys)
    if settings > 1:
        spread = np.logspace(-1, 1, settings)[np.arange(n_seeds) % settings]
        rates = cfg.optim.learning_rate * spread
        hyper = states.hyper._replace(learning_rate=jnp.asarray(rates, jnp.float32))
        states = states.replace(hyper=hyper)  # type: ignore[attr-defined]  # flax.struct adds .replace
    return learner, states


def steps_for(n_seeds: int, quick: bool) -> int:
    """Scan length: about the same number of seed-steps per timed call for every S."""
    if quick:
        return 20
    return max(20, min(500, 100_000 // n_seeds))


def time_seeds(
    cfg: Config, n_seeds: int, quick: bool, settings: int = 1
) -> tuple[dict[str, float], int]:
    """Timing of ``n_seeds`` vmapped learners (of ``settings`` learning rates) stepped in one
    scan, and the scan's length."""
    learner, states = seeded_states(cfg, n_seeds, settings)
    n_steps = steps_for(n_seeds, quick)
    fn = scan_steps_fn(learner, n_steps, vmapped=True)
    timing, _ = time_repeated(fn, states, 3 if quick else 5)
    return timing, n_steps


def seed_counts(quick: bool, seeds: Sequence[int] | None) -> tuple[int, ...]:
    """The S to time: ``seeds`` when given, else :data:`QUICK_SEEDS` or :data:`SEEDS`."""
    if seeds:
        return tuple(seeds)
    return QUICK_SEEDS if quick else SEEDS


def run(
    quick: bool = False,
    cfg: Config = SMOKETEST,
    seeds: Sequence[int] | None = None,
    settings: int = 1,
) -> list[dict[str, Any]]:
    """One row per S: seconds per vmapped step, seed-steps per second, compile seconds."""
    rows = []
    for n_seeds in seed_counts(quick, seeds):
        timing, n_steps = time_seeds(cfg, n_seeds, quick, settings)
        step_s = timing["median_s"] / n_steps
        rows.append(
            {
                "seeds": n_seeds,
                "settings": settings,  # learning rates among the S learners
                # Which flat tail accel.kernels gave this S (auto: Pallas from 16 on a GPU).
                "update_impl": choose(
                    cfg, backend=jax.default_backend(), debug=False, learners=n_seeds
                ).tail,
                "n_steps": n_steps,
                "us_per_vmapped_step": 1e6 * step_s,
                "seed_steps_per_s": n_seeds / step_s,
                "seed_steps_per_s_best": n_seeds * n_steps / timing["min_s"],
                "compile_s": timing["compile_s"],
            }
        )
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    base = rows[0]["seed_steps_per_s"] if rows else 1.0
    header = ("seeds S", "lr settings", "us per vmapped step", "seed-steps/s", "vs S=1",
              "compile s", "flat tail")  # fmt: skip
    return markdown_table(
        header,
        (
            (r["seeds"], r["settings"], f"{r['us_per_vmapped_step']:.1f}",
             f"{r['seed_steps_per_s']:,.0f}", f"{r['seed_steps_per_s'] / base:.1f}x",
             f"{r['compile_s']:.1f}", r["update_impl"])
            for r in rows
        ),
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--seeds", type=int, nargs="+", help=f"the S to time (default {' '.join(map(str, SEEDS))})"
    )
    parser.add_argument(
        "--settings", type=int, default=1, help="learning rates among the S learners (default 1)"
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="config override KEY=VALUE"
    )
    args = parser.parse_args(argv)
    try:
        cfg = apply_overrides(SMOKETEST, args.overrides)
    except ValueError as error:
        parser.error(str(error))  # one line and exit status 2, before any compile
    if args.seeds and min(args.seeds) < 1:
        parser.error(f"--seeds: every S must be at least 1, got {args.seeds}")
    if args.settings < 1:
        parser.error(f"--settings {args.settings}: must be at least 1")
    print(format_table(run(args.quick, cfg, seeds=args.seeds, settings=args.settings)))


if __name__ == "__main__":
    configure()  # jdqn's XLA flags, before JAX starts a backend
    main()
