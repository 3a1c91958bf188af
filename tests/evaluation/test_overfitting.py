"""PBO by CSCV (jdqn.evaluation.overfitting) against a hand-worked case, a literal loop over the
paper's steps, and its behaviour on noise and on a dominant strategy."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from jdqn.evaluation.overfitting import probability_of_overfitting
from jdqn.evaluation.stats import per_bar_sharpe


def test_hand_worked_two_blocks() -> None:
    """Blocks A = rows 0-1, B = rows 2-3. In-sample A: Sharpe (2/sqrt2, 1/sqrt2, 3/sqrt8) picks
    strategy 0, out of sample on B (-2/sqrt2, 3/sqrt2, 1/sqrt2) it is last: w = 1/4. In-sample B
    picks 1, on A (sqrt2, 1/sqrt2, 3/sqrt8) it is last again: both logits ln(1/3), PBO 1."""
    returns = np.array([[1.0, 0.0, 1.0], [3.0, 2.0, 5.0], [-1.0, 2.0, 0.0], [-3.0, 4.0, 2.0]])
    result = probability_of_overfitting(returns, blocks=2)
    assert result.pbo == 1.0
    np.testing.assert_allclose(result.logits, [math.log(1 / 3)] * 2, rtol=1e-12)
    assert list(result.best_in_sample) == [0, 1]


def test_a_dominant_strategy_never_overfits() -> None:
    rng = np.random.default_rng(1)
    returns = rng.normal(size=(240, 5))
    returns[:, 3] += 2.0  # best in every half, in and out of sample
    result = probability_of_overfitting(returns, blocks=8)
    assert result.pbo == 0.0 and set(result.best_in_sample) == {3}
    assert np.allclose(result.logits, math.log(5 / 1))  # rank N of N: w = N / (N + 1)


def _paper_loop(returns: np.ndarray, blocks: int) -> tuple[float, list[float]]:
    """Bailey et al. (2017) §2.3, step by step: submatrices, every combination, Sharpe ratios,
    the in-sample best's out-of-sample relative rank and logit."""
    rows = len(returns) - len(returns) % blocks
    parts = np.split(returns[len(returns) - rows :], blocks)
    logits = []
    for train in itertools.combinations(range(blocks), blocks // 2):
        in_sample = np.concatenate([parts[b] for b in train])
        out = np.concatenate([parts[b] for b in range(blocks) if b not in train])
        r = [per_bar_sharpe(in_sample[:, n]) for n in range(returns.shape[1])]
        r_bar = [per_bar_sharpe(out[:, n]) for n in range(returns.shape[1])]
        best = int(np.argmax(r))
        rank = 1 + sum(1 for v in r_bar if v < r_bar[best])  # no ties in continuous data
        w = rank / (returns.shape[1] + 1)
        logits.append(math.log(w / (1 - w)))
    return float(np.mean(np.asarray(logits) <= 0)), logits


@pytest.mark.parametrize("blocks", [2, 6, 8])
def test_matches_the_papers_steps(blocks: int) -> None:
    rng = np.random.default_rng(blocks)
    returns = rng.normal(0.01, 1.0, size=(101, 6)) + rng.normal(0, 0.05, size=6)
    pbo, logits = _paper_loop(returns, blocks)
    result = probability_of_overfitting(returns, blocks=blocks)
    assert result.pbo == pbo
    np.testing.assert_allclose(result.logits, logits, rtol=1e-9)
    assert result.rows_used == 101 - 101 % blocks


def test_pure_noise_gives_about_one_half() -> None:
    rng = np.random.default_rng(0)
    pbos = [probability_of_overfitting(rng.normal(size=(800, 16)), 10).pbo for _ in range(12)]
    assert 0.35 < float(np.mean(pbos)) < 0.65


@pytest.mark.parametrize(
    ("shape", "blocks"), [((10, 1), 2), ((10, 3), 3), ((10, 3), 0), ((4, 3), 6), ((10,), 2)]
)
def test_bad_input_is_one_line(shape: tuple[int, ...], blocks: int) -> None:
    with pytest.raises(ValueError, match="CSCV"):
        probability_of_overfitting(np.zeros(shape), blocks)
