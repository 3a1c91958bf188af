"""Statistics across seeds, float64 numpy on the host (docs/design.md §16).

A handful of seeds per fold is a small sample of a noisy quantity, so a run is summarised as
Agarwal et al. (NeurIPS 2021, "Deep reinforcement learning at the edge of the statistical
precipice") recommend: the median and interquartile mean (IQM) over runs, each with a 95 %
percentile interval from a stratified bootstrap (seeds resampled within each fold: the interval
covers seed noise only, the test windows are fixed) or, across many windows, a two-stage one
(windows, then seeds within them). An interval from fewer than ``MIN_SEEDS_FOR_CI`` seeds per
stratum is flagged ``few_seeds``. The best seed's Sharpe ratio is deflated for every setting and
seed tried (Bailey & Lopez de Prado, 2014, "The deflated Sharpe ratio"). The folds' test windows
are stitched into one curve per seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from statistics import NormalDist
from typing import Any, NamedTuple

import numpy as np

# Metrics summarised across seeds (keys of ``jdqn.evaluation.rollouts.metrics``, plus
# ``sharpe_daily``).
SUMMARY_METRICS = (
    "net_pnl_usd", "sharpe", "sharpe_daily", "max_drawdown_usd", "turnover", "exposure"
)  # fmt: skip
BOOTSTRAP_REPS = 2_000
CONFIDENCE = 0.95
EULER_GAMMA = 0.5772156649015329
MIN_SEEDS_FOR_CI = 5  # fewer seeds per stratum: the interval is flagged as unreliable


class RunSeries(NamedTuple):
    """One (fold, seed)'s per-bar net PnL over its test window (host numpy)."""

    fold: int
    seed: int
    agent: np.ndarray | None  # [n] float, net points per bar interval; None when halted
    baselines: Mapping[str, np.ndarray]  # name -> [n] float, net points per bar interval
    realised_at: np.ndarray  # [n] datetime64, bar t+1 of interval t (where the PnL lands)


