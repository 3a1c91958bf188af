"""Benchmark of the bar-data layer on the CPU: synthesis, features, folds + normalisation.

Each stage is timed separately with ``time.perf_counter``, best of ``repeats`` runs, on
``n_bars`` synthetic bars with the default data and walk-forward settings (a proportionally
smaller layout when the default one does not fit). Also times ``load_bars`` on the same bars
written as CSV, the cost of a real-data run's first step.

    python -m benchmarks.data_pipeline [--bars 60000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from jdqn.accel.xla_flags import configure
from jdqn.config import DataConfig, WalkForwardConfig
from jdqn.data import (
    compute_features,
    load_bars,
    make_folds,
    split_folds,
    synthetic_bars,
    write_bars,
)


def _best_of(repeats: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _layout(n_bars: int) -> WalkForwardConfig:
    default = WalkForwardConfig()
    if n_bars >= default.bars_needed():
        return default
    return WalkForwardConfig(
        train_bars=max(2, n_bars // 3),
        test_bars=max(2, n_bars // 5),
        purge_bars=max(0, n_bars // 50),
    )


def run(n_bars: int = 60_000, repeats: int = 3) -> dict[str, float]:
    """Seconds per stage (best of ``repeats``): synth, features, folds + normalisation, CSV load."""
    data_cfg, walkforward = DataConfig(), _layout(n_bars)
    bars = synthetic_bars(n_bars, seed=0, signal_strength=0.2)
    features = compute_features(bars, data_cfg)
    timings = {
        "synth_s": _best_of(repeats, lambda: synthetic_bars(n_bars, 0, 0.2)),
        "features_s": _best_of(repeats, lambda: compute_features(bars, data_cfg)),
        "folds_normalise_s": _best_of(
            repeats,
            lambda: split_folds(
                features.values,
                bars.close,
                make_folds(n_bars, walkforward),
                data_cfg.feature_clip,
            ),
        ),
    }
    timings["total_s"] = sum(timings.values())
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "bars.csv"
        write_bars(bars, path)
        timings["load_csv_s"] = _best_of(repeats, lambda: load_bars(path))
    return timings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bars", type=int, default=60_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    timings = run(args.bars, args.repeats)
    print(f"data pipeline, {args.bars:,} bars, best of {args.repeats}")
    print(f"{'stage':<20}{'seconds':>10}")
    for name, seconds in timings.items():
        print(f"{name.removesuffix('_s'):<20}{seconds:>10.3f}")


if __name__ == "__main__":
    configure()  # jdqn's XLA flags, before JAX starts a backend
    main()
