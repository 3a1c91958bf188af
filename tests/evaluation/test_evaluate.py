"""Evaluation: rollouts vs the float64 reference, baselines with known answers, metric formulas."""

import json
import math
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference_backtest import backtest

from jdqn.config import EnvConfig
from jdqn.evaluation import env
from jdqn.evaluation import rollouts as ev

N_BARS = 40
BARS_PER_YEAR = 100.0


_rollout = jax.jit(ev.rollout, static_argnums=0)


def _evaluate(policy, params, key, point_value_usd=50.0):
    """(metrics, trimmed record) of ``policy`` over ``params``' window."""
    record = ev.trim(_rollout(policy, params, key), params)
    result = ev.record_metrics(record, point_value_usd=point_value_usd, bars_per_year=BARS_PER_YEAR)
    return result, record


def _fold(seed, cfg=None, start=0, end=None, n_bars=N_BARS):
    rng = np.random.default_rng(seed)
    close = (4_000 + 0.25 * np.cumsum(rng.integers(-8, 9, n_bars))).astype(np.float32)
    features = rng.normal(size=(n_bars, 3)).astype(np.float32)
    return env.make_params(features, close, cfg or EnvConfig(), start, end)


# --- metrics: hand-computed ------------------------------------------------------------------

# cost 0.5 per contract; price changes [1, 2, -1, 1, 3, -2, 1, 1, -1]
HAND_POSITIONS = np.array([1, 1, -1, -1, 0, 0, 1, 2, 2], np.float64)
HAND_GROSS = np.array([1, 2, 1, -1, 0, 0, 1, 2, -2], np.float64)
HAND_COST = np.array([0.5, 0, 1.0, 0, 0.5, 0, 0.5, 0.5, 0], np.float64)
HAND_NET = HAND_GROSS - HAND_COST  # [0.5, 2, 0, -1, -0.5, 0, 0.5, 1.5, -2]


def _sharpe(x, bars_per_year):
    return statistics.mean(x) / statistics.stdev(x) * math.sqrt(bars_per_year)


def _sortino(x, bars_per_year):
    downside = math.sqrt(sum(min(v, 0.0) ** 2 for v in x) / len(x))
    return statistics.mean(x) / downside * math.sqrt(bars_per_year)


def _max_drawdown(x):
    equity = peak = worst = 0.0
    for v in x:
        equity += v
        peak = max(peak, equity)
        worst = max(worst, peak - equity)
    return worst


def test_metrics_hand_computed():
    m = ev.metrics(
        HAND_NET,
        HAND_POSITIONS,
        point_value_usd=50.0,
        bars_per_year=BARS_PER_YEAR,
        cost_points=HAND_COST,
    )
    x = HAND_NET.tolist()
    assert m["n_bars"] == 9
    assert m["net_pnl_points"] == pytest.approx(1.0)
    assert m["net_pnl_usd"] == pytest.approx(50.0)
    assert m["gross_pnl_points"] == pytest.approx(4.0) and m["cost_points"] == pytest.approx(3.0)
    assert m["gross_pnl_usd"] == pytest.approx(200.0) and m["cost_usd"] == pytest.approx(150.0)
    assert m["sharpe"] == pytest.approx(_sharpe(x, BARS_PER_YEAR))
    assert m["sortino"] == pytest.approx(_sortino(x, BARS_PER_YEAR))
    # equity 0, .5, 2.5, 2.5, 1.5, 1, 1, 1.5, 3, 1: worst fall 3 -> 1
    assert m["max_drawdown_points"] == pytest.approx(2.0) == _max_drawdown(x)
    assert m["max_drawdown_usd"] == pytest.approx(100.0)
    assert m["calmar"] == pytest.approx((1.0 / 9) * BARS_PER_YEAR / 2.0)
    # long trade (bars 0-1): 0.5 entry, +3 gross, 0.5 exit (half the flip's cost) -> +2
    # short trade (bars 2-3): 0.5 entry (other half), 0 gross, 0.5 exit -> -1; last trade is open
    assert m["n_round_trips"] == 2 and m["hit_rate"] == pytest.approx(0.5)
    assert ev._closed_trade_pnls(HAND_NET, HAND_POSITIONS, HAND_COST) == pytest.approx([2.0, -1.0])
    assert m["n_trades"] == 5  # entry, flip, exit, entry, resize
    assert m["turnover"] == pytest.approx(6.0)
    assert m["exposure"] == pytest.approx(7 / 9)
    same = ev.metrics(
        HAND_NET, HAND_POSITIONS, point_value_usd=50.0, bars_per_year=100.0, gross_points=HAND_GROSS
    )
    assert same == pytest.approx(m)


