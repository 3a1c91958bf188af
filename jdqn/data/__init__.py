"""Bar data: validated bar files, trading calendars, synthetic ES bars, past-only features,
walk-forward folds."""

from jdqn.data.bars import BarFileError, Bars, load_bars
from jdqn.data.calendars import CALENDARS
from jdqn.data.dataset import (
    FoldArrays,
    WalkForwardData,
    bars_per_year,
    describe_source,
    load_source,
    prepare_walkforward,
    read_bars,
    split_folds,
    stack_folds,
)
from jdqn.data.features import Normaliser, compute_features, fit_normaliser, normalise
from jdqn.data.folds import Fold, make_folds
from jdqn.data.synth import synthetic_bars, synthetic_path, write_bars

__all__ = [
    "CALENDARS",
    "BarFileError",
    "Bars",
    "Fold",
    "FoldArrays",
    "Normaliser",
    "WalkForwardData",
    "bars_per_year",
    "compute_features",
    "describe_source",
    "fit_normaliser",
    "load_bars",
    "load_source",
    "make_folds",
    "normalise",
    "prepare_walkforward",
    "read_bars",
    "split_folds",
    "stack_folds",
    "synthetic_bars",
    "synthetic_path",
    "write_bars",
]
