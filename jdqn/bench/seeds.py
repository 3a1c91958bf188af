"""Many seeds: S learners as one ``jax.vmap`` over a leading seed axis, stepped in ``lax.scan``.

Seeds (and folds) are a batch axis of one executable (DESIGN section 11), so the figure of merit
is seed-steps per second: ``S * steps / seconds``. Each seed has its own full buffer of random
transitions and its own keys; all use the smoketest learner with every component on.

    python -m jdqn.bench.seeds [--quick] [--seeds S ...] [--unroll U] [--set KEY=VALUE ...]
        [--compare-update-impl | --compare-unroll A B]

``--set`` overrides the smoketest config (e.g. ``--set loss.causal_weight=0`` times the step
without the causal term, as BENCHMARKS.md's Z1 did).

``--compare-update-impl`` times each S with the step's flat tail in XLA and as the Pallas kernels
of ``pallas_kernels.flat_tail`` (``optim.update_impl``), alternating A B B A in one process, so
the ratio is from one run on one device (it is what decided ``optim.update_impl=auto``).
``--compare-unroll A B`` does the same for ``lax.scan``'s ``unroll`` (steps per loop iteration).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from typing import Any

import jax

from jdqn.accel import update_impl
from jdqn.bench.breakdown import (
    N_FEATURES,
    NON_CAUSAL,
    random_transitions,
    scan_steps_fn,
    time_repeated,
)
from jdqn.config import SMOKETEST, Config, apply_overrides
from jdqn.learner import Learner, LearnerState, make_learner

SEEDS: tuple[int, ...] = (1, 16, 128, 1024)
QUICK_SEEDS: tuple[int, ...] = (1, 16)


def seeded_states(cfg: Config, n_seeds: int) -> tuple[Learner, LearnerState]:
    """The learner and ``n_seeds`` states (leaves ``[S, ...]``), each buffer full."""
    learner = make_learner(cfg, N_FEATURES, NON_CAUSAL, learners=n_seeds)
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


def _time_seeds(
    cfg: Config, n_seeds: int, quick: bool, unroll: int = 1
) -> tuple[dict[str, float], int]:
    """Timing of ``n_seeds`` vmapped learners stepped in one scan, and the scan's length."""
    learner, states = seeded_states(cfg, n_seeds)
    n_steps = steps_for(n_seeds, quick)
    fn = scan_steps_fn(learner, n_steps, vmapped=True, unroll=unroll)
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
    unroll: int = 1,
) -> list[dict[str, Any]]:
    """One row per S: seconds per vmapped step, seed-steps per second, compile seconds."""
    rows = []
    for n_seeds in seed_counts(quick, seeds):
        timing, n_steps = _time_seeds(cfg, n_seeds, quick, unroll)
        step_s = timing["median_s"] / n_steps
        rows.append(
            {
                "seeds": n_seeds,
                # Which flat tail optim.update_impl gave this S (auto: Pallas from 16 on a GPU).
                "update_impl": update_impl(
                    cfg, jax.default_backend(), debug=False, learners=n_seeds
                ),
                "n_steps": n_steps,
                "us_per_vmapped_step": 1e6 * step_s,
                "seed_steps_per_s": n_seeds / step_s,
                "seed_steps_per_s_best": n_seeds * n_steps / timing["min_s"],
                "compile_s": timing["compile_s"],
            }
        )
    return rows


def _alternate(
    variants: dict[str, tuple[Config, int]], quick: bool, seeds: Sequence[int] | None
) -> list[dict[str, Any]]:
    """One row per S: us per vmapped step and compile seconds of two named (config, unroll)
    variants, timed in the order A B B A, and B's mean time over A's."""
    names = tuple(variants)
    order = (*names, *reversed(names))
    rows = []
    for n_seeds in seed_counts(quick, seeds):
        times: dict[str, list[float]] = {name: [] for name in names}
        compile_s: dict[str, list[float]] = {name: [] for name in names}
        for name in order:
            cfg, unroll = variants[name]
            timing, n_steps = _time_seeds(cfg, n_seeds, quick, unroll)
            times[name].append(1e6 * timing["median_s"] / n_steps)
            compile_s[name].append(timing["compile_s"])
        a, b = (statistics.mean(times[name]) for name in names)
        rows.append(
            {"seeds": n_seeds, "impls": names, "us": times, "ratio": b / a, "compile_s": compile_s}
        )
    return rows


