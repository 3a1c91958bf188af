"""One run's test window judged: the agent's and the baselines' metrics, equity curves and held
positions, as a walk-forward run and ``jdqn evaluate`` both report them (one path, so a run's
own test window evaluated again gives back its numbers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from jdqn.data.calendars import TradingCalendar
from jdqn.evaluation import stats
from jdqn.evaluation.rollouts import Rollout, equity_curve, record_metrics


@dataclass(frozen=True)
class JudgedRun:
    """One (fold, seed) on its test window."""

    agent: dict[str, Any] | None  # the agent's metrics; None when its run halted
    baselines: dict[str, dict[str, Any]]  # name -> the baseline's metrics
    series: stats.RunSeries  # per-bar net PnL, for the summary across runs
    curves: dict[str, np.ndarray]  # name -> [T] float, cumulative net points from 0
    held: dict[str, np.ndarray]  # name -> [T-1] float, positions held (contracts)


def judge_run(
    fold: int,
    seed: int,
    record: Rollout,
    baselines: dict[str, dict[str, Any]],
    timestamps: np.ndarray,
    *,
    halted: bool,
    point_value_usd: float,
    bars_per_year: float,
    calendar: TradingCalendar,
) -> JudgedRun:
    """The agent's trimmed numpy ``record`` over the window of ``timestamps`` [T] and the
    window's ``baselines`` (name -> {"rollout", "metrics"}), with daily Sharpe ratios on the
    run's ``calendar``. Interval t's PnL lands at bar t+1."""
    net = np.asarray(record.net_points)
    realised_at = timestamps[1 : len(net) + 1]
    nets = {name: np.asarray(b["rollout"].net_points) for name, b in baselines.items()}
    judged = [b["metrics"] for b in baselines.values()]
    if not halted:
        judged.append(
            record_metrics(record, point_value_usd=point_value_usd, bars_per_year=bars_per_year)
        )
    # One pass over the trading days for all of them (the equity CSV holds them side by side).
    rows = np.reshape([*nets.values(), *([] if halted else [net])], (len(judged), len(net)))
    judged = stats.with_daily_sharpe(judged, rows, realised_at, calendar)
    return JudgedRun(
        agent=None if halted else judged[-1],
        baselines=dict(zip(nets, judged[: len(nets)], strict=True)),
        series=stats.RunSeries(fold, seed, None if halted else net, nets, realised_at),
        curves={"agent": equity_curve(net)} | {k: equity_curve(v) for k, v in nets.items()},
        held={"agent": np.asarray(record.positions)}
        | {name: np.asarray(b["rollout"].positions) for name, b in baselines.items()},
    )
