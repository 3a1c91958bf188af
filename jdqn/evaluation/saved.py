"""``jdqn evaluate``: a run's saved policies over new bars, judged as a walk-forward test window
(docs/design.md §16). Sharpe ratios are annualised with the run's bars per year (a short file's
own count would be a poor estimate); a run's own test window, with the warm-up before it, gives
back the run's numbers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jdqn.data import load_bars
from jdqn.data.calendars import CALENDARS
from jdqn.evaluation import stats
from jdqn.evaluation.env import make_params
from jdqn.evaluation.policy import Policy, PolicyError, load_policy, saved_policies
from jdqn.evaluation.rollouts import equity_curve, evaluate_baselines, record_metrics
from jdqn.run import report, rundir


@dataclass(frozen=True)
class EvaluationOutcome:
    """Where :func:`evaluate_saved` wrote its outputs, and its results.json."""

    out_dir: Path
    results: dict[str, Any]


def evaluate_saved(
    run_dir: str | os.PathLike[str],
    data: str | os.PathLike[str],
    *,
    fold: int | None = None,
    out: str | os.PathLike[str] | None = None,
    name: str | None = None,
    plots: bool = True,
    log: Callable[[str], None] = print,
) -> EvaluationOutcome:
    """Judge each seed's saved policy of ``fold`` (None: the run's last) on the bars of ``data``
    after the feature warm-up, from flat, writing what a walk-forward run writes to
    ``<out>/<name>`` (default ``<run_dir>/evaluations/eval-<UTC time>``). Bad input (no such run
    or fold, a bar file that fails validation, bars of another instrument or features) raises
    ``ValueError`` with one line before anything is written."""
    saved = saved_policies(run_dir)
    folds = sorted({f for f, _ in saved})
    if fold is None and folds:
        fold = folds[-1]
    seeds = [s for f, s in saved if f == fold]
    # No policy of that fold: load_policy names what there is.
    policies = [load_policy(run_dir, fold, s) for s in seeds] or [load_policy(run_dir, fold)]
    first = policies[0]
    fold = first.fold
    bars = first.bars(load_bars(data))
    warmup = first.warmup_bars
    if len(bars) < warmup + 2:
        raise PolicyError(
            f"{data}: {len(bars)} bars, but the policies need {warmup} bars of feature warm-up "
            f"and then at least 2; fix: pass at least {warmup + 2} bars"
        )
    features = first.features(bars)[warmup:]
    close = bars.close[warmup:]
    timestamps = bars.timestamp[warmup:]
    realised_at = timestamps[1:]
    cfg = first.cfg
    dollars, show_random = cfg.env.point_value_usd, cfg.output.show_random  # plots and tables
    bars_per_year = float(first.meta["bars_per_year"])
    calendar = CALENDARS[cfg.data.calendar]  # its trading days, as the run judged them
    baselines = _baselines(first, features, close, bars_per_year)
    nets = {k: np.asarray(b["rollout"].net_points) for k, b in baselines.items()}
    baseline_curves = {k: equity_curve(net) for k, net in nets.items()}
    baseline_held = {k: np.asarray(b["rollout"].positions) for k, b in baselines.items()}
    baseline_metrics = {
        k: stats.with_daily_sharpe(b["metrics"], nets[k], realised_at, calendar)
        for k, b in baselines.items()
    }
    window = {"test": [warmup, len(bars)], "test_time": [str(timestamps[0]), str(timestamps[-1])]}

    with rundir.interrupts_deferred():
        parent = Path(run_dir) / "evaluations" if out is None else out
        run = rundir.new_run_dir(parent, name or datetime.now(UTC).strftime("eval-%Y%m%d-%H%M%S"))
    try:
        rows, series = [], []
        for policy in policies:
            record = policy.evaluate(features, close)
            net = np.asarray(record.net_points)
            agent = record_metrics(
                record, point_value_usd=cfg.env.point_value_usd, bars_per_year=bars_per_year
            )
            agent = stats.with_daily_sharpe(agent, net, realised_at, calendar)
            series.append(stats.RunSeries(fold, policy.seed, net, nets, realised_at))
            rows.append(
                {
                    "fold": fold,
                    "seed": policy.seed,
                    "status": "ok",
                    "window": window,
                    "agent": agent,
                    "baselines": baseline_metrics,
                }
            )
            # The seed's equity CSV and plot, as a walk-forward run writes them.
            stem = f"fold{fold}_seed{policy.seed}"
            curves = {"agent": equity_curve(net)} | baseline_curves
            held = {"agent": np.asarray(record.positions)} | baseline_held
            report.write_equity_csv(run.curves_dir / f"{stem}_equity.csv", timestamps, curves, held)
            if plots:
                title = f"fold {fold} seed {policy.seed}: saved policy on new bars"
                png = run.plots_dir / f"{stem}_equity.png"
                report.plot_equity(png, timestamps, curves, title, dollars, show_random)
        summary = stats.summarise(rows, series, seed=cfg.train.seed)
        report.write_stitched(
            run.path, series, plots, point_value_usd=dollars, show_random=show_random
        )
        if plots:
            report.plot_summary(run.plots_dir / "summary.png", rows, summary, show_random)
        results = {
            "run": str(Path(run_dir)),
            "source": str(data),
            "fold": fold,
            "config": json.loads(cfg.to_json()),
            "bars_per_year": bars_per_year,
            "folds": rows,
            "summary": summary,
            "jax_version": jax.__version__,
            "backend": jax.default_backend(),
        }
        rundir.write_json(run.results_path, results)
        final = rundir.finalize(run)
    except BaseException:
        with rundir.interrupts_deferred():
            rundir.discard(run)
        raise
    log(report.summary_table(rows, show_random))
    log(report.summary_text(summary, show_random))
    log(f"jdqn: results in {final / 'results.json'}")
    return EvaluationOutcome(out_dir=final, results=results)


def _baselines(
    policy: Policy, features: np.ndarray, close: np.ndarray, bars_per_year: float
) -> dict[str, Any]:
    """The window's baselines, the random one keyed as the run keyed this fold's."""
    from jdqn.run.walkforward import run_keys  # the run's key derivation, one place

    cfg = policy.cfg
    folds, seeds = np.asarray([policy.fold], np.int32), np.asarray([0], np.int32)
    key = run_keys(cfg.train.seed, folds, seeds).baselines[0]
    return evaluate_baselines(make_params(features, close, cfg.env), key, cfg.env, bars_per_year)