def test_flip_needs_costs_but_flat_exits_do_not():
    with pytest.raises(ValueError, match="cost_points"):
        ev.metrics(HAND_NET, HAND_POSITIONS, point_value_usd=50.0, bars_per_year=1.0)
    # without flips, a bar that goes flat carries only the exit cost, so net alone is exact
    positions = np.array([1, 1, 0, -2, -2, 0, 0], np.float64)
    gross = np.array([1, -3, 0, 2, 0.5, 0, 0], np.float64)
    cost = 0.25 * np.abs(np.diff(positions, prepend=0.0))
    with_cost = ev.metrics(
        gross - cost, positions, point_value_usd=1.0, bars_per_year=1.0, cost_points=cost
    )
    net_only = ev.metrics(gross - cost, positions, point_value_usd=1.0, bars_per_year=1.0)
    assert with_cost["hit_rate"] == net_only["hit_rate"] == 0.5  # -2.5 then +1.5
    assert net_only["gross_pnl_points"] is None and net_only["cost_usd"] is None


def test_degenerate_series_are_json_safe():
    kw = {"point_value_usd": 50.0, "bars_per_year": BARS_PER_YEAR}
    flat = ev.metrics(np.zeros(5), np.zeros(5), **kw)
    assert flat["sharpe"] == flat["sortino"] == flat["calmar"] == 0.0
    assert flat["max_drawdown_points"] == 0.0 and flat["hit_rate"] is None
    assert flat["n_trades"] == 0 and flat["turnover"] == 0.0 and flat["exposure"] == 0.0
    # never a losing bar: no downside and no drawdown -> unbounded ratios are None
    winning = ev.metrics(np.array([0.5, 1.0, 0.25]), np.ones(3), **kw)
    assert winning["sortino"] is None and winning["calmar"] is None and winning["sharpe"] > 0
    constant = ev.metrics(np.full(4, 0.5), np.ones(4), **kw)
    assert constant["sharpe"] == 0.0  # std 0
    empty = ev.metrics(np.zeros(0), np.zeros(0), **kw)
    one = ev.metrics(np.array([-1.0]), np.ones(1), **kw)
    assert one["sharpe"] == 0.0 and one["max_drawdown_points"] == 1.0
    for result in (flat, winning, constant, empty, one):
        json.dumps(result, allow_nan=False)
    with pytest.raises(ValueError, match="finite"):
        ev.metrics(np.array([1.0, np.nan]), np.ones(2), **kw)
    with pytest.raises(ValueError, match="1-D"):
        ev.metrics(np.zeros(3), np.zeros(4), **kw)


@given(
    st.lists(st.sampled_from([-2.0, -1.0, 0.0, 1.0, 2.0]), min_size=1, max_size=60),
    st.integers(0, 2**31 - 1),
    st.floats(0.0, 2.0),
)
def test_metric_invariants(positions, seed, cost_per_contract):
    positions = np.array(positions + [0.0])  # ends flat: every trade is closed
    rng = np.random.default_rng(seed)
    gross = positions * 0.25 * rng.integers(-12, 13, positions.size)
    cost = cost_per_contract * np.abs(np.diff(positions, prepend=0.0))
    net = gross - cost
    m = ev.metrics(net, positions, point_value_usd=50.0, bars_per_year=1e5, cost_points=cost)
    json.dumps(m, allow_nan=False)
    trades = ev._closed_trade_pnls(net, positions, cost)
    # closed trades partition the PnL: flat bars carry nothing once exit costs are attributed
    assert sum(trades) == pytest.approx(net.sum(), abs=1e-9)
    assert m["max_drawdown_points"] >= 0.0 and 0.0 <= m["exposure"] <= 1.0
    assert m["max_drawdown_points"] == pytest.approx(_max_drawdown(net.tolist()))
    assert m["n_trades"] <= positions.size and m["turnover"] >= m["n_trades"] - 1e-12
    assert m["hit_rate"] is None or 0.0 <= m["hit_rate"] <= 1.0
    signs = np.sign(positions)
    runs = sum(1 for i, s in enumerate(signs) if s != 0 and (i == 0 or signs[i - 1] != s))
    assert m["n_round_trips"] == runs


# --- rollouts and baselines ------------------------------------------------------------------


def test_flat_baseline_is_all_zeros():
    params = _fold(0)
    result, record = _evaluate(ev.flat_policy(EnvConfig().positions), params, jax.random.key(0))
    for array in record[:4]:
        np.testing.assert_array_equal(array, 0.0)
    zero_keys = ("net_pnl_points", "sharpe", "sortino", "calmar", "max_drawdown_points")
    assert all(result[k] == 0.0 for k in zero_keys)
    assert result["n_trades"] == 0 and result["turnover"] == 0.0 and result["exposure"] == 0.0
    assert result["hit_rate"] is None and result["n_bars"] == N_BARS - 1


