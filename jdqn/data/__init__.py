"""Bar data: load and validate bar files, synthetic ES bars, past-only features, walk-forward folds."""

from jdqn.data.bars import BarFileError, Bars, load_bars

__all__ = ["BarFileError", "Bars", "load_bars"]
