"""Independent float64 reference backtester: a plain Python loop, sharing no code with
jdqn.evaluation.env.

One episode, starting flat at bar ``start``: action ``k`` is taken at bar ``start + k`` and moves
the held position to ``positions_grid[actions[k]]``; the position is then held over the interval
``start + k -> start + k + 1``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Backtest(NamedTuple):
    positions: np.ndarray  # [K] float64, position held over each interval
    pnl_points: np.ndarray  # [K] float64, gross mark-to-market
    cost_points: np.ndarray  # [K] float64, trading cost
    net_points: np.ndarray  # [K] float64, pnl - cost
    reward: np.ndarray  # [K] float64, net x reward_scale - hold_penalty x |position|
    done: np.ndarray  # [K] bool, True on the last possible action of the episode


def backtest(
    close,
    positions_grid,
    actions,
    *,
    cost_points: float,
    reward_scale: float = 1.0,
    hold_penalty: float = 0.0,
    start: int = 0,
    end: int | None = None,
) -> Backtest:
    """Run ``actions`` from bar ``start`` (at most end-start-1 of them) in float64."""
    close = [float(c) for c in close]
    end = len(close) if end is None else end
    if len(actions) > end - start - 1:
        raise ValueError("more actions than the episode has steps")
    held = 0.0
    rows = []
    for k, action in enumerate(actions):
        bar = start + k
        target = float(positions_grid[int(action)])
        pnl = target * (close[bar + 1] - close[bar])
        cost = cost_points * abs(target - held)
        net = pnl - cost
        reward = net * reward_scale - hold_penalty * abs(target)
        rows.append((target, pnl, cost, net, reward, bar + 1 == end - 1))
        held = target
    columns = list(zip(*rows, strict=True)) if rows else [()] * 6
    return Backtest(
        positions=np.array(columns[0], np.float64),
        pnl_points=np.array(columns[1], np.float64),
        cost_points=np.array(columns[2], np.float64),
        net_points=np.array(columns[3], np.float64),
        reward=np.array(columns[4], np.float64),
        done=np.array(columns[5], bool),
    )
