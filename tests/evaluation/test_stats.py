"""jdqn.evaluation.stats against hand-computed cases and independent references (scipy, exact
enumeration
of the bootstrap, the deflated Sharpe paper's worked example)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from jdqn.data.calendars import CALENDARS
from jdqn.evaluation import stats


def test_iqm_is_scipys_quarter_trimmed_mean():
    assert stats.iqm(np.array([7.0, 1, 100, 3, 2, 5, 4, 6])) == pytest.approx(4.5)  # [3, 4, 5, 6]
    rng = np.random.default_rng(0)
    for n in range(1, 14):
        x = rng.standard_t(3, size=n)
        assert stats.iqm(x) == pytest.approx(scipy.stats.trim_mean(x, 0.25), rel=1e-12)
    batch = rng.normal(size=(5, 9))
    np.testing.assert_allclose(stats.iqm(batch), scipy.stats.trim_mean(batch, 0.25, axis=1))


def _exact_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values)
    cdf = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cdf, q - 1e-12)])


@pytest.mark.parametrize("name", ["median", "iqm"])
def test_bootstrap_interval_matches_exact_enumeration_of_the_stratified_resamples(name):
    """Strata of 3 and 4 values: all 3^3 x 4^4 equally likely resamples, enumerated."""
    strata = [np.array([0.0, 1.0, 5.0]), np.array([-2.0, 2.0, 3.0, 10.0])]
    statistic = {"median": stats.median, "iqm": stats.iqm}[name]
    exact = np.array(
        [
            statistic(np.array(a + b))
            for a in itertools.product(strata[0], repeat=3)
            for b in itertools.product(strata[1], repeat=4)
        ]
    )
    weights = np.full(exact.size, 1.0 / exact.size)
    boot = stats.bootstrap_distribution(strata, lambda x: statistic(x), reps=40_000, seed=3)
    assert boot.mean() == pytest.approx(exact.mean(), abs=4 * exact.std() / math.sqrt(40_000))
    low, high = stats.percentile_interval(boot)
    assert _exact_quantile(exact, weights, 0.015) <= low <= _exact_quantile(exact, weights, 0.035)
    assert _exact_quantile(exact, weights, 0.965) <= high <= _exact_quantile(exact, weights, 0.985)


def test_resamples_stay_inside_their_strata():
    """Three zeros and two ones: any resample within strata has median 0 (pooled ones not)."""
    result = stats.aggregate([np.zeros(3), np.ones(2)], reps=500, seed=0)
    assert result["median"] == 0.0 and result["median_ci"] == [0.0, 0.0]
    assert result["iqm"] == pytest.approx(1 / 3) and result["n"] == 5
    constant = stats.aggregate([np.full(4, 2.5)], reps=100, seed=0)
    assert constant["iqm_ci"] == [2.5, 2.5] and constant["median_ci"] == [2.5, 2.5]


def test_the_bootstrap_is_reproducible_from_its_seed():
    strata = [np.array([1.0, 4.0, 2.0, 0.5, 3.0]), np.array([8.0, -1.0, 2.2, 7.0])]
    assert stats.aggregate(strata, seed=7) == stats.aggregate(strata, seed=7)
    assert stats.aggregate(strata, seed=7)["iqm_ci"] != stats.aggregate(strata, seed=8)["iqm_ci"]
    empty = stats.aggregate([np.zeros(0)])
    assert empty["n"] == 0 and empty["median"] is None


def test_daily_sharpe_sums_each_trading_day_from_the_1700_open():
    stamps = np.array(
        ["2020-01-06T10:00", "2020-01-06T18:00", "2020-01-07T09:00", "2020-01-08T09:00"],
        "datetime64[ns]",
    )
    daily = np.array([1.0, 2.0 + 3.0, 4.0])  # the 18:00 bar belongs to Tuesday's session
    expected = daily.mean() / daily.std(ddof=1) * math.sqrt(252)
    got = stats.daily_sharpe(np.array([1.0, 2.0, 3.0, 4.0]), stamps)
    assert got == pytest.approx(expected, rel=1e-12)
    assert stats.daily_sharpe(np.ones(2), stamps[1:3]) is None  # both in Tuesday's session
    assert stats.daily_sharpe(np.array([1.0, 1.0, 0.0, 1.0]), stamps) == 0.0  # 1 $ every day


def test_daily_sharpe_starts_each_day_at_the_calendars_open():
    # Crypto's day opens at midnight: the 23:00 and 01:00 bars are two days there, one
    # session (Tuesday's, from Monday 17:00) on CME's Globex clock.
    stamps = np.array(
        ["2020-01-06T10:00", "2020-01-06T23:00", "2020-01-07T01:00", "2020-01-08T09:00"],
        "datetime64[ns]",
    )
    net = np.array([1.0, 2.0, 3.0, 4.0])
    crypto = np.array([1.0 + 2.0, 3.0, 4.0])
    expected = crypto.mean() / crypto.std(ddof=1) * math.sqrt(365)
    assert stats.daily_sharpe(net, stamps, 365, day_open=0) == pytest.approx(expected, rel=1e-12)
    cme = np.array([1.0, 2.0 + 3.0, 4.0])
    expected = cme.mean() / cme.std(ddof=1) * math.sqrt(252)
    assert stats.daily_sharpe(net, stamps) == pytest.approx(expected, rel=1e-12)
    # Several series at once (a run's agent and baselines): each row as on its own.
    rows = np.stack([net, net[::-1]])
    with_calendar = stats.with_daily_sharpe([{}, {"a": 1}], rows, stamps, CALENDARS["crypto_24x7"])
    assert with_calendar[0]["sharpe_daily"] == stats.daily_sharpe(net, stamps, 365, day_open=0)
    reverse = stats.daily_sharpe(net[::-1], stamps, 365, day_open=0)
    assert with_calendar[1] == {"a": 1, "sharpe_daily": reverse}
    assert stats.daily_sharpes(rows[:, :1], stamps[:1]) == [None, None]  # one trading day


def test_deflated_sharpe_reproduces_the_papers_worked_example():
    """Bailey & Lopez de Prado (2014), section 4: 100 trials whose annualised Sharpe ratios vary
    with variance 1/2, the best annualised 2.5 over 1,250 daily returns with skewness -3 and
    kurtosis 10: SR_0 = 0.1132 per day and DSR = 0.9004."""
    benchmark = stats.expected_max_sharpe(100, 0.5 / 250)
    assert benchmark == pytest.approx(0.1132, abs=1e-4)
    dsr = stats.probabilistic_sharpe(2.5 / math.sqrt(250), benchmark, 1250, -3.0, 10.0)
    assert dsr == pytest.approx(0.9004, abs=5e-4)
    assert stats.expected_max_sharpe(1, 0.5) == 0.0


def test_deflated_sharpe_of_trials_against_scipy():
    rng = np.random.default_rng(1)
    trials = [rng.standard_t(4, size=500) * 0.5 + mu for mu in (0.0, 0.05, 0.12, 0.02)]
    result = stats.deflated_sharpe(trials)
    sharpes = np.array([t.mean() / t.std(ddof=1) for t in trials])
    best = trials[2]
    assert result["best_trial"] == 2 == int(np.argmax(sharpes))
    v = sharpes.var(ddof=1)
    norm = scipy.stats.norm
    sr0 = math.sqrt(v) * (
        (1 - np.euler_gamma) * norm.ppf(1 - 1 / 4) + np.euler_gamma * norm.ppf(1 - 1 / (4 * math.e))
    )
    skew, kurt = scipy.stats.skew(best), scipy.stats.kurtosis(best, fisher=False)
    z = (
        (sharpes[2] - sr0)
        * math.sqrt(499)
        / math.sqrt(1 - skew * sharpes[2] + (kurt - 1) / 4 * sharpes[2] ** 2)
    )
    assert result["benchmark_sharpe_per_bar"] == pytest.approx(sr0, rel=1e-9)
    assert (result["skew"], result["kurtosis"]) == pytest.approx((skew, kurt), rel=1e-9)
    assert result["dsr"] == pytest.approx(norm.cdf(z), rel=1e-9)
    # One trial: nothing to deflate for, the probabilistic Sharpe ratio against 0.
    alone = stats.deflated_sharpe(trials[2:3])
    assert alone["benchmark_sharpe_per_bar"] == 0.0 and alone["dsr"] > result["dsr"]


def test_deflated_sharpe_counts_the_trials_it_is_told():
    """A sweep tried more trials than it hands in (settings x seeds): the benchmark is the
    expected maximum of that many, with the variance of the trials given."""
    rng = np.random.default_rng(2)
    trials = [rng.normal(mu, 1.0, size=400) for mu in (0.0, 0.1, 0.05)]
    sharpes = np.array([t.mean() / t.std(ddof=1) for t in trials])
    norm = scipy.stats.norm
    sr0 = math.sqrt(sharpes.var(ddof=1)) * (
        (1 - np.euler_gamma) * norm.ppf(1 - 1 / 30)
        + np.euler_gamma * norm.ppf(1 - 1 / (30 * math.e))
    )
    counted = stats.deflated_sharpe(trials, settings_tried=10)  # 10 settings x 3 seeds
    assert counted["n_trials"] == 30
    assert counted["benchmark_sharpe_per_bar"] == pytest.approx(sr0, rel=1e-9)
    assert counted["dsr"] < stats.deflated_sharpe(trials)["dsr"]


def _row(fold: int, seed: int, net: float | None, flat: float) -> dict:
    metrics = lambda x: {m: x for m in stats.SUMMARY_METRICS}
    return {
        "fold": fold,
        "seed": seed,
        "agent": None if net is None else metrics(net),
        "baselines": {"flat": metrics(flat)},
    }


def _series(fold: int, seed: int, net: np.ndarray | None) -> stats.RunSeries:
    stamps = np.datetime64("2020-01-06T09:00") + np.arange(4) * np.timedelta64(1, "m")
    stamps += np.timedelta64(fold * 4, "m")
    return stats.RunSeries(fold, seed, net, {"flat": np.zeros(4)}, stamps)


def test_summary_per_fold_and_overall_leaves_halted_runs_out():
    values = {(0, 0): 1.0, (0, 1): 3.0, (0, 2): None, (1, 0): -2.0, (1, 1): 6.0, (1, 2): 0.0}
    rows = [_row(f, s, v, flat=0.5 * f) for (f, s), v in values.items()]
    rng = np.random.default_rng(0)
    series = [
        _series(f, s, None if v is None else rng.normal(size=4) + 0.1 * s)
        for (f, s), v in values.items()
    ]
    summary = stats.summarise(rows, series, seed=11, reps=300)
    overall = summary["overall"]
    assert (overall["n_runs"], overall["n_halted"]) == (5, 1)
    net = overall["agent"]["net_pnl_usd"]
    assert net["median"] == 1.0 and net["iqm"] == pytest.approx(stats.iqm([1, 3, -2, 6, 0]))
    assert net == stats.aggregate(
        [np.array([1.0, 3.0]), np.array([-2.0, 6.0, 0.0])], reps=300, seed=11
    )
    minus = overall["agent_minus"]["flat"]["sharpe"]
    assert minus == stats.aggregate(
        [np.array([1.0, 3.0]), np.array([-2.5, 5.5, -0.5])], reps=300, seed=11
    )
    fold1 = summary["folds"]["1"]
    assert fold1["n_runs"] == 3 and fold1["agent"]["turnover"]["median"] == 0.0
    # Seed 2 halted in fold 0: the stitched series (and the deflated Sharpe) have seeds 0 and 1.
    assert overall["deflated_sharpe"]["n_trials"] == 2 and overall["deflated_sharpe"]["n_bars"] == 8
    assert fold1["deflated_sharpe"]["n_trials"] == 3
    assert summary["bootstrap_seed"] == 11 and summary["confidence"] == 0.95
    # A sweep of 4 settings: every seed counts 4 trials.
    swept = stats.summarise(rows, series, seed=11, reps=300, settings_tried=4)
    assert swept["overall"]["deflated_sharpe"]["n_trials"] == 8


def test_runs_without_a_daily_sharpe_ratio_are_left_out_of_its_estimates():
    rows = [_row(0, s, float(s), flat=0.0) for s in range(3)]
    rows[1]["agent"]["sharpe_daily"] = None  # a window of one trading day
    rows[2]["baselines"]["flat"]["sharpe_daily"] = None
    summary = stats.summarise(rows, [_series(0, s, np.ones(4)) for s in range(3)], seed=0, reps=20)
    assert summary["overall"]["agent"]["sharpe_daily"]["n"] == 2
    assert summary["overall"]["agent_minus"]["flat"]["sharpe_daily"]["n"] == 1
    assert summary["overall"]["agent"]["sharpe"]["n"] == 3


def test_a_summary_of_halted_runs_only_has_no_estimates():
    rows = [_row(f, 0, None, flat=0.0) for f in (0, 1)]
    summary = stats.summarise(rows, [_series(f, 0, None) for f in (0, 1)], seed=0, reps=10)
    assert summary["overall"]["n_halted"] == 2 and summary["overall"]["n_runs"] == 0
    assert summary["overall"]["agent"]["sharpe"]["median"] is None
    assert summary["folds"]["0"]["deflated_sharpe"]["dsr"] is None
    assert stats.stitch([_series(0, 0, None)], [0]).seeds == []
    from jdqn.run import report

    assert "net $" in report.summary_text(summary)


def test_stitch_puts_the_test_windows_end_to_end_with_the_seeds_band():
    series = [_series(f, s, np.full(4, float(s + f))) for f in (1, 0) for s in range(3)]
    stitched = stats.stitch(series, [0, 1])
    assert stitched.seeds == [0, 1, 2] and stitched.agent.shape == (3, 8)
    np.testing.assert_array_equal(stitched.agent[1], [1, 1, 1, 1, 2, 2, 2, 2])
    assert np.all(np.diff(stitched.realised_at.astype(np.int64)) > 0)
    band = stats.equity_band(stitched.agent)
    np.testing.assert_allclose(band["median"], np.cumsum(stitched.agent[1]))
    np.testing.assert_allclose(band["p10"], np.percentile(np.cumsum(stitched.agent, 1), 10, 0))


def test_the_deflated_sharpe_counts_settings_and_is_undefined_without_trades():
    rng = np.random.default_rng(3)
    trials = [rng.normal(0.05, 1.0, 400) for _ in range(3)]
    one = stats.deflated_sharpe(trials)
    ten = stats.deflated_sharpe(trials, settings_tried=10)
    assert (one["n_trials"], ten["n_trials"]) == (3, 30) and ten["dsr"] < one["dsr"]
    # One seed of 10 settings: the trials vary as a Sharpe estimate from 400 bars does.
    alone = stats.deflated_sharpe(trials[:1], settings_tried=10)
    assert alone["benchmark_sharpe_per_bar"] == pytest.approx(
        stats.expected_max_sharpe(10, 1 / 399), rel=1e-12
    )
    never_traded = stats.deflated_sharpe([np.zeros(400), np.zeros(400)])
    assert never_traded["dsr"] is None and never_traded["n_trials"] == 2


def test_intervals_from_fewer_than_five_seeds_are_flagged():
    four, five = [np.arange(4.0), np.arange(6.0)], [np.arange(5.0), np.arange(6.0)]
    assert stats.aggregate(four, reps=50)["few_seeds"] is True
    assert stats.aggregate(five, reps=50)["few_seeds"] is False
    assert stats.clustered_aggregate(four, reps=50)["few_seeds"] is True
    rows = [_row(0, s, float(s), flat=0.0) for s in range(4)]
    summary = stats.summarise(rows, [_series(0, s, np.ones(4)) for s in range(4)], seed=0, reps=9)
    assert summary["few_seeds"] and summary["overall"]["agent"]["net_pnl_usd"]["few_seeds"]
    from jdqn.run import report

    text = report.summary_text(summary)
    assert "* from fewer than 5 seeds" in text and "]*" in text
    assert "exposure (bars held)" in text and summary["overall"]["agent"]["exposure"]["n"] == 4


def test_the_clustered_interval_covers_the_spread_between_windows():
    """Seeds agree inside each window but windows differ: the stratified interval (seeds within
    fixed windows) is a point, the two-stage one spans the windows' medians."""
    windows = [np.full(6, value) for value in (-300.0, -100.0, 50.0, 200.0, 400.0)]
    fixed = stats.aggregate(windows, reps=500, seed=1)
    clustered = stats.clustered_aggregate(windows, reps=500, seed=1)
    assert fixed["median_ci"] == [50.0, 50.0] and clustered["median"] == 50.0
    low, high = clustered["median_ci"]
    assert -300.0 <= low <= -100.0 and 200.0 <= high <= 400.0
    assert clustered["clusters"] == 5 and clustered["n"] == 30


