"""The learning scorecard: does the agent reach the best rule tuned on the same train window,
and sit out where there is nothing to take?

``jdqn bench --only learning`` runs the walk-forward at a profile (``default``) over S seeds x the
profile's folds x the evaluation paths on each case below and reports, per case: the best tuned
baseline (of momentum, MACD and ridge, ``jdqn.evaluation.baselines``, the highest median test net
over the case's seed-folds) and the agent minus it, paired per seed-fold; the median and IQM
(Agarwal et al., 2021) of net $ and the daily Sharpe; the shares of seed-folds above 0, above the
best baseline and within $2,500 of flat per 12,000 bars; the median exposure (share of bars in a
position) and position changes per 1,000 bars; on synthetic data the informed rule and the causal
bound. A halted run counts as a failure in every share. Intervals are two-stage bootstrap 95 %
intervals over the test windows (path x fold) and the seeds inside them; one from fewer than
``stats.MIN_SEEDS_FOR_CI`` seeds is flagged ``*``.

Data: the synthetic paths ``EVALUATION_PATHS`` (``data.synthetic_seed`` 100-104) are evaluation
data, scored here and never used to choose a setting; every other path and the ES sample are
development data (a sweep runs with ``--paths development``). Each case's result is stored as it
finishes (``--store``), so a run cut short resumes at the next case. On a CPU, or with
``--quick``, it runs :data:`SMALL`: the smoketest agent, 2 seeds, shorter windows, one path.

``python -m jdqn.bench.learning --cases planted_0.3,martingale --seeds 4 --set train.epochs=8``
runs chosen cases with overrides (what a sweep over learner settings uses); ``--versus
loss.alpha_schedule=[0]`` also runs each case with more overrides on the same seeds and reports
the paired difference (e.g. whether the C51 blend beats MSE only). ``--choose
train.act_risk=1,0.75`` judges what ``jdqn sweep`` with that grid chooses instead: each fold's
setting by ``--rule`` on its train window's validation tail, as the baselines are tuned on it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from jdqn import bench
from jdqn.accel.xla_flags import configure
from jdqn.bench import markdown_table
from jdqn.config import DEFAULT, SMOKETEST, Config, apply_overrides
from jdqn.evaluation import stats
from jdqn.run import rundir
from jdqn.run.sweep import RULES, SweepPlan, grid_settings, run_sweep
from jdqn.run.walkforward import run_walkforward

# The data split, fixed before any agent setting is chosen on the scorecard.
EVALUATION_PATHS = (100, 101, 102, 103, 104)  # synthetic_seed: judged here, never tuned on
DEVELOPMENT_PATHS = (0, 1, 2, 3, 4)  # for sweeps; every path not in EVALUATION_PATHS is fair
TUNED_BASELINES = ("momentum", "macd", "ridge")  # grids frozen in jdqn.evaluation.baselines
FLAT_BAND_USD, FLAT_BAND_BARS = 2_500.0, 12_000  # "within $2,500 of flat per 12,000 bars"
SITTING_OUT_EXPOSURE = 0.10  # the martingale goal: median exposure at most this
SITTING_OUT_WITHIN_BAND = 0.95  # and at least this share of seed-folds within the flat band

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
        f"env.commission_usd={2.5 * multiple}",
    )


CASES: dict[str, tuple[str, ...]] = {
    "martingale": ("data.signal_strength=0.0",),
    "planted_0.2": ("data.signal_strength=0.2",),  # momentum over 15 bars, on the baseline's grid
    "planted_0.3": ("data.signal_strength=0.3",),
    "momentum45_0.3": ("data.signal_strength=0.3", "data.signal_lookback=45"),  # off the grid
    "reversion_0.3": ("data.signal_strength=0.3", "data.signal_kind=reversion"),
    "rth_momentum_0.3": ("data.signal_strength=0.3", "data.signal_kind=rth_momentum"),
    "cost_0x": _costs(0.0),
    "cost_0.5x": _costs(0.5),
    "cost_2x": _costs(2.0),
    "cost_4x": _costs(4.0),
    "es_sample": (f"data.path={ES_SAMPLE}", *ES_FOLDS),  # development data: one real file
}


class Scale(NamedTuple):
    """How big a scorecard run is."""

    cfg: Config  # the profile judged
    cases: tuple[str, ...]
    seeds: int
    paths: tuple[int, ...]
    overrides: tuple[str, ...] = ()  # e.g. shorter windows
    choose: tuple[str, ...] = ()  # a sweep's grid (key=v1,v2): each fold's setting chosen
    rule: str = "median"  # ... by this rule of jdqn.run.sweep, on the validation tail


FULL = Scale(DEFAULT, tuple(CASES), 8, EVALUATION_PATHS)
# The CPU variant (a test runs it): the smoketest agent on shorter windows, one evaluation path.
SMALL = Scale(
    SMOKETEST,
    ("martingale", "planted_0.3"),
    2,
    EVALUATION_PATHS[:1],
    ("walkforward.train_bars=20000", "walkforward.test_bars=6000", "data.synthetic_bars=39380"),
)


def _is_synthetic(overrides: Sequence[str]) -> bool:
    return not any(o.startswith("data.path=") for o in overrides)


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


def _share(passed: Sequence[bool] | np.ndarray, runs: int) -> float | None:
    """Share of ``runs`` that passed (halted runs are in ``runs``, not in ``passed``)."""
    return float(np.sum(passed)) / runs if runs else None


def _clusters(ok: Sequence[dict[str, Any]], values: Sequence[float | None]) -> list[np.ndarray]:
    """``values`` (one per run of ``ok``) grouped by test window (path, fold); None left out."""
    windows: dict[tuple[Any, int], list[float]] = {}
    for row, value in zip(ok, values, strict=True):
        if value is not None:
            windows.setdefault((row.get("path"), row["fold"]), []).append(value)
    return [np.asarray(v, np.float64) for _, v in sorted(windows.items(), key=str)]


COVERS = (
    "two-stage bootstrap: test windows (path x fold) with replacement, then seeds within each; "
    "covers seed noise and the spread between the windows scored"
)


def sitting_out(agent: Sequence[dict[str, Any]], runs: int) -> dict[str, float | None]:
    """What tells sitting out from holding one direction, over ``agent`` (each run's metrics:
    ``net_pnl_usd``, ``exposure``, ``n_trades``, ``n_bars``) of ``runs`` (halted runs count in
    ``runs`` only, so they fail every share)."""
    net = np.array([a["net_pnl_usd"] for a in agent], np.float64)
    band = np.array([FLAT_BAND_USD * a["n_bars"] / FLAT_BAND_BARS for a in agent], np.float64)
    return {
        "share_within_flat_band": _share(np.abs(net) <= band, runs),
        "exposure": _median([a["exposure"] for a in agent]),
        "share_sitting_out": _share([a["exposure"] <= SITTING_OUT_EXPOSURE for a in agent], runs),
        "changes_per_1000_bars": _median([1_000 * a["n_trades"] / a["n_bars"] for a in agent]),
    }


def by_path(rows: Sequence[dict[str, Any]], best: str | None) -> list[dict[str, Any]]:
    """Each synthetic path's own figures (a case pools its paths; one path can carry it): its
    seed-folds, the medians of the agent's net, of ``best``'s and of the agent minus ``best`` on
    the same seed-folds, the share above it and the sitting-out shares. Halted runs count as
    in :func:`score`. No rows for a bar file (path None)."""
    paths = sorted({row["path"] for row in rows if row.get("path") is not None})
    result = []
    for path in paths:
        mine = [row for row in rows if row.get("path") == path]
        ok = [row for row in mine if row["agent"] is not None]
        net = np.array([row["agent"]["net_pnl_usd"] for row in ok], np.float64)
        base = np.array([row["baselines"][best]["net_pnl_usd"] for row in ok]) if best else None
        result.append({
            "path": path, "runs": len(mine), "halted": len(mine) - len(ok),
            "net_usd": _median(list(net)),
            "best_net_usd": _median([row["baselines"][best]["net_pnl_usd"] for row in mine])
            if best else None,
            "agent_minus_best_net_usd": None if base is None else _median(list(net - base)),
            "share_above_best": None if base is None else _share(net > base, len(mine)),
            **sitting_out([row["agent"] for row in ok], len(mine)),
        })  # fmt: skip
    return result


def score(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The scorecard of one case from its walk-forward result rows (``results["folds"]``, each
    with its synthetic ``path`` or none). Halted runs fail every share; estimates use the rest."""
    ok = [row for row in rows if row["agent"] is not None]
    runs = len(rows)
    agent = [row["agent"] for row in ok]
    net = np.array([a["net_pnl_usd"] for a in agent], np.float64)
    names = list(rows[0]["baselines"]) if rows else []
    baseline_net = {n: np.array([r["baselines"][n]["net_pnl_usd"] for r in ok]) for n in names}
    # Over every seed-fold of the case: a baseline does not halt when the agent does.
    baseline_median = {
        n: float(np.median([r["baselines"][n]["net_pnl_usd"] for r in rows])) for n in names
    }
    tuned = [n for n in TUNED_BASELINES if n in names]
    best = max(tuned, key=baseline_median.__getitem__) if tuned else None
    daily = [a["sharpe_daily"] for a in agent]
    minus = {n: stats.clustered_aggregate(_clusters(ok, net - v)) for n, v in baseline_net.items()}
    result: dict[str, Any] = {
        "runs": runs,
        "halted": runs - len(ok),
        "best_baseline": best,
        "baseline_median_net_usd": baseline_median,
        "agent_minus_best_net_usd": minus.get(best) if best else None,
        "interval_covers": COVERS,
        "share_positive": _share(net > 0, runs),
        "share_above": {n: _share(net > v, runs) for n, v in baseline_net.items()},
        **sitting_out(agent, runs),
        "net_usd": stats.clustered_aggregate(_clusters(ok, list(net))),
        "sharpe_daily": stats.clustered_aggregate(_clusters(ok, daily)),
        "sharpe_per_bar_annualised": _median([a["sharpe"] for a in agent]),
        "agent_minus_baseline_net_usd": minus,
        "net_usd_by_run": [float(x) for x in net],
        "run_ids": [[row.get("path"), int(row["fold"]), int(row["seed"])] for row in ok],
        "by_path": by_path(rows, best),
        "halted_runs": [  # why each halted run stopped: the guard's reason
            [row.get("path"), int(row["fold"]), int(row["seed"]), row.get("status")]
            for row in rows
            if row["agent"] is None
        ],
    }
    if "informed" in names:
        bound = _median([r["baselines"]["informed"].get("causal_bound_usd") for r in ok])
        result["causal_bound_usd"] = bound
        result["share_of_bound"] = float(np.median(net)) / bound if bound and bound > 0 else None
    return result