def compare_update_impls(
    quick: bool = False,
    cfg: Config = SMOKETEST,
    impls: tuple[str, str] = ("xla", "pallas"),
    seeds: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """:func:`_alternate` over two ``optim.update_impl`` values."""
    variants = {impl: (apply_overrides(cfg, [f"optim.update_impl={impl}"]), 1) for impl in impls}
    return _alternate(variants, quick, seeds)


def compare_unrolls(
    unrolls: tuple[int, int],
    quick: bool = False,
    cfg: Config = SMOKETEST,
    seeds: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """:func:`_alternate` over two scan ``unroll`` values (steps per loop iteration)."""
    return _alternate({f"unroll {u}": (cfg, u) for u in unrolls}, quick, seeds)


def format_comparison(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return ""
    a, b = rows[0]["impls"]
    lines = [
        f"| seeds S | {a} us per vmapped step | {b} us per vmapped step | {b} / {a} |",
        "|---|---|---|---|",
    ]
    for r in rows:
        ta, tb = (", ".join(f"{t:.1f}" for t in r["us"][impl]) for impl in (a, b))
        lines.append(f"| {r['seeds']} | {ta} | {tb} | {r['ratio']:.3f} |")
    for r in rows:  # the scan program's compile per run
        spent = "; ".join(
            f"{impl} " + ", ".join(f"{t:.1f}" for t in r["compile_s"][impl]) for impl in (a, b)
        )
        lines.append(f"compile s at S = {r['seeds']}: {spent}")
    return "\n".join(lines)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| seeds S | us per vmapped step | seed-steps/s | vs S=1 | compile s | flat tail |",
        "|---|---|---|---|---|---|",
    ]
    base = rows[0]["seed_steps_per_s"] if rows else 1.0
    for r in rows:
        lines.append(
            f"| {r['seeds']} | {r['us_per_vmapped_step']:.1f} | {r['seed_steps_per_s']:,.0f} | "
            f"{r['seed_steps_per_s'] / base:.1f}x | {r['compile_s']:.1f} | {r['update_impl']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--compare-update-impl",
        action="store_true",
        help="time every S with optim.update_impl=xla and =pallas (GPU), alternating",
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", help=f"the S to time (default {' '.join(map(str, SEEDS))})"
    )
    parser.add_argument(
        "--unroll", type=int, default=1, help="learner steps per scan loop iteration (default 1)"
    )
    parser.add_argument(
        "--compare-unroll",
        type=int,
        nargs=2,
        metavar=("A", "B"),
        help="time every S with scan unroll A and B, alternating",
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
    if min(args.unroll, *(args.compare_unroll or [1])) < 1:
        parser.error("--unroll / --compare-unroll: steps per loop iteration must be at least 1")
    if not (args.compare_update_impl or args.compare_unroll):
        print(format_table(run(args.quick, cfg, seeds=args.seeds, unroll=args.unroll)))
        return
    # A comparison times four programs per S: one table per S, printed as soon as it is timed,
    # so a run cut short by a time limit still leaves the S it finished.
    for n_seeds in seed_counts(args.quick, args.seeds):
        if args.compare_update_impl:
            rows = compare_update_impls(args.quick, cfg, seeds=(n_seeds,))
        else:
            rows = compare_unrolls(tuple(args.compare_unroll), args.quick, cfg, seeds=(n_seeds,))
        print(format_comparison(rows), flush=True)


if __name__ == "__main__":
    main()