@pytest.mark.slow
def test_the_clustered_interval_of_single_runs_is_the_exact_bootstrap_one():
    """One run per window: the two-stage bootstrap is the plain bootstrap of the 9 values, whose
    median is at most the k-th smallest value with probability P(Binomial(9, k/9) >= 5) (an
    exact reference): 0.030 at k = 2 and 0.970 at k = 7, so the 95 % interval is [x_(2), x_(8)]."""
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0, 8.0, 7.0]
    cdf = [scipy.stats.binom.sf(4, 9, k / 9) for k in range(1, 10)]
    low = sorted(values)[int(np.argmax(np.array(cdf) >= 0.025))]
    high = sorted(values)[int(np.argmax(np.array(cdf) >= 0.975))]
    assert (low, high) == (1.5, 8.0)
    result = stats.clustered_aggregate([np.array([v]) for v in values], reps=10_000)
    assert result["median_ci"] == [low, high] and result["median"] == 4.0


def _one_bar_a_day(days: int) -> np.ndarray:
    return np.datetime64("2020-01-06T10:00", "ns") + np.arange(days) * np.timedelta64(1, "D")


@pytest.mark.parametrize("ahead", [None, 150, 800])
def test_window_interval_of_identical_seeds_is_the_normal_prediction_interval(ahead):
    """Seeds that traded alike leave only the days' noise: the interval in which the net of a
    window of A iid days falls, from D observed days of mean m and spread sd (ddof 0, the
    bootstrap's), is the normal prediction interval A m +- 1.96 sd sqrt(A + A^2 / D): the
    estimate's error and the window's own noise (A = D when not given)."""
    rng = np.random.default_rng(3)
    days = 400
    daily = rng.normal(0.2, 5.0, days)
    nets = np.tile(daily, (4, 1))
    low, high = stats.window_interval(nets, _one_bar_a_day(days), reps=20_000, seed=1, days=ahead)
    a = days if ahead is None else ahead
    half = scipy.stats.norm.ppf(0.975) * daily.std() * math.sqrt(a + a * a / days)
    assert low == pytest.approx(a * daily.mean() - half, abs=0.05 * half)
    assert high == pytest.approx(a * daily.mean() + half, abs=0.05 * half)


