"""The probability of backtest overfitting (PBO) by combinatorially symmetric cross-validation
(CSCV; Bailey, Borwein, Lopez de Prado & Zhu, 2017, "The probability of backtest overfitting",
J. Computational Finance 20(4)), float64 numpy on the host.

The rows of a [T, N] matrix of per-period returns of N strategies (here: a sweep's settings) are
cut into S equal blocks; every choice of S/2 blocks is an in-sample set and the rest its
out-of-sample set. The strategy with the best in-sample Sharpe ratio is ranked out of sample;
PBO is the fraction of the C(S, S/2) splits in which it ranks at or below the median.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np

DEFAULT_BLOCKS = 16  # the paper's S


class CSCV(NamedTuple):
    """The outcome of :func:`probability_of_overfitting`."""

    pbo: float  # fraction of splits whose logit is <= 0
    logits: np.ndarray  # [C] float64, lambda_c = ln(w / (1 - w)) of each split
    best_in_sample: np.ndarray  # [C] int, n* of each split
    blocks: int  # S
    rows_used: int  # T rounded down to a multiple of S (the oldest rows are left out)


def probability_of_overfitting(returns: np.ndarray, blocks: int = DEFAULT_BLOCKS) -> CSCV:
    """PBO of choosing the best of N strategies by Sharpe ratio (Bailey et al., 2017, §2.3).

    Args:
      returns: [T, N] per-period returns, one column per strategy (N >= 2).
      blocks: S, even, >= 2, at most T; the T mod S oldest rows are left out.
    Returns:
      :class:`CSCV`. Each split's in-sample best n* has out-of-sample rank r (1 = worst, ties
      ordered by column), relative rank w = r / (N + 1) and logit ln(w / (1 - w)); the
      Sharpe ratio is mean / sample std (ddof 1) per period, 0 for a constant column."""
    returns = np.asarray(returns, np.float64)
    if returns.ndim != 2 or returns.shape[1] < 2:
        raise ValueError(f"CSCV needs a [T, N] matrix with N >= 2 strategies, got {returns.shape}")
    if blocks < 2 or blocks % 2 or blocks > returns.shape[0]:
        raise ValueError(f"CSCV blocks: {blocks} must be even, >= 2 and <= T ({returns.shape[0]})")
    n_rows, n_strategies = returns.shape
    used = n_rows - n_rows % blocks
    cut = returns[n_rows - used :].reshape(blocks, used // blocks, n_strategies)
    sums, squares = cut.sum(axis=1), (cut**2).sum(axis=1)  # [S, N] each
    count = used // 2  # rows in either half
    in_sample = np.asarray(list(itertools.combinations(range(blocks), blocks // 2)))  # [C, S/2]
    chosen = np.zeros((len(in_sample), blocks), bool)
    np.put_along_axis(chosen, in_sample, True, axis=1)

    def sharpe(mask: np.ndarray) -> np.ndarray:  # [C, S] -> [C, N]
        total, total_sq = mask @ sums, mask @ squares
        variance = (total_sq - total**2 / count) / (count - 1)
        std = np.sqrt(np.maximum(variance, 0.0))
        return np.divide(total / count, std, out=np.zeros_like(std), where=std > 0)

    sharpe_in, sharpe_out = sharpe(chosen.astype(np.float64)), sharpe((~chosen).astype(np.float64))
    best = np.argmax(sharpe_in, axis=1)  # [C], the first of equals
    order = np.argsort(np.argsort(sharpe_out, axis=1, kind="stable"), axis=1, kind="stable")
    rank = order[np.arange(len(best)), best] + 1  # 1 = worst out of sample
    relative = rank / (n_strategies + 1.0)
    logits = np.log(relative / (1.0 - relative))
    return CSCV(float(np.mean(logits <= 0.0)), logits, best, blocks, used)
