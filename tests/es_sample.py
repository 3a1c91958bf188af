"""The real ES sample (tests/data, 2,264 bars) and fold settings that fit it, shared by tests."""

from pathlib import Path

ES_SAMPLE = Path(__file__).parent / "data" / "es_2013-09_1min.csv"

# 3 rolling folds of train 1,000 / purge 60 / test 300 bars (2,260 of the 2,264), with slices,
# batch and buffer scaled down to the 1,000-bar train window.
ES_FOLDS = [
    "walkforward.train_bars=1000",
    "walkforward.test_bars=300",
    "walkforward.purge_bars=60",
    "train.n_slices=16",
    "train.batch_size=32",
    "replay.capacity=128",
]
