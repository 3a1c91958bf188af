"""Walk-forward arrays: per-fold train-only normalisation, no leakage, stacking, sources."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jdqn.config import Config, DataConfig, WalkForwardConfig
from jdqn.data import (
    CALENDARS,
    Bars,
    FoldArrays,
    bars_per_year,
    compute_features,
    describe_source,
    load_bars,
    load_source,
    prepare_walkforward,
    stack_folds,
    synthetic_bars,
)

ES_SAMPLE = Path(__file__).resolve().parents[1] / "data" / "es_2013-09_1min.csv"
CFG = Config(
    data=DataConfig(synthetic_bars=8_000, synthetic_seed=2, signal_strength=0.1),
    walkforward=WalkForwardConfig(n_folds=3, train_bars=3_000, test_bars=1_200, purge_bars=100),
)
BARS = load_source(CFG.data)
DATA = prepare_walkforward(BARS, CFG)


def test_shapes_dtypes_and_metadata():
    n_features = len(DATA.feature_names)
    assert len(DATA.folds) == len(DATA.train) == len(DATA.test) == len(DATA.test_timestamps) == 3
    assert DATA.n_features == n_features == 15
    assert DATA.feature_groups["calendar"] == (9, 10, 11, 12, 13, 14)
    for fold, train, test, stamps in zip(
        DATA.folds, DATA.train, DATA.test, DATA.test_timestamps, strict=True
    ):
        assert isinstance(train, FoldArrays)
        assert train.features.shape == (3_000, n_features) and train.close.shape == (3_000,)
        assert test.features.shape == (1_200, n_features) and test.close.shape == (1_200,)
        assert train.features.dtype == test.features.dtype == np.float32
        assert train.close.dtype == test.close.dtype == np.float32
        np.testing.assert_array_equal(train.close, BARS.close[fold.train_start : fold.train_end])
        np.testing.assert_array_equal(test.close, BARS.close[fold.test_start : fold.test_end])
        np.testing.assert_array_equal(stamps, BARS.timestamp[fold.test_start : fold.test_end])
        assert np.abs(train.features).max() <= CFG.data.feature_clip
    assert DATA.folds[-1].test_end == len(BARS) == 8_000
    assert DATA.source == "synthetic(seed=2, bars=8000, signal=0.1)"
    assert DATA.bars_per_year == 1380 * 252


def test_each_fold_is_normalised_with_its_own_train_statistics():
    raw = compute_features(BARS, CFG.data).values.astype(np.float64)
    clip = CFG.data.feature_clip
    for fold, train, test, norm in zip(
        DATA.folds, DATA.train, DATA.test, DATA.normalisers, strict=True
    ):
        window = raw[fold.train_start : fold.train_end]
        mean, std = window.mean(0), window.std(0)
        std = np.where(std > 0, std, 1.0)
        np.testing.assert_allclose(norm.mean, mean, rtol=1e-12, atol=1e-15)
        for arrays, (lo, hi) in ((train, (fold.train_start, fold.train_end)),
                                 (test, (fold.test_start, fold.test_end))):  # fmt: skip
            want = np.clip((raw[lo:hi] - mean) / std, -clip, clip)
            np.testing.assert_allclose(arrays.features, want, rtol=1e-5, atol=1e-5)
    # Different folds, different statistics.
    assert not np.array_equal(DATA.normalisers[0].mean, DATA.normalisers[2].mean)


@given(
    fold=st.integers(0, 2),
    offset=st.integers(0, 5_000),
    seed=st.integers(0, 2**31 - 1),
)
def test_train_arrays_ignore_bars_from_the_train_end_on(fold, offset, seed):
    """Altering bars at or after a fold's train_end (purge, test, later) leaves its train data."""
    window = DATA.folds[fold]
    cut = min(window.train_end + offset, len(BARS) - 1)
    rng = np.random.default_rng(seed)
    scale = np.exp(rng.normal(0, 0.02, len(BARS) - cut))
    fields = {}
    for name in ("open", "high", "low", "close"):
        values = getattr(BARS, name).copy()
        values[cut:] *= scale
        fields[name] = values
    volume = BARS.volume.copy()
    volume[cut:] = rng.integers(1, 10_000, len(BARS) - cut)
    altered = dataclasses.replace(BARS, volume=volume, **fields)
    data = prepare_walkforward(altered, CFG)
    np.testing.assert_array_equal(data.train[fold].features, DATA.train[fold].features)
    np.testing.assert_array_equal(data.train[fold].close, DATA.train[fold].close)
    np.testing.assert_array_equal(data.normalisers[fold].mean, DATA.normalisers[fold].mean)
    np.testing.assert_array_equal(data.normalisers[fold].std, DATA.normalisers[fold].std)
    assert not np.array_equal(data.test[-1].close, DATA.test[-1].close)  # the change is real


