"""The learning scorecard: does the agent sit out without an edge and take a planted one?

``jdqn bench --only learning`` runs the walk-forward at a profile (``default``) over S seeds x the
profile's folds on each case below and reports, per case, over the seed-folds: the share above 0
and above each baseline of the same fold (``jdqn.evaluation.rollouts``,
``jdqn.evaluation.baselines``), the median and
the interquartile mean (IQM; Agarwal et al., 2021) of net $ and Sharpe with percentile-bootstrap
95 % confidence intervals, position changes per 1,000 bars, and on synthetic data the median ratio
of the agent's net to the oracle's.

Cases: a martingale (no edge: flat is the best policy), planted momentum 0.2 and 0.3
(``jdqn.data.synth``), a cost sweep on planted 0.3 (0, 0.5, 2 and 4 x the ES costs; 1 x is the
planted 0.3 case) and the real ES sample (``tests/data``, folds sized for its 2,264 bars). On a
CPU, or with ``--quick``, it runs small: 2 seeds on the martingale, planted 0.3 and the ES sample.

``python -m jdqn.bench.learning --cases planted_0.3,martingale --seeds 4 --set train.epochs=8``
runs chosen cases with overrides (what a sweep over learner settings uses); ``--versus
loss.alpha_schedule=[0]`` also runs each case with more overrides on the same seeds and reports
the paired difference (e.g. whether the C51 blend beats MSE only).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jdqn.accel.xla_flags import configure
from jdqn.bench import markdown_table
from jdqn.config import DEFAULT, Config, apply_overrides
from jdqn.evaluation import stats

ES_SAMPLE = Path(__file__).resolve().parents[2] / "tests" / "data" / "es_2013-09_1min.csv"
ES_FOLDS = (
    "walkforward.train_bars=1000",
    "walkforward.test_bars=300",
    "walkforward.purge_bars=60",
    "train.n_slices=16",
)


def _costs(multiple: float) -> tuple[str, ...]:
    return (
        "data.signal_strength=0.3",
        f"env.slippage_ticks={1.0 * multiple}",
        f"env.commission_ticks={0.2 * multiple}",
    )


CASES: dict[str, tuple[str, ...]] = {
    "martingale": ("data.signal_strength=0.0",),
    "planted_0.2": ("data.signal_strength=0.2",),
    "planted_0.3": ("data.signal_strength=0.3",),
    "cost_0x": _costs(0.0),
    "cost_0.5x": _costs(0.5),
    "cost_2x": _costs(2.0),
    "cost_4x": _costs(4.0),
    "es_sample": (f"data.path={ES_SAMPLE}", *ES_FOLDS),
}
SMALL_CASES = ("martingale", "planted_0.3", "es_sample")


def _by_fold(values: np.ndarray, folds: np.ndarray) -> list[np.ndarray]:
    """``values`` split into one stratum per fold (the bootstrap resamples within folds)."""
    return [values[folds == fold] for fold in np.unique(folds)]


def score(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The scorecard of one case from its walk-forward result rows (``results["folds"]``)."""
    ok = [row for row in rows if row["agent"] is not None]
    folds = np.array([row["fold"] for row in ok])
    net = np.array([row["agent"]["net_pnl_usd"] for row in ok])
    sharpe = np.array([row["agent"]["sharpe"] for row in ok])
    per_1000 = np.array([1_000 * row["agent"]["n_trades"] / row["agent"]["n_bars"] for row in ok])
    names = list(ok[0]["baselines"]) if ok else []
    above = {
        name: float(
            np.mean(
                [row["agent"]["net_pnl_usd"] > row["baselines"][name]["net_pnl_usd"] for row in ok]
            )
        )
        for name in names
    }
    # The agent against each baseline on the same seed-fold (same test window).
    minus_baseline = {
        name: stats.aggregate(
            _by_fold(net - np.array([row["baselines"][name]["net_pnl_usd"] for row in ok]), folds)
        )
        for name in names
    }
    baseline_median = {
        name: float(np.median([row["baselines"][name]["net_pnl_usd"] for row in ok]))
        for name in names
    }
    result: dict[str, Any] = {
        "runs": len(rows),
        "halted": len(rows) - len(ok),
        "share_positive": float(np.mean(net > 0)) if ok else 0.0,
        "share_above": above,
        "net_usd": stats.aggregate(_by_fold(net, folds)) if ok else None,
        "sharpe": stats.aggregate(_by_fold(sharpe, folds)) if ok else None,
        "changes_per_1000_bars": float(np.median(per_1000)) if ok else None,
        "baseline_median_net_usd": baseline_median,
        "agent_minus_baseline_net_usd": minus_baseline,
        "net_usd_by_run": [float(x) for x in net],
        "fold_seed_by_run": [[int(row["fold"]), int(row["seed"])] for row in ok],
    }
    if ok and "oracle" in names:
        oracle = np.array([row["baselines"]["oracle"]["net_pnl_usd"] for row in ok])
        result["oracle_ratio"] = (
            float(np.median(net) / np.median(oracle)) if np.median(oracle) > 0 else None
        )
    return result