@pytest.mark.parametrize(
    ("positions", "start", "end"),
    [((-1.0, 0.0, 1.0), 0, None), ((-2.0, -1.0, 0.0, 1.0, 2.0), 5, 31), ((0.0, 1.0), 3, 4 + 2)],
)
def test_buy_and_hold_earns_the_move_minus_one_entry(positions, start, end):
    cfg = EnvConfig(positions=positions)
    params = _fold(1, cfg, start, end)
    end = N_BARS if end is None else end
    result, record = _evaluate(ev.buy_and_hold_policy(positions), params, jax.random.key(0))
    close = np.asarray(params.close, np.float64)
    size = max(positions)
    expected = size * (close[end - 1] - close[start]) - size * cfg.cost_points
    assert result["net_pnl_points"] == pytest.approx(expected, abs=1e-5)
    assert result["n_trades"] == 1 and result["exposure"] == 1.0 and result["turnover"] == size
    assert result["n_round_trips"] == 0 and record.positions.shape == (end - start - 1,)


@pytest.mark.slow
def test_random_rollout_matches_the_reference_and_pads_with_zeros():
    cfg = EnvConfig(positions=(-2.0, -1.0, 0.0, 1.0, 2.0), slippage_ticks=2.0)
    params = _fold(2, cfg, start=4, end=30)
    policy = ev.random_policy(cfg.n_actions)
    full = _rollout(policy, params, jax.random.key(7))
    n = 30 - 4 - 1
    assert full.actions.shape == (N_BARS - 1,)
    for array in full:
        np.testing.assert_array_equal(np.asarray(array)[n:], 0)
    record = ev.trim(full, params)
    assert set(record.actions.tolist()) == set(range(5))  # uniform over the grid
    ref = backtest(
        params.close, cfg.positions, record.actions, cost_points=cfg.cost_points, start=4, end=30
    )
    np.testing.assert_array_equal(record.positions, ref.positions)
    np.testing.assert_array_equal(record.pnl_points, ref.pnl_points)
    np.testing.assert_allclose(record.cost_points, ref.cost_points, rtol=1e-6)
    np.testing.assert_allclose(record.net_points, ref.net_points, rtol=1e-6, atol=1e-6)
    again = ev.rollout(policy, params, jax.random.key(7))
    other = ev.rollout(policy, params, jax.random.key(8))
    np.testing.assert_array_equal(again.actions, full.actions)  # jit == no jit, same key
    assert not np.array_equal(other.actions, full.actions)


@pytest.mark.slow
def test_greedy_policy_follows_q_and_rollout_vmaps_over_folds():
    # Q favours long when feature 0 > 0, short otherwise; position (last obs entry) is ignored
    def q_fn(obs):
        return jnp.stack([-obs[0], jnp.zeros(()), obs[0]])

    policy = ev.greedy_policy(q_fn)
    folds = [_fold(3), _fold(4, start=2, end=25)]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *folds)
    keys = jax.random.split(jax.random.key(0), 2)
    batched = jax.jit(jax.vmap(lambda p, k: ev.rollout(policy, p, k)))(stacked, keys)
    for i, fold in enumerate(folds):
        single = ev.rollout(policy, fold, keys[i])
        jax.tree.map(lambda a, b, i=i: np.testing.assert_array_equal(a[i], b), batched, single)
        record = ev.trim(single, fold)
        start = int(fold.start)
        feature0 = np.asarray(fold.features)[start : start + record.actions.size, 0]
        np.testing.assert_array_equal(record.actions, np.where(feature0 > 0, 2, 0))


@pytest.mark.slow
def test_evaluate_baselines_returns_metrics_and_rollouts():
    cfg = EnvConfig()
    params = _fold(5, cfg, start=1, end=37)
    results = ev.evaluate_baselines(params, jax.random.key(3), cfg, BARS_PER_YEAR)
    assert set(results) == {"flat", "buy_and_hold", "random"}
    for name, entry in results.items():
        json.dumps(entry["metrics"], allow_nan=False)
        assert entry["rollout"].net_points.shape == (35,), name
        np.testing.assert_allclose(
            ev.equity_curve(entry["rollout"].net_points)[-1],
            entry["metrics"]["net_pnl_points"],
            atol=1e-9,
        )
    assert results["flat"]["metrics"]["net_pnl_points"] == 0.0
    assert results["random"]["metrics"]["n_trades"] > 0
    again = ev.evaluate_baselines(params, jax.random.key(3), cfg, BARS_PER_YEAR)
    assert again["random"]["metrics"] == results["random"]["metrics"]