def iqm(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean: the mean of the values left after cutting ``floor(n / 4)`` from each
    end (``scipy.stats.trim_mean(values, 0.25)``; Agarwal et al., 2021)."""
    ordered = np.sort(np.asarray(values, np.float64), axis=axis)
    n = ordered.shape[axis]
    cut = int(0.25 * n)
    return np.mean(np.take(ordered, np.arange(cut, n - cut), axis=axis), axis=axis)


def median(values: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(np.asarray(values, np.float64), axis=axis)


def bootstrap_distribution(
    strata: Sequence[np.ndarray],
    statistic: Callable[[np.ndarray], np.ndarray],
    *,
    reps: int = BOOTSTRAP_REPS,
    seed: int = 0,
) -> np.ndarray:
    """``statistic`` of ``reps`` stratified resamples, [reps] float64: each replicate draws
    ``len(s)`` values with replacement from every stratum ``s`` (in order, from
    ``numpy.random.default_rng(seed)``) and applies ``statistic`` along the last axis of their
    concatenation."""
    rng = np.random.default_rng(seed)
    draws = [
        np.asarray(s, np.float64)[rng.integers(0, len(s), size=(reps, len(s)))] for s in strata
    ]
    return np.asarray(statistic(np.concatenate(draws, axis=-1)), np.float64)


def percentile_interval(
    distribution: np.ndarray, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The central ``confidence`` percentile interval of a bootstrap distribution."""
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(distribution, [tail, 100.0 - tail])
    return float(low), float(high)


_NO_VALUES = {"n": 0, "median": None, "median_ci": None, "iqm": None, "iqm_ci": None}


def _estimates(
    groups: list[np.ndarray], medians: np.ndarray, iqms: np.ndarray, **extra: Any
) -> dict[str, Any]:
    """Median and IQM over all values of ``groups``, each with the 95 % percentile interval of
    its bootstrap replicates; ``few_seeds`` where a group is smaller than ``MIN_SEEDS_FOR_CI``."""
    values = np.concatenate(groups)
    return {
        "n": int(values.size),
        **extra,
        "few_seeds": min(map(len, groups)) < MIN_SEEDS_FOR_CI,
        "median": float(median(values)),
        "median_ci": list(percentile_interval(medians)),
        "iqm": float(iqm(values)),
        "iqm_ci": list(percentile_interval(iqms)),
    }


def aggregate(
    strata: Sequence[np.ndarray], *, reps: int = BOOTSTRAP_REPS, seed: int = 0
) -> dict[str, Any]:
    """Median and IQM over all values of ``strata``, each with its stratified bootstrap 95 %
    interval (both from the same resamples)."""
    strata = [np.asarray(s, np.float64) for s in strata if len(s)]
    if not strata:
        return dict(_NO_VALUES)
    resampled = bootstrap_distribution(strata, lambda x: x, reps=reps, seed=seed)  # [reps, n]
    return _estimates(strata, median(resampled), iqm(resampled))


def clustered_aggregate(
    clusters: Sequence[np.ndarray], *, reps: int = BOOTSTRAP_REPS, seed: int = 0
) -> dict[str, Any]:
    """:func:`aggregate` with two-stage bootstrap intervals: each replicate draws as many
    clusters (e.g. the seeds of each test window) as there are, with replacement, then each drawn
    cluster's values with replacement (Davison & Hinkley, 1997, §3.8), so the interval covers
    the spread between windows as well as between seeds."""
    clusters = [np.asarray(c, np.float64) for c in clusters if len(c)]
    if not clusters:
        return dict(_NO_VALUES)
    rng = np.random.default_rng(seed)
    medians, iqms = np.empty(reps), np.empty(reps)
    for rep in range(reps):
        drawn = [clusters[i] for i in rng.integers(0, len(clusters), len(clusters))]
        sample = np.concatenate([c[rng.integers(0, len(c), len(c))] for c in drawn])
        medians[rep], iqms[rep] = median(sample), iqm(sample)
    return _estimates(clusters, medians, iqms, clusters=len(clusters))


def per_bar_sharpe(net: np.ndarray) -> float:
    """mean / sample std (ddof = 1) of per-bar net PnL, not annualised; 0 for a constant series
    or fewer than two bars."""
    net = np.asarray(net, np.float64)
    std = float(net.std(ddof=1)) if net.size >= 2 else 0.0
    return float(net.mean()) / std if std > 0 else 0.0


def daily_sums(net: np.ndarray, realised_at: np.ndarray, day_open: int = 17 * 60) -> np.ndarray:
    """Per-bar PnL summed per trading day, [..., days] over the days with a bar (a bar from
    ``day_open``, minutes after local midnight, belongs to the next day's session: 17:00 CT for
    CME's Globex, midnight for crypto); ``net`` [..., n] shares ``realised_at`` [n]."""
    shift = np.timedelta64((24 * 60 - day_open) % (24 * 60), "m")  # the day open -> midnight
    sessions = (np.asarray(realised_at, "datetime64[ns]") + shift).astype("datetime64[D]")
    _, day = np.unique(sessions, return_inverse=True)
    net = np.asarray(net, np.float64)
    days = int(day.max()) + 1 if day.size else 0
    rows = [np.bincount(day, weights=row, minlength=days) for row in net.reshape(-1, day.size)]
    return np.reshape(rows, (*net.shape[:-1], days))


def daily_sharpe(
    net: np.ndarray, realised_at: np.ndarray, days_per_year: float = 252.0, day_open: int = 17 * 60
) -> float | None:
    """Sharpe ratio of the daily net PnL (:func:`daily_sums`), annualised by
    sqrt(days_per_year); 0 without spread, None for fewer than two trading days."""
    return daily_sharpes(np.asarray(net)[None], realised_at, days_per_year, day_open)[0]


def daily_sharpes(
    nets: np.ndarray, realised_at: np.ndarray, days_per_year: float = 252.0, day_open: int = 17 * 60
) -> list[float | None]:
    """:func:`daily_sharpe` of each row of ``nets`` [k, n], the trading days found once."""
    daily = daily_sums(nets, realised_at, day_open)  # [k, days]
    if daily.shape[-1] < 2:
        return [None] * len(daily)
    return [per_bar_sharpe(row) * math.sqrt(days_per_year) for row in daily]


def window_interval(
    nets: np.ndarray,
    realised_at: np.ndarray,
    *,
    day_open: int = 17 * 60,
    reps: int = BOOTSTRAP_REPS,
    seed: int = 0,
    confidence: float = CONFIDENCE,
    days: int | None = None,
) -> tuple[float, float]:
    """The percentile interval in which another window's net, median over seeds, should fall
    given the seeds' per-bar nets [seeds, n] on this window: a prediction interval. Each replicate
    draws this window's trading days with replacement, as many as it holds, for the estimate of
    each seed's mean day (its error); then ``days`` trading days more (default: the window's own
    count) for the other window's own price noise, around that seed's observed mean day; the same
    days for every seed, as the seeds traded the same bars; then the seeds with replacement. So it
    covers the estimate's error, the price noise of a window of ``days`` trading days and the
    seeds' spread: for iid days of spread s, about ``days x mean +- 1.96 s sqrt(days + days^2 /
    D)`` from D days. ``days`` longer than the window: a validation tail's estimate of a longer
    test window."""
    daily = daily_sums(nets, realised_at, day_open)  # [seeds, D]
    held = daily.shape[1]
    ahead = held if days is None else days
    rng = np.random.default_rng(seed)
    estimate = rng.integers(0, held, size=(reps, held))
    noise = rng.integers(0, held, size=(reps, ahead))
    seeds = rng.integers(0, daily.shape[0], size=(reps, daily.shape[0]))
    mean = daily.mean(axis=1, keepdims=True)  # [seeds, 1]
    totals = ahead * daily[:, estimate].mean(axis=-1) + daily[:, noise].sum(axis=-1) - ahead * mean
    return percentile_interval(median(np.take_along_axis(totals.T, seeds, axis=1)), confidence)


def expected_max_sharpe(n_trials: int, variance: float) -> float:
    """E[max of n_trials Sharpe ratios] under the null of no skill, the deflated Sharpe's
    benchmark SR_0 = sqrt(V) ((1 - g) Z^-1(1 - 1/N) + g Z^-1(1 - 1/(N e))), g Euler's constant
    (Bailey & Lopez de Prado, 2014, eq. 5 of "The deflated Sharpe ratio"); 0 for one trial."""
    if n_trials < 2 or variance <= 0:
        return 0.0
    z = NormalDist().inv_cdf
    return math.sqrt(variance) * (
        (1.0 - EULER_GAMMA) * z(1.0 - 1.0 / n_trials)
        + EULER_GAMMA * z(1.0 - 1.0 / (n_trials * math.e))
    )


def probabilistic_sharpe(
    sharpe: float, benchmark: float, n_obs: int, skew: float, kurtosis: float
) -> float | None:
    """P(true SR > benchmark) given an estimate from ``n_obs`` returns of this skewness and
    (non-excess) kurtosis (Bailey & Lopez de Prado, 2012, the probabilistic Sharpe ratio);
    None where the estimate's variance term is not positive or there are too few returns."""
    spread = 1.0 - skew * sharpe + (kurtosis - 1.0) / 4.0 * sharpe**2
    if n_obs < 2 or spread <= 0:
        return None
    return NormalDist().cdf((sharpe - benchmark) * math.sqrt(n_obs - 1) / math.sqrt(spread))


def deflated_sharpe(
    returns_by_trial: Sequence[np.ndarray], settings_tried: int = 1
) -> dict[str, Any]:
    """The deflated Sharpe ratio of the trial with the best per-bar Sharpe (Bailey & Lopez de
    Prado, 2014): the probabilistic Sharpe ratio of the best against ``expected_max_sharpe`` of
    all trials tried, ``settings_tried`` x the trials given (each setting's seeds). The trials'
    Sharpe ratios vary as the given ones do, or with one trial as an estimate from its bars does
    under the null (1 / (bars - 1)). Per-bar returns; skewness and kurtosis are the best trial's
    population moments. None (n/a) where the best trial's returns are constant (it never
    traded, or never paid or earned): its Sharpe ratio is undefined."""
    sharpes = [per_bar_sharpe(r) for r in returns_by_trial]
    if not sharpes:
        return {"dsr": None, "n_trials": 0}
    best = int(np.argmax(sharpes))
    returns = np.asarray(returns_by_trial[best], np.float64)
    n_trials = settings_tried * len(sharpes)
    if len(sharpes) > 1:
        variance = float(np.var(sharpes, ddof=1))
    else:
        variance = 1.0 / (returns.size - 1) if returns.size > 1 else 0.0
    benchmark = expected_max_sharpe(n_trials, variance)
    centred = returns - returns.mean()
    m2 = float(np.mean(centred**2))
    skew = float(np.mean(centred**3)) / m2**1.5 if m2 > 0 else 0.0
    kurtosis = float(np.mean(centred**4)) / m2**2 if m2 > 0 else 3.0
    defined = m2 > 0 and returns.size > 1
    return {
        "dsr": probabilistic_sharpe(sharpes[best], benchmark, returns.size, skew, kurtosis)
        if defined
        else None,
        "best_trial": best,
        "n_trials": n_trials,
        "settings_tried": settings_tried,
        "sharpe_per_bar": sharpes[best],
        "benchmark_sharpe_per_bar": benchmark,
        "n_bars": int(returns.size),
        "skew": skew,
        "kurtosis": kurtosis,
    }


def with_daily_sharpe(
    metrics: Sequence[Mapping[str, Any]], nets: np.ndarray, realised_at: np.ndarray, calendar: Any
) -> list[dict[str, Any]]:
    """Each of ``metrics`` with ``sharpe_daily`` (:func:`daily_sharpe`) of its row of ``nets``
    [k, n] added, by the trading days of ``calendar`` (a
    ``jdqn.data.calendars.TradingCalendar``)."""
    days = daily_sharpes(nets, realised_at, calendar.trading_days_per_year, calendar.day_open)
    return [{**m, "sharpe_daily": d} for m, d in zip(metrics, days, strict=True)]


def summarise(
    rows: Sequence[Mapping[str, Any]],
    series: Sequence[RunSeries],
    *,
    seed: int,
    reps: int = BOOTSTRAP_REPS,
    settings_tried: int = 1,
) -> dict[str, Any]:
    """results.json's ``summary``: per fold and over all folds, each metric's median and IQM
    across seeds with stratified bootstrap 95 % intervals (strata = folds; ``few_seeds`` where a
    fold has fewer than ``MIN_SEEDS_FOR_CI``), the agent minus each baseline (per run, its fold's
    baseline), and the best seed's deflated Sharpe ratio over ``settings_tried`` x the seeds.
    Runs the guard halted are left out (counted in ``n_halted``). The bootstrap draws from
    ``seed``."""
    folds = sorted({int(row["fold"]) for row in rows})
    ok = [row for row in rows if row.get("agent") is not None]
    baselines = sorted(rows[0]["baselines"]) if rows else []

    def block(fold_ids: list[int]) -> dict[str, Any]:
        scoped = [r for r in ok if r["fold"] in fold_ids]

        def across_seeds(metric: str, baseline: str | None = None) -> dict[str, Any]:
            """Strata = folds: each run's metric (minus its fold's ``baseline``'s when given);
            runs where either is None (a daily Sharpe ratio of one day) are left out."""
            strata = []
            for fold in fold_ids:
                runs = [r for r in scoped if r["fold"] == fold]
                others = [
                    0.0 if baseline is None else r["baselines"][baseline][metric] for r in runs
                ]
                pairs = zip((r["agent"][metric] for r in runs), others, strict=True)
                kept = [a - b for a, b in pairs if a is not None and b is not None]
                strata.append(np.array(kept, np.float64))
            return aggregate(strata, reps=reps, seed=seed)

        stitched = stitch(series, fold_ids)
        dsr: dict[str, Any] = {"dsr": None}
        if stitched.seeds:
            dsr = deflated_sharpe(list(stitched.agent), settings_tried)
            dsr["best_seed"] = stitched.seeds[dsr.pop("best_trial")]
        return {
            "n_runs": len(scoped),
            "n_halted": sum(1 for r in rows if r["fold"] in fold_ids) - len(scoped),
            "agent": {m: across_seeds(m) for m in SUMMARY_METRICS},
            "agent_minus": {n: {m: across_seeds(m, n) for m in SUMMARY_METRICS} for n in baselines},
            "deflated_sharpe": dsr,
        }

    return {
        "method": (
            "median and interquartile mean across seeds with stratified bootstrap percentile "
            "intervals (strata = folds; Agarwal et al., 2021): they cover seed noise only, not "
            "the price noise of the fixed test windows; deflated Sharpe ratio of the best "
            "seed's per-bar net PnL over settings tried x seeds (Bailey & Lopez de Prado, 2014)"
        ),
        "confidence": CONFIDENCE,
        "min_seeds_for_ci": MIN_SEEDS_FOR_CI,
        "few_seeds": len({int(r["seed"]) for r in ok}) < MIN_SEEDS_FOR_CI,
        "settings_tried": settings_tried,
        "bootstrap_reps": reps,
        "bootstrap_seed": seed,
        "metrics": list(SUMMARY_METRICS),
        "overall": block(folds),
        "folds": {str(f): block([f]) for f in folds},
    }


class Stitched(NamedTuple):
    """The test windows of some folds, in order, as one out-of-sample series per seed."""

    seeds: list[int]  # seeds with every fold trained to its end
    realised_at: np.ndarray  # [n] datetime64
    agent: np.ndarray  # [S, n] float64 net points per bar interval
    baselines: dict[str, np.ndarray]  # name -> [n] (each fold's baseline, the same for its seeds)


def stitch(series: Sequence[RunSeries], fold_ids: Sequence[int]) -> Stitched:
    """Concatenate the folds' test windows (they tile the series without overlap) per seed."""
    by_run = {(s.fold, s.seed): s for s in series}
    seeds = sorted(
        seed
        for seed in {s.seed for s in series}
        if all(getattr(by_run.get((f, seed)), "agent", None) is not None for f in fold_ids)
    )
    if not seeds or not fold_ids:
        return Stitched([], np.zeros(0, "datetime64[ns]"), np.zeros((0, 0)), {})
    first = [by_run[(f, seeds[0])] for f in fold_ids]  # the realised times and baselines

    def join(arrays: Iterable[Any], dtype: Any = np.float64) -> np.ndarray:
        return np.concatenate([np.asarray(a, dtype) for a in arrays])

    return Stitched(
        seeds=seeds,
        realised_at=join((r.realised_at for r in first), "datetime64[ns]"),
        agent=np.stack([join(by_run[(f, s)].agent for f in fold_ids) for s in seeds]),
        baselines={name: join(r.baselines[name] for r in first) for name in first[0].baselines},
    )


def equity_band(agent: np.ndarray) -> dict[str, np.ndarray]:
    """Per bar across seeds of the cumulative equity [S, n]: its 10th, 50th and 90th percentile."""
    equity = np.cumsum(agent, axis=-1)
    low, mid, high = np.percentile(equity, [10.0, 50.0, 90.0], axis=0)
    return {"p10": low, "median": mid, "p90": high}