def test_stack_folds():
    stacked = stack_folds(DATA.train)
    assert stacked.features.shape == (3, 3_000, 15) and stacked.close.shape == (3, 3_000)
    np.testing.assert_array_equal(stacked.features[1], DATA.train[1].features)
    expanding = dataclasses.replace(
        CFG, walkforward=dataclasses.replace(CFG.walkforward, mode="expanding")
    )
    data = prepare_walkforward(BARS, expanding)
    assert [len(a.close) for a in data.train] == [3_000, 4_200, 5_400]
    assert stack_folds(data.test).features.shape == (3, 1_200, 15)
    with pytest.raises(ValueError, match=r"lengths \[3000, 4200, 5400\].*mode=rolling"):
        stack_folds(data.train)
    with pytest.raises(ValueError, match="stack_folds"):
        stack_folds([])


def test_bars_per_year_by_hand():
    minute = np.timedelta64(1, "m")
    sunday_evening = np.datetime64("2013-09-08T17:00", "ns") + np.arange(10) * minute
    monday_rth = np.datetime64("2013-09-09T08:30", "ns") + np.arange(10) * minute
    tuesday = np.datetime64("2013-09-10T08:30", "ns") + np.arange(30) * minute
    wednesday = np.datetime64("2013-09-11T08:30", "ns") + np.arange(5) * minute
    stamps = np.concatenate([sunday_evening, monday_rth, tuesday, wednesday])
    # Trading days: Monday 20 bars (Sunday evening counts toward Monday), Tuesday 30, Wed 5.
    assert bars_per_year(stamps, CALENDARS["cme_equity"]) == 20 * 252
    rth_only = np.concatenate(
        [np.datetime64(f"2013-09-{d:02d}T08:30", "ns") + np.arange(390) * minute for d in (9, 10)]
    )
    assert bars_per_year(rth_only, CALENDARS["cme_equity"]) == 390 * 252


def test_real_es_sample_walkforward():
    cfg = Config(
        data=DataConfig(path=str(ES_SAMPLE)),
        walkforward=WalkForwardConfig(n_folds=3, train_bars=300, test_bars=180, purge_bars=60),
    )
    bars = load_source(cfg.data)
    assert len(bars) == 2_264
    data = prepare_walkforward(bars, cfg)
    assert data.source == str(ES_SAMPLE) == describe_source(cfg.data)
    assert data.folds[-1].test_end == 2_264
    assert all(np.isfinite(a.features).all() for a in data.train + data.test)
    # Two Globex sessions: the Labor Day session (Sun 17:00 to Mon 10:29) and Tuesday's; counted
    # independently with pandas (session date = the date 7 hours after each bar).
    sessions = pd.Series(bars.timestamp + np.timedelta64(7, "h")).dt.date.value_counts()
    assert sessions.sort_index().to_numpy().tolist() == [1_028, 1_236]
    assert data.bars_per_year == (1_028 + 1_236) / 2 * 252 == 285_264


def test_load_source_and_describe_source():
    cfg = DataConfig(synthetic_bars=1_000, synthetic_seed=4, signal_strength=0.25)
    bars = load_source(cfg)
    assert isinstance(bars, Bars) and len(bars) == 1_000
    np.testing.assert_array_equal(bars.close, synthetic_bars(1_000, 4, 0.25).close)
    assert describe_source(cfg) == "synthetic(seed=4, bars=1000, signal=0.25)"
    assert len(load_source(DataConfig(path=str(ES_SAMPLE)))) == len(load_bars(ES_SAMPLE))


def test_too_short_data_fails_before_features():
    with pytest.raises(ValueError, match="walkforward needs 57,380 bars"):
        prepare_walkforward(load_bars(ES_SAMPLE), Config())


def test_data_pipeline_benchmark_reports_every_stage():
    from benchmarks.data_pipeline import run

    timings = run(n_bars=2_000, repeats=1)
    assert set(timings) == {"synth_s", "features_s", "folds_normalise_s", "total_s", "load_csv_s"}
    assert all(seconds > 0 for seconds in timings.values())
