"""Two configs of the S-learner step against each other, alternated in one process.

Each S is timed as ``jdqn.bench.seeds`` times it, for config A and config B in the order
A B B A, so the ratio comes from one run on one device (drift between calls cancels). Use it to
measure a specialisation against the plain path, e.g. the GPU kernels against XLA:

    python -m benchmarks.ab --b accel.kernels=off --seeds 1 1024
    python -m benchmarks.ab --a loss.causal_weight=0 --b loss.causal_weight=0.1

``accel.pieces`` (``jdqn.config.PIECES``) switches one specialisation at a time to its plain
form:

    python -m benchmarks.ab --b accel.pieces=dense=autodiff --seeds 1 1024
    python -m benchmarks.ab --b accel.pieces=vjp=autodiff,barriers=off
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from typing import Any

from jdqn.accel.xla_flags import configure
from jdqn.bench.seeds import SEEDS, seed_counts, time_seeds
from jdqn.config import PROFILES, Config, apply_overrides


def compare(
    a: Config,
    b: Config,
    quick: bool = False,
    seeds: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """One row per S: A's and B's us per vmapped step (two runs each) and B's mean over A's."""
    rows = []
    for n_seeds in seed_counts(quick, seeds):
        us: dict[str, list[float]] = {"A": [], "B": []}
        compile_s: dict[str, list[float]] = {"A": [], "B": []}
        for name in ("A", "B", "B", "A"):
            timing, n_steps = time_seeds(a if name == "A" else b, n_seeds, quick)
            us[name].append(1e6 * timing["median_s"] / n_steps)
            compile_s[name].append(timing["compile_s"])
        ratio = statistics.mean(us["B"]) / statistics.mean(us["A"])
        rows.append({"seeds": n_seeds, "us": us, "compile_s": compile_s, "b_over_a": ratio})
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| seeds S | A us per vmapped step | B us per vmapped step | B / A |",
        "|---|---|---|---|",
    ]
    for r in rows:
        a, b = (", ".join(f"{t:.1f}" for t in r["us"][name]) for name in ("A", "B"))
        lines.append(f"| {r['seeds']} | {a} | {b} | {r['b_over_a']:.3f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="smoketest")
    parser.add_argument("--a", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--b", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--seeds", type=int, nargs="+", help=f"the S to time (default {' '.join(map(str, SEEDS))})"
    )
    args = parser.parse_args(argv)
    try:
        a, b = (apply_overrides(PROFILES[args.profile], o) for o in (args.a, args.b))
    except ValueError as error:
        parser.error(str(error))  # one line and exit status 2, before any compile
    if args.seeds and min(args.seeds) < 1:
        parser.error(f"--seeds: every S must be at least 1, got {args.seeds}")
    print(
        "; ".join(
            " ".join((f"{side}: {args.profile}", *o)) for side, o in (("A", args.a), ("B", args.b))
        )
    )
    for n_seeds in seed_counts(args.quick, args.seeds):  # one table per S, as soon as it is timed
        print(format_table(compare(a, b, args.quick, (n_seeds,))), flush=True)


if __name__ == "__main__":
    configure()  # jdqn's XLA flags, before JAX starts a backend
    main()