def paired(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """A against B on the runs both scored (same path, fold and seed: the same data, the same
    initial keys): the share where A nets at least B, and the median and IQM of A - B net $
    with two-stage bootstrap 95 % intervals over the windows and seeds."""
    b_net = dict(zip(map(tuple, b["run_ids"]), b["net_usd_by_run"], strict=True))
    pairs = [
        ({"path": run[0], "fold": run[1]}, net - b_net[tuple(run)])
        for run, net in zip(a["run_ids"], a["net_usd_by_run"], strict=True)
        if tuple(run) in b_net
    ]
    diff = [d for _, d in pairs]
    return {
        "pairs": len(pairs),
        "share_a_at_least_b": float(np.mean(np.array(diff) >= 0)) if pairs else None,
        "net_usd_a_minus_b": stats.clustered_aggregate(_clusters([w for w, _ in pairs], diff)),
    }


def run_case(
    cfg: Config, overrides: Sequence[str], choose: Sequence[str] = (), rule: str = "median"
) -> list[dict[str, Any]]:
    """One walk-forward of ``cfg`` with ``overrides`` in a scratch directory; its fold rows. With
    ``choose`` (a grid), a sweep instead: its chosen settings' rows, each with its ``setting``."""
    outputs = ["output.plots=false", "output.tensorboard=false", "output.checkpoints=false"]
    with tempfile.TemporaryDirectory() as scratch:
        case_cfg = apply_overrides(cfg, [f"output.out_dir={scratch}", *outputs, *overrides])
        if choose:
            plan = SweepPlan(grid_settings(case_cfg, choose), rule=rule)
            outcome = run_sweep(case_cfg, plan, progress=False, log=lambda _: None)
        else:
            outcome = run_walkforward(case_cfg, progress=False, log=lambda _: None)
        return outcome.results["folds"]


def run_paths(
    cfg: Config,
    overrides: Sequence[str],
    paths: Sequence[int],
    choose: Sequence[str] = (),
    rule: str = "median",
) -> list[dict[str, Any]]:
    """The fold rows of ``cfg`` with ``overrides`` (and ``choose``: :func:`run_case`) on each
    synthetic path (``path`` added to each row), or once on a bar file (``path`` None)."""
    if not _is_synthetic(overrides):
        return [row | {"path": None} for row in run_case(cfg, overrides, choose, rule)]
    rows = []
    for path in paths:
        case_rows = run_case(cfg, [*overrides, f"data.synthetic_seed={path}"], choose, rule)
        rows += [row | {"path": path} for row in case_rows]
    return rows


def chosen_settings(rows: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """``[path, fold, setting]`` for each test window of a chosen case's rows (one per window:
    a fold's seeds share their setting)."""
    windows = {(row.get("path"), int(row["fold"])): int(row["setting"]) for row in rows}
    return [[path, fold, setting] for (path, fold), setting in sorted(windows.items(), key=str)]


def _store_key(cfg: Config, case: str, overrides: Sequence[str], scale: Scale) -> dict[str, Any]:
    """What a stored case result was computed from: reused only when all of it matches."""
    config = hashlib.sha256(cfg.to_json().encode()).hexdigest()[:16]
    key = {"case": case, "config": config, "overrides": list(overrides), "seeds": scale.seeds,
           "paths": list(scale.paths)}  # fmt: skip
    return key | ({"choose": list(scale.choose), "rule": scale.rule} if scale.choose else {})


def _stored(store: Path | None, key: dict[str, Any]) -> dict[str, Any] | None:
    path = store and store / f"{key['case']}.json"
    if path is None or not path.is_file():
        return None
    saved = json.loads(path.read_text())
    return saved["row"] if saved.get("key") == key else None


def run(
    scale: Scale,
    *,
    overrides: Sequence[str] = (),
    versus: Sequence[str] | None = None,
    store: Path | None = None,
    echo: Callable[[str], None] = lambda _: None,
    on_case: Callable[[list[dict[str, Any]]], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """Score ``scale``'s cases with ``overrides``; one row each, each stored in ``store`` as it
    finishes and reused from there when computed from the same config, overrides, seeds and
    paths. Given ``versus`` (more overrides), each case also runs with them on the same seeds,
    and its row gains that run's score and the :func:`paired` comparison (A: without, B: with)."""
    unknown = [c for c in scale.cases if c not in CASES]
    if unknown:
        raise ValueError(f"learning scorecard: unknown case {unknown[0]!r}; valid: {list(CASES)}")
    rows = []
    for case in scale.cases:
        case_overrides = [f"train.seeds={scale.seeds}", *scale.overrides, *overrides, *CASES[case]]
        key = _store_key(scale.cfg, case, [*case_overrides, *(versus or ())], scale)
        row = _stored(store, key)
        if row is None:
            start = time.perf_counter()
            judged = _is_synthetic(case_overrides) and set(scale.paths) <= set(EVALUATION_PATHS)
            data = "evaluation" if judged else "development"
            fold_rows = run_paths(scale.cfg, case_overrides, scale.paths, scale.choose, scale.rule)
            row = {"case": case, "data": data, "seeds": scale.seeds, "paths": list(scale.paths)}
            row |= {"wall_s": time.perf_counter() - start} | score(fold_rows)
            if scale.choose:  # what each test window's sweep chose (path, fold, setting)
                chosen = chosen_settings(fold_rows)
                settings = [dict(s) for s in grid_settings(scale.cfg, scale.choose)]
                row["choice"] = {"settings": settings, "rule": scale.rule, "chosen": chosen}
            if versus is not None:
                versus_overrides = [*case_overrides, *versus]
                b = score(
                    run_paths(scale.cfg, versus_overrides, scale.paths, scale.choose, scale.rule)
                )
                row["versus"] = {"overrides": list(versus), "score": b, "paired": paired(row, b)}
            if store is not None:  # whole or not at all
                text = json.dumps({"key": key, "row": row}, indent=1, default=float) + "\n"
                rundir.write_atomic(store / f"{case}.json", text.encode())
        rows.append(row)
        echo(format_table(rows[-1:]) + (f"\n{format_paired(rows[-1:])}" if versus else ""))
        on_case(rows)  # a sweep cut short keeps the cases it finished
    return rows


def yardstick(scale: Scale, overrides: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Each case's tuned baselines, informed rule and causal bound on its paths' test windows,
    without training: the bar the agent has to reach (host numpy; seconds a case on a CPU)."""
    from jdqn.evaluation.baselines import fold_baselines
    from jdqn.run.walkforward import load_data

    rows = []
    for case in scale.cases:
        nets: dict[str, list[float]] = {}
        case_overrides = [*scale.overrides, *overrides, *CASES[case]]
        paths = scale.paths if _is_synthetic(case_overrides) else (None,)
        for path in paths:
            seed = [] if path is None else [f"data.synthetic_seed={path}"]
            cfg = apply_overrides(scale.cfg, [*case_overrides, *seed])
            data = load_data(cfg)
            for fold in range(len(data.folds)):
                for name, result in fold_baselines(cfg, data, fold).items():
                    nets.setdefault(name, []).append(result["metrics"]["net_pnl_usd"])
                    if name == "informed":
                        bound = result["metrics"]["causal_bound_usd"]
                        nets.setdefault("causal bound", []).append(bound)
        medians = {name: float(np.median(v)) for name, v in nets.items()}
        best = max(TUNED_BASELINES, key=medians.__getitem__)
        windows = len(nets["momentum"])
        rows.append(
            {"case": case, "windows": windows, "best_baseline": best, "median_net_usd": medians}
        )
    return rows


def format_yardstick(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table: per case, each baseline's median test net over its windows."""
    names = ("momentum", "macd", "ridge", "informed", "causal bound")
    header = ("case", "windows", "best tuned", *(f"{n} $" for n in names))
    lines = [
        (r["case"], r["windows"], r["best_baseline"],
         *(_money(r["median_net_usd"].get(n)) for n in names))
        for r in rows
    ]  # fmt: skip
    return markdown_table(header, lines)


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:+,.0f}"


def _flagged(entry: dict[str, Any] | None) -> str:
    """``median [low, high]`` in dollars, ``*`` when from fewer than 5 seeds, n/a if undefined."""
    if not entry or entry.get("median") is None:
        return "n/a"
    low, high = entry["median_ci"] or (None, None)
    flag = "*" if entry["few_seeds"] else ""
    return f"{_money(entry['median'])} [{_money(low)}, {_money(high)}]{flag}"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table: one line per case (intervals: :data:`COVERS`)."""
    header = ("case", "data", "runs (halted)", "best baseline: median $",
              "agent median $ [95 % CI]", "agent - best $ [95 % CI]", "> best", "> 0",
              "within $2,500 per 12,000 bars of flat", "exposure",
              "changes / 1,000 bars", "Sharpe (daily, ann.)", "/ causal bound", "s")  # fmt: skip
    lines = []
    for r in rows:
        best, daily = r["best_baseline"], r["sharpe_daily"]
        lines.append((
            r["case"], r["data"], f"{r['runs']} ({r['halted']})",
            "n/a" if best is None else f"{best}: {_money(r['baseline_median_net_usd'][best])}",
            _flagged(r["net_usd"]), _flagged(r["agent_minus_best_net_usd"]),
            _percent(r["share_above"].get(best)), _percent(r["share_positive"]),
            _percent(r["share_within_flat_band"]), _percent(r["exposure"]),
            "n/a" if r["changes_per_1000_bars"] is None else f"{r['changes_per_1000_bars']:.1f}",
            "n/a" if daily["median"] is None else f"{daily['median']:.2f}",
            "n/a" if r.get("share_of_bound") is None else f"{r['share_of_bound']:.2f}",
            f"{r['wall_s']:.0f}",
        ))  # fmt: skip
    return markdown_table(header, lines)


def format_baselines(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table: per case and baseline, its median net and the agent's minus it on the
    same seed-folds (median, 95 % CI)."""
    lines = []
    for r in rows:
        for name, diff in r.get("agent_minus_baseline_net_usd", {}).items():
            best = " (best)" if name == r["best_baseline"] else ""
            median = _money(r["baseline_median_net_usd"][name])
            lines.append((r["case"], name + best, median, _flagged(diff)))
    header = ("case", "baseline", "baseline median $", "median agent - baseline $ [95 % CI]")
    return markdown_table(header, lines)


def format_paths(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table: per case, each synthetic path's medians (:func:`by_path`); rows scored
    before by_path existed have none."""
    header = ("case", "path", "runs (halted)", "agent median $", "best median $",
              "agent - best median $", "> best", "within the band", "exposure")  # fmt: skip
    lines = [
        (r["case"], p["path"], f"{p['runs']} ({p['halted']})", _money(p["net_usd"]),
         _money(p["best_net_usd"]), _money(p["agent_minus_best_net_usd"]),
         _percent(p["share_above_best"]), _percent(p["share_within_flat_band"]),
         _percent(p["exposure"]))
        for r in rows
        for p in r.get("by_path", [])
    ]  # fmt: skip
    return markdown_table(header, lines)


def format_choices(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table of a ``--choose`` run: per case and setting of the grid, the test windows
    it was chosen for."""
    lines = []
    for r in rows:
        if "choice" not in r:
            continue
        counts: dict[int, int] = {}
        for _, _, setting in r["choice"]["chosen"]:
            counts[setting] = counts.get(setting, 0) + 1
        settings = r["choice"]["settings"]
        for k, setting in enumerate(settings):
            name = " ".join(f"{key}={value}" for key, value in setting.items())
            lines.append((r["case"], name, counts.get(k, 0)))
    return markdown_table(("case", "setting", "test windows chosen"), lines)


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
            _flagged(diff), _money(diff["iqm"]), _money(b_net and b_net["median"]),
        ))  # fmt: skip
    return markdown_table(header, lines)


def section(quick: bool, cfg: Config) -> dict[str, Any]:
    """``jdqn bench`` section: :data:`SMALL` on a CPU or with ``--quick``, :data:`FULL`
    otherwise; each case stored under ``cfg.output.out_dir``/learning_scorecard as it finishes,
    so the command run again resumes at the first case not done."""
    small = quick or jax.default_backend() == "cpu"
    rows = run(SMALL if small else FULL, store=Path(cfg.output.out_dir) / "learning_scorecard")
    return {"rows": rows, "table": format_table(rows), "small": small}


def _paths(text: str) -> tuple[int, ...]:
    """``evaluation``, ``development`` or comma-separated synthetic seeds."""
    named = {"evaluation": EVALUATION_PATHS, "development": DEVELOPMENT_PATHS}
    if text in named:
        return named[text]
    return tuple(int(seed) for seed in text.split(","))


def _case_command(args: argparse.Namespace, case: str) -> list[str]:
    """This command for one case, to run in its own process: the same scale, overrides and
    store, no ``--json`` (the parent writes it) and no ``--jobs``."""
    command = [sys.executable, "-m", "jdqn.bench.learning", "--cases", case, "--store", args.store]
    command += ["--profile", args.profile, "--label", args.label]
    command += ["--small"] * args.small
    command += [] if args.seeds is None else ["--seeds", str(args.seeds)]
    command += [] if args.paths is None else ["--paths", args.paths]
    command += [f"--set={o}" for o in args.set]
    command += [f"--choose={o}" for o in args.choose] + ["--rule", args.rule]
    return command + [f"--versus={o}" for o in args.versus or ()]


def run_jobs(args: argparse.Namespace, cases: Sequence[str]) -> tuple[str, int] | None:
    """Each case in its own process, up to ``args.jobs`` at once, sharing ``args.store`` (each
    finished case is stored whole, so the caller's :func:`run` then reads them all from it);
    each one's output in ``<store>/<case>.log``. The first failed case and its exit status, or
    None (:func:`jdqn.bench.run_processes`)."""
    store = Path(args.store)
    store.mkdir(parents=True, exist_ok=True)
    return bench.run_processes({c: _case_command(args, c) for c in cases}, args.jobs, store)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", help=f"comma-separated, of {list(CASES)}")
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--profile", default="default")
    parser.add_argument("--small", action="store_true", help="the CPU variant (SMALL)")
    parser.add_argument("--paths", help="evaluation (default), development or seeds a,b,c")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--versus",
        action="append",
        metavar="KEY=VALUE",
        help="also run each case with these overrides on the same seeds; report A - B paired",
    )
    parser.add_argument(
        "--choose",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="judge jdqn sweep's choice over this grid (repeatable) instead of one setting",
    )
    parser.add_argument("--rule", default="median", help="the sweep's rule: median or lcb")
    parser.add_argument("--label", default="")
    parser.add_argument("--json")
    parser.add_argument("--store", help="directory of finished cases: reused, so a rerun resumes")
    parser.add_argument(
        "--jobs", type=int, default=1,
        help="cases run at once, each its own process sharing --store (e.g. 4 on one GPU)",
    )  # fmt: skip
    parser.add_argument(
        "--yardstick", action="store_true", help="only the baselines and bounds, no training"
    )
    args = parser.parse_args(argv)
    from jdqn.config import profile

    try:
        base = SMALL if args.small else FULL._replace(cfg=profile(args.profile))
        scale = base._replace(
            cases=tuple(args.cases.split(",")) if args.cases else base.cases,
            seeds=args.seeds or base.seeds,
            paths=_paths(args.paths) if args.paths else base.paths,
            choose=tuple(args.choose),
            rule=args.rule,
        )
        for case in scale.cases:  # every override is checked before the first run
            case_cfg = apply_overrides(
                scale.cfg, [*scale.overrides, *args.set, *CASES.get(case, ())]
            )
            if scale.choose:
                grid_settings(case_cfg, scale.choose)
        if scale.rule not in RULES:
            raise ValueError(f"--rule {scale.rule!r}: one of {list(RULES)}")
    except ValueError as error:
        print(f"learning scorecard: {error}; fix: see --help", file=sys.stderr)
        return 2
    if args.json and (problem := bench.json_problem(args.json)):
        print(f"learning scorecard: {problem}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"learning scorecard: --jobs {args.jobs}; fix: 1 or more", file=sys.stderr)
        return 2
    if args.jobs > 1 and not args.store:
        print("learning scorecard: --jobs needs --store DIR, where the cases' processes meet; "
              "fix: add --store runs/scorecard", file=sys.stderr)  # fmt: skip
        return 2

    if args.yardstick:
        print(format_yardstick(yardstick(scale, args.set)))
        return 0
    if args.versus and set(scale.paths) & set(EVALUATION_PATHS):
        print(
            "learning scorecard: comparing settings on evaluation paths; choose settings on "
            "--paths development and judge only the chosen one here",
            file=sys.stderr,
        )

    def write(rows: list[dict[str, Any]]) -> None:
        for row in rows:
            row["label"], row["overrides"] = args.label, args.set
        if args.json:
            bench.write_json(args.json, rows)

    if args.jobs > 1:
        failed = run_jobs(args, scale.cases)
        if failed is not None:
            case, status = failed
            log = Path(args.store) / f"{case}.log"
            problem = f"case {case} stopped (exit {status}); its output is in {log}"
            print(f"learning scorecard: {problem}; fix: see there, then rerun", file=sys.stderr)
            return status
    try:
        rows = run(
            scale,
            overrides=args.set,
            versus=args.versus,
            store=Path(args.store) if args.store else None,
            echo=print,
            on_case=write,
        )
    except ValueError as error:  # an unknown case
        print(f"learning scorecard: {error}", file=sys.stderr)
        return 2
    print(f"\n{args.label} {args.set}\n{format_table(rows)}\n\n{format_baselines(rows)}")
    if any(r.get("by_path") for r in rows):
        print(f"\nEach path, medians over its seed-folds:\n{format_paths(rows)}")
    print(f"\nIntervals: {COVERS}; * from fewer than {stats.MIN_SEEDS_FOR_CI} seeds per window.")
    if args.versus:
        print(f"\nA: {args.set}, B: A and {args.versus}\n{format_paired(rows)}")
    if scale.choose:
        print(f"\nChosen on each fold's validation tail ({scale.rule}):\n{format_choices(rows)}")
    return 0


if __name__ == "__main__":
    configure()  # jdqn's XLA flags, before JAX starts a backend
    raise SystemExit(main())
