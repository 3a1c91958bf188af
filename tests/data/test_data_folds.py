"""Walk-forward folds: hand-computed layouts, invariants, and the too-short message."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jdqn.config import WalkForwardConfig
from jdqn.data import Fold, make_folds

SMALL = dict(n_folds=3, train_bars=30, purge_bars=5, test_bars=20)  # needs 95 bars


def test_rolling_layout_by_hand():
    folds = make_folds(100, WalkForwardConfig(mode="rolling", **SMALL))
    # 5 surplus bars at the start are left out so the last test window ends at bar 100.
    assert folds == [
        Fold(index=0, train_start=5, train_end=35, test_start=40, test_end=60),
        Fold(index=1, train_start=25, train_end=55, test_start=60, test_end=80),
        Fold(index=2, train_start=45, train_end=75, test_start=80, test_end=100),
    ]


def test_expanding_layout_by_hand():
    folds = make_folds(100, WalkForwardConfig(mode="expanding", **SMALL))
    assert folds == [
        Fold(index=0, train_start=5, train_end=35, test_start=40, test_end=60),
        Fold(index=1, train_start=5, train_end=55, test_start=60, test_end=80),
        Fold(index=2, train_start=5, train_end=75, test_start=80, test_end=100),
    ]


def test_exact_length_starts_at_bar_zero():
    folds = make_folds(95, WalkForwardConfig(**SMALL))
    assert folds[0].train_start == 0 and folds[-1].test_end == 95


def test_default_config_on_60k_bars():
    folds = make_folds(60_000, WalkForwardConfig())
    assert [(f.train_start, f.train_end, f.test_start, f.test_end) for f in folds] == [
        (2_620, 22_620, 24_000, 36_000),
        (14_620, 34_620, 36_000, 48_000),
        (26_620, 46_620, 48_000, 60_000),
    ]


@given(
    n_folds=st.integers(1, 6),
    train=st.integers(2, 500),
    test=st.integers(2, 300),
    purge=st.integers(0, 200),
    surplus=st.integers(0, 400),
    mode=st.sampled_from(["rolling", "expanding"]),
)
def test_layout_invariants(n_folds, train, test, purge, surplus, mode):
    cfg = WalkForwardConfig(
        n_folds=n_folds, mode=mode, train_bars=train, test_bars=test, purge_bars=purge
    )
    n_bars = cfg.bars_needed() + surplus
    folds = make_folds(n_bars, cfg)
    assert len(folds) == n_folds and [f.index for f in folds] == list(range(n_folds))
    assert folds[-1].test_end == n_bars  # the newest data are used
    for k, fold in enumerate(folds):
        assert 0 <= fold.train_start < fold.train_end <= fold.test_start < fold.test_end <= n_bars
        assert fold.test_start - fold.train_end == purge
        assert fold.test_end - fold.test_start == test
        assert fold.train_end - fold.train_start == train + (k * test if mode == "expanding" else 0)
        assert fold.train_start == (
            folds[0].train_start if mode == "expanding" else surplus + k * test
        )
        # No test bar of this fold, nor any later bar, is in its training window.
        assert fold.train_end + purge <= fold.test_start
        if k:
            assert fold.test_start == folds[k - 1].test_end  # test windows tile, never overlap


def test_too_short_message_is_one_actionable_line():
    with pytest.raises(ValueError) as info:
        make_folds(2_264, WalkForwardConfig(), min_purge=60)
    assert str(info.value) == (
        "walkforward needs 57,380 bars (train 20,000 + purge 1,380 + 3 folds x 12,000 test) but "
        "the data has 2,264; fix: --set walkforward.train_bars=710 "
        "--set walkforward.test_bars=430 --set walkforward.purge_bars=226 (or use fewer --folds, "
        "or a longer bar file)"
    )


def test_too_short_message_keeps_the_purge_above_the_lookback():
    with pytest.raises(ValueError) as info:
        make_folds(400, WalkForwardConfig(train_bars=300, test_bars=100), min_purge=60)
    assert "--set walkforward.train_bars=160 --set walkforward.test_bars=56 " in str(info.value)
    assert "--set walkforward.purge_bars=60 (" in str(info.value)
    with pytest.raises(ValueError, match="only 7 bars remain after a purge gap of 60 .* 3 folds"):
        make_folds(67, WalkForwardConfig(), min_purge=60)


@given(
    n_folds=st.integers(1, 5),
    train=st.integers(2, 50_000),
    test=st.integers(2, 20_000),
    purge=st.integers(0, 2_000),
    n_bars=st.integers(2, 60_000),
    min_purge=st.integers(0, 200),
)
def test_suggested_sizes_fit(n_folds, train, test, purge, n_bars, min_purge):
    cfg = WalkForwardConfig(n_folds=n_folds, train_bars=train, test_bars=test, purge_bars=purge)
    if n_bars >= cfg.bars_needed():
        assert make_folds(n_bars, cfg)[-1].test_end == n_bars
        return
    with pytest.raises(ValueError) as info:
        make_folds(n_bars, cfg, min_purge)
    message = str(info.value)
    assert "\n" not in message and "; fix: " in message and f"{n_bars:,}" in message
    suggestion = re.search(
        r"train_bars=(\d+) --set walkforward.test_bars=(\d+) --set walkforward.purge_bars=(\d+)",
        message,
    )
    if suggestion is None:
        assert "purge_bars" in message  # only a shorter purge or more data can help
        assert n_bars - min(purge, max(min_purge, n_bars // 10)) < 2 + 2 * n_folds
        return
    suggested = WalkForwardConfig(
        n_folds=n_folds,
        train_bars=int(suggestion.group(1)),
        test_bars=int(suggestion.group(2)),
        purge_bars=int(suggestion.group(3)),
    )
    assert min(purge, min_purge) <= suggested.purge_bars <= purge
    assert make_folds(n_bars, suggested)[-1].test_end == n_bars