def test_window_interval_without_day_noise_is_the_seeds_bootstrap_of_their_median():
    """Each seed earns a constant a day: resampling days changes nothing, so the interval is the
    seeds-only bootstrap interval of the median of their totals (exact enumeration of the
    resamples of 3 seeds)."""
    per_day = np.array([1.0, 2.0, 7.0])
    days = 10
    nets = np.repeat(per_day[:, None], days, axis=1)
    low, high = stats.window_interval(nets, _one_bar_a_day(days), reps=50_000, seed=2)
    totals = per_day * days
    medians = [np.median(totals[list(c)]) for c in itertools.product(range(3), repeat=3)]
    assert (low, high) == stats.percentile_interval(np.array(medians))


def test_window_interval_sums_bars_into_their_trading_days():
    """Bars of one session are one unit of the resample: two bars of +1 and -1 in one CME
    session (the 18:00 bar opens the next day's) sum to a flat day, so the interval is a point."""
    stamps = np.array(
        ["2020-01-06T18:00", "2020-01-07T09:00", "2020-01-07T18:00", "2020-01-08T09:00"],
        "datetime64[ns]",
    )
    nets = np.array([[1.0, -1.0, 2.0, -2.0]] * 2)
    assert stats.window_interval(nets, stamps) == (0.0, 0.0)
    assert stats.daily_sums(nets[0], stamps).tolist() == [0.0, 0.0]
