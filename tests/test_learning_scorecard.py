"""The learning scorecard's statistics against hand-computed cases (no training)."""

import pytest

from jdqn.bench import learning


def _row(agent, trades, fold=0, seed=0, **baselines):
    return {
        "fold": fold,
        "seed": seed,
        "agent": None
        if agent is None
        else {"net_pnl_usd": agent, "sharpe": agent / 1000, "n_trades": trades, "n_bars": 2000},
        "baselines": {name: {"net_pnl_usd": value} for name, value in baselines.items()},
    }


def test_score_counts_shares_changes_and_the_oracle_ratio():
    rows = [
        _row(1000.0, 2, 0, 0, buy_and_hold=500.0, oracle=4000.0),
        _row(-200.0, 4, 0, 1, buy_and_hold=-300.0, oracle=2000.0),
        _row(3000.0, 10, 1, 0, buy_and_hold=3500.0, oracle=3000.0),
        _row(None, 0, 1, 1, buy_and_hold=0.0, oracle=1.0),  # a halted run counts as halted
    ]
    card = learning.score(rows)
    assert (card["runs"], card["halted"]) == (4, 1)
    assert card["share_positive"] == pytest.approx(2 / 3)
    assert card["share_above"]["buy_and_hold"] == pytest.approx(2 / 3)
    assert card["net_usd"]["median"] == 1000.0
    assert card["net_usd"]["median_ci"][0] <= 1000.0 <= card["net_usd"]["median_ci"][1]
    assert card["fold_seed_by_run"] == [[0, 0], [0, 1], [1, 0]]
    # agent - buy & hold: +500, +100, -500; the median of the three
    assert card["agent_minus_baseline_net_usd"]["buy_and_hold"]["median"] == 100.0
    assert "| planted_0.3 | oracle |" in learning.format_baselines(
        [{"case": "planted_0.3", **card}]
    )
    assert card["changes_per_1000_bars"] == 2.0  # median of 1, 2, 5 per 1,000 bars
    assert card["oracle_ratio"] == pytest.approx(1000.0 / 3000.0)
    assert "planted_0.3" in learning.format_table([{"case": "planted_0.3", "wall_s": 1.0, **card}])


def test_unknown_case_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="valid"):
        learning.run(True, cases=["nope"])


def test_paired_compares_the_same_fold_and_seed_only():
    """A - B on the seed-folds both have: (0,0) +500, (0,1) -100, (1,0) +0; (1,1) only in B."""
    a = learning.score([_row(1500.0, 1, 0, 0), _row(-300.0, 1, 0, 1), _row(50.0, 1, 1, 0)])
    b = learning.score(
        [_row(1000.0, 1, 0, 0), _row(-200.0, 1, 0, 1), _row(50.0, 1, 1, 0), _row(9.0, 1, 1, 1)]
    )
    versus = learning.paired(a, b)
    assert versus["pairs"] == 3
    assert versus["share_a_at_least_b"] == pytest.approx(2 / 3)
    assert versus["net_usd_a_minus_b"]["median"] == 0.0
    low, high = versus["net_usd_a_minus_b"]["median_ci"]
    assert -100.0 <= low <= 0.0 <= high <= 500.0