def paired(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """A against B on the seed-folds both scored (same fold and seed: the same data, the same
    initial keys): the share where A nets at least B, and the median and IQM of A - B net $
    with bootstrap 95 % intervals stratified by fold."""
    b_net = dict(zip(map(tuple, b["fold_seed_by_run"]), b["net_usd_by_run"], strict=True))
    pairs = [
        (fold_seed[0], net - b_net[tuple(fold_seed)])
        for fold_seed, net in zip(a["fold_seed_by_run"], a["net_usd_by_run"], strict=True)
        if tuple(fold_seed) in b_net
    ]
    folds = np.array([fold for fold, _ in pairs])
    diff = np.array([d for _, d in pairs], np.float64)
    return {
        "pairs": len(pairs),
        "share_a_at_least_b": float(np.mean(diff >= 0)) if pairs else None,
        "net_usd_a_minus_b": stats.aggregate(_by_fold(diff, folds)),
    }


def run_case(cfg: Config, overrides: Sequence[str]) -> list[dict[str, Any]]:
    """One walk-forward of ``cfg`` with ``overrides`` in a scratch directory; its fold rows."""
    from jdqn.run.walkforward import run_walkforward

    with tempfile.TemporaryDirectory() as scratch:
        case_cfg = apply_overrides(
            cfg,
            [
                f"output.out_dir={scratch}",
                "output.plots=false",
                "output.tensorboard=false",
                "output.checkpoints=false",
                *overrides,
            ],
        )
        outcome = run_walkforward(case_cfg, progress=False, log=lambda _: None)
        return outcome.results["folds"]


def run(
    small: bool,
    cfg: Config = DEFAULT,
    *,
    cases: Sequence[str] | None = None,
    seeds: int | None = None,
    overrides: Sequence[str] = (),
    versus: Sequence[str] | None = None,
    echo: Callable[[str], None] = lambda _: None,
    on_case: Callable[[list[dict[str, Any]]], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """Score ``cases`` (all, or the small set) of ``cfg`` with ``overrides``; one row each.
    Given ``versus`` (more overrides), each case also runs with them on the same seeds, and its
    row gains that run's score and the :func:`paired` comparison (A: without, B: with)."""
    chosen = list(cases or (SMALL_CASES if small else CASES))
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        raise ValueError(f"learning scorecard: unknown case {unknown[0]!r}; valid: {list(CASES)}")
    n_seeds = seeds or (2 if small else 8)
    rows = []
    for case in chosen:
        start = time.perf_counter()
        fold_rows = run_case(cfg, [f"train.seeds={n_seeds}", *overrides, *CASES[case]])
        row = {"case": case, "seeds": n_seeds, "wall_s": time.perf_counter() - start}
        rows.append(row | score(fold_rows))
        echo(format_table(rows[-1:]))
        if versus is not None:
            b = score(run_case(cfg, [f"train.seeds={n_seeds}", *overrides, *CASES[case], *versus]))
            rows[-1]["versus"] = {
                "overrides": list(versus),
                "score": b,
                "paired": paired(rows[-1], b),
            }
            echo(format_paired(rows[-1:]))
        on_case(rows)  # a sweep cut short keeps the cases it finished
    return rows


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:+,.0f}"


def _money_ci(median: float | None, ci: Sequence[float] | None) -> str:
    """``median [low, high]`` in dollars, ``-`` for what is missing."""
    low, high = ci or (None, None)
    return f"{_money(median)} [{_money(low)}, {_money(high)}]"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table: one line per case."""
    header = ("case", "runs", "> 0", "> b&h", "> tsmom", "> ridge", "median net $ [95 % CI]",
              "IQM net $", "median Sharpe", "changes / 1,000 bars", "/ oracle", "s")  # fmt: skip
    lines = []
    for r in rows:
        net, sharpe, above = r["net_usd"], r["sharpe"], r["share_above"]
        ratio, changes = r.get("oracle_ratio"), r["changes_per_1000_bars"]
        lines.append((
            r["case"], r["runs"], f"{r['share_positive']:.0%}",
            f"{above.get('buy_and_hold', 0):.0%}", f"{above.get('momentum', 0):.0%}",
            f"{above.get('ridge', 0):.0%}",
            _money_ci(net and net["median"], net and net["median_ci"]),
            _money(net and net["iqm"]),
            "-" if sharpe is None else format(sharpe["median"], ".2f"),
            "-" if changes is None else format(changes, ".1f"),
            "-" if ratio is None else format(ratio, ".2f"),
            f"{r['wall_s']:.0f}",
        ))  # fmt: skip
    return markdown_table(header, lines)


def format_baselines(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table: per case and baseline, the agent's net minus the baseline's on the same
    seed-folds (median, 95 % CI)."""
    lines = []
    for r in rows:
        for name, diff in r.get("agent_minus_baseline_net_usd", {}).items():
            lines.append((r["case"], name, _money_ci(diff["median"], diff["median_ci"])))
    return markdown_table(("case", "baseline", "median agent - baseline net $ [95 % CI]"), lines)


def format_paired(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table of the ``versus`` comparisons: one line per case."""
    header = ("case", "versus", "pairs", "A >= B", "median A - B net $ [95 % CI]",
              "IQM A - B net $", "median B net $")  # fmt: skip
    lines = []
    for r in rows:
        if "versus" not in r:
            continue
        pair, b = r["versus"]["paired"], r["versus"]["score"]
        diff, b_net = pair["net_usd_a_minus_b"], b["net_usd"]
        share = pair["share_a_at_least_b"]
        lines.append((
            r["case"], " ".join(r["versus"]["overrides"]), pair["pairs"],
            "-" if share is None else format(share, ".0%"),
            _money_ci(diff["median"], diff["median_ci"]),
            _money(diff["iqm"]), _money(b_net and b_net["median"]),
        ))  # fmt: skip
    return markdown_table(header, lines)


def section(quick: bool, cfg: Config) -> dict[str, Any]:
    """``jdqn bench`` section: small on a CPU or with ``--quick``, full otherwise."""
    del cfg  # the scorecard judges the default profile
    small = quick or jax.default_backend() == "cpu"
    rows = run(small)
    return {"rows": rows, "table": format_table(rows), "small": small}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", help=f"comma-separated, of {list(CASES)}")
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--profile", default="default")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--versus",
        action="append",
        metavar="KEY=VALUE",
        help="also run each case with these overrides on the same seeds; report A - B paired",
    )
    parser.add_argument("--label", default="")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    from jdqn.config import profile

    def write(rows: list[dict[str, Any]]) -> None:
        for row in rows:
            row["label"], row["overrides"] = args.label, args.set
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1, default=float) + "\n")

    rows = run(
        args.small,
        profile(args.profile),
        cases=args.cases.split(",") if args.cases else None,
        seeds=args.seeds,
        overrides=args.set,
        versus=args.versus,
        echo=print,
        on_case=write,
    )
    print(f"\n{args.label} {args.set}\n{format_table(rows)}\n\n{format_baselines(rows)}")
    if args.versus:
        print(f"\nA: {args.set}, B: A and {args.versus}\n{format_paired(rows)}")
    return 0


if __name__ == "__main__":
    configure()  # jdqn's XLA flags, before JAX starts a backend
    raise SystemExit(main())
