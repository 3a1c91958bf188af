"""The learning scorecard's statistics against hand-computed cases (no training)."""

import numpy as np
import pytest

from jdqn.bench import learning


def test_iqm_drops_a_quarter_each_side():
    assert learning.iqm(np.array([100.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -50.0])) == 3.5
    assert learning.iqm(np.array([1.0, 2.0, 3.0])) == 2.0  # n // 4 = 0: the mean


def test_bootstrap_interval_brackets_the_statistic_and_shrinks_with_more_runs():
    rng = np.random.default_rng(0)
    small, large = rng.normal(0, 1, 12), rng.normal(0, 1, 400)
    low, high = learning.bootstrap_ci(small, np.median)
    assert low <= np.median(small) <= high
    low2, high2 = learning.bootstrap_ci(large, np.median)
    assert high2 - low2 < (high - low) / 2
    assert learning.bootstrap_ci(np.full(8, 3.0), learning.iqm) == (3.0, 3.0)


def _row(agent, trades, **baselines):
    return {
        "agent": None
        if agent is None
        else {"net_pnl_usd": agent, "sharpe": agent / 1000, "n_trades": trades, "n_bars": 2000},
        "baselines": {name: {"net_pnl_usd": value} for name, value in baselines.items()},
    }


def test_score_counts_shares_changes_and_the_oracle_ratio():
    rows = [
        _row(1000.0, 2, buy_and_hold=500.0, oracle=4000.0),
        _row(-200.0, 4, buy_and_hold=-300.0, oracle=2000.0),
        _row(3000.0, 10, buy_and_hold=3500.0, oracle=3000.0),
        _row(None, 0, buy_and_hold=0.0, oracle=1.0),  # a halted run counts as halted
    ]
    card = learning.score(rows)
    assert (card["runs"], card["halted"]) == (4, 1)
    assert card["share_positive"] == pytest.approx(2 / 3)
    assert card["share_above"]["buy_and_hold"] == pytest.approx(2 / 3)
    assert card["net_usd"]["median"] == 1000.0
    assert card["changes_per_1000_bars"] == 2.0  # median of 1, 2, 5 per 1,000 bars
    assert card["oracle_ratio"] == pytest.approx(1000.0 / 3000.0)
    assert "planted_0.3" in learning.format_table([{"case": "planted_0.3", "wall_s": 1.0, **card}])


def test_unknown_case_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="valid"):
        learning.run(True, cases=["nope"])