def test_hold_penalty_leaves_the_judged_pnl_and_the_baselines_unchanged():
    """env.hold_penalty charges the training reward only: a fixed action sequence (the random
    policy at one key) and the baselines are judged alike with and without it, at the float64
    reference's net."""
    judged = []
    for cfg in (EnvConfig(), EnvConfig(hold_penalty=0.5)):
        params = _fold(7, cfg, start=2, end=35)
        result, record = _evaluate(ev.random_policy(cfg.n_actions), params, jax.random.key(9))
        baselines = ev.evaluate_baselines(params, jax.random.key(9), cfg, BARS_PER_YEAR)
        judged.append((result, record, {name: b["metrics"] for name, b in baselines.items()}))
    (plain, plain_record, plain_baselines), (charged, charged_record, charged_baselines) = judged
    for a, b in zip(plain_record, charged_record, strict=True):
        np.testing.assert_array_equal(a, b)
    assert plain == charged and plain_baselines == charged_baselines
    ref = backtest(
        params.close,
        cfg.positions,
        charged_record.actions,
        cost_points=cfg.cost_points,
        hold_penalty=0.5,
        start=2,
        end=35,
    )
    assert np.any(ref.reward != ref.net_points)  # the charge is real in training rewards
    np.testing.assert_allclose(charged_record.net_points, ref.net_points, rtol=1e-6, atol=1e-6)
    assert charged["net_pnl_points"] == pytest.approx(ref.net_points.sum(), abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize(("start", "end"), [(0, None), (3, 29)])
def test_baselines_in_one_scan_are_each_policy_run_alone(start, end):
    """The one-scan baselines (a switch on the lane index under vmap) give each policy's own
    rollout bit for bit, the random one included (every lane sees the same keys)."""
    cfg = EnvConfig(positions=(-2.0, -1.0, 0.0, 1.0, 2.0), slippage_ticks=1.0)
    params = _fold(6, cfg, start, end)
    key = jax.random.key(11)
    together = ev.evaluate_baselines(params, key, cfg, BARS_PER_YEAR)
    assert tuple(together) == ev.BASELINES
    policies = {
        "flat": ev.flat_policy(cfg.positions),
        "buy_and_hold": ev.buy_and_hold_policy(cfg.positions),
        "random": ev.random_policy(cfg.n_actions),
    }
    for name, policy in policies.items():
        alone, record = _evaluate(policy, params, key, cfg.point_value_usd)
        for got, want in zip(together[name]["rollout"], record, strict=True):
            np.testing.assert_array_equal(got, want, err_msg=name)
        assert together[name]["metrics"] == alone, name


def test_flat_policy_needs_a_flat_position():
    with pytest.raises(ValueError, match="env.positions"):
        ev.flat_policy((-1.0, 1.0))
    assert ev.flat_policy((-1.0, 0.0, 1.0)) is ev.flat_policy([-1, 0, 1])  # cached: no recompile


def test_equity_curve_is_cumulative_float64():
    curve = ev.equity_curve(np.array([1.0, -0.5, 0.25], np.float32))
    assert curve.dtype == np.float64
    np.testing.assert_array_equal(curve, [1.0, 0.5, 0.75])


def _trades_bar_by_bar(net, positions, cost):
    """Round trips' net PnL walked bar by bar (the definition in ``ev.metrics``)."""
    trades, open_pnl, p_old = [], None, 0.0
    for carry, p_new, bar_cost in zip(net.tolist(), positions.tolist(), cost.tolist(), strict=True):
        if open_pnl is not None and (p_new == 0.0 or p_old * p_new < 0):
            exit_cost = bar_cost * abs(p_old) / abs(p_new - p_old)
            trades.append(open_pnl - exit_cost)
            open_pnl, carry = None, carry + exit_cost
        if p_new != 0.0:
            open_pnl = carry if open_pnl is None else open_pnl + carry
        p_old = p_new
    return trades


@given(
    st.lists(
        st.tuples(st.sampled_from([-2.0, -1.0, 0.0, 0.5, 1.0]), st.integers(1, 150)),
        max_size=30,
    ),
    st.integers(0, 2**31 - 1),
)
def test_closed_trades_equal_the_bar_by_bar_walk_exactly(blocks, seed):
    """Only the bars where the held sign changes are visited, and a long trade is summed by
    numpy: every trade's PnL is the walk's to the last bit (the hit rate reads its sign)."""
    positions = np.array([p for p, length in blocks for _ in range(length)])
    rng = np.random.default_rng(seed)
    net = rng.normal(size=positions.size) * 10.0 ** rng.integers(-3, 4)
    cost = 0.3 * np.abs(np.diff(positions, prepend=0.0))
    assert ev._closed_trade_pnls(net, positions, cost) == _trades_bar_by_bar(net, positions, cost)
