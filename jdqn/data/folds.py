"""Walk-forward fold layout: train window, purge gap, test window (docs/design.md §3, §7).

Rolling mode: every fold has ``train_bars`` of training, ``purge_bars`` of gap and ``test_bars``
of test, and fold k+1 is fold k shifted by ``test_bars``, so the test windows tile the end of the
series and the last ends at the last bar (surplus bars at the start are left out). Expanding
mode keeps the test windows and purge gaps but trains every fold from the first fold's train
start. The purge gap covers the feature lookback (checked by the config), so no test feature
shares a bar with its fold's train window.
"""

from __future__ import annotations

from dataclasses import dataclass

from jdqn.config import WalkForwardConfig


@dataclass(frozen=True)
class Fold:
    """One fold as half-open bar-index ranges [start, end)."""

    index: int
    train_start: int
    train_end: int
    test_start: int
    test_end: int


def make_folds(n_bars: int, cfg: WalkForwardConfig, min_purge: int = 0) -> list[Fold]:
    """Fold layout over a series of ``n_bars`` bars (module docstring); ValueError if too short,
    proposing a layout that fits, with a purge of at least ``min_purge`` (the feature lookback).
    """
    needed = cfg.bars_needed()
    if n_bars < needed:
        raise ValueError(_too_short_message(n_bars, cfg, min_purge))
    offset = n_bars - needed  # surplus old bars left out so the last test ends at the last bar
    folds = []
    for k in range(cfg.n_folds):
        rolling_start = offset + k * cfg.test_bars
        train_end = rolling_start + cfg.train_bars
        test_start = train_end + cfg.purge_bars
        train_start = offset if cfg.mode == "expanding" else rolling_start
        folds.append(Fold(k, train_start, train_end, test_start, test_start + cfg.test_bars))
    return folds


def _round_down(x: int) -> int:
    """Round down to two significant digits (readable suggestions)."""
    if x < 100:
        return x
    scale = 10 ** (len(str(x)) - 2)
    return x // scale * scale


def _too_short_message(n_bars: int, cfg: WalkForwardConfig, min_purge: int) -> str:
    needed = cfg.bars_needed()
    head = (
        f"walkforward needs {needed:,} bars (train {cfg.train_bars:,} + purge "
        f"{cfg.purge_bars:,} + {cfg.n_folds} folds x {cfg.test_bars:,} test) but the data has "
        f"{n_bars:,}; fix: "
    )
    fits = 2 + 2 * cfg.n_folds  # train >= 2 and test >= 2 bars
    # A complete working set: the purge kept where it is at most a tenth of the data, else cut
    # to that (never below the lookback), then train and test in their ratio in the rest.
    purge = min(cfg.purge_bars, max(min_purge, n_bars // 10))
    room = n_bars - purge
    if room < fits:
        return head + (
            f"only {max(room, 0):,} bars remain after a purge gap of {purge:,} (the feature "
            f"lookback is {min_purge:,}), too few for {cfg.n_folds} folds; use a longer bar file, "
            "fewer --folds, or lower --set walkforward.purge_bars (it must still cover the "
            "feature lookback)"
        )
    # Keep the train:test ratio; round to readable numbers.
    ratio = cfg.train_bars / cfg.test_bars
    test = max(2, _round_down(int(room / (cfg.n_folds + ratio))))
    train = max(2, _round_down(int(test * ratio)))
    if train + cfg.n_folds * test > room:  # one of them was raised to the minimum of 2
        if train == 2:
            test = (room - 2) // cfg.n_folds
        else:
            train = room - cfg.n_folds * test
    return head + (
        f"--set walkforward.train_bars={train} --set walkforward.test_bars={test} "
        f"--set walkforward.purge_bars={purge} (or use fewer --folds, or a longer bar file)"
    )


def validation_folds(folds: list[Fold], validation_bars: int, purge_bars: int) -> list[Fold]:
    """Each fold's train window split for nested selection: an inner train part, a purge gap
    and a validation tail of ``validation_bars`` that ends where the train window ends, so that
    nothing of it reaches the fold's test window; ValueError if the inner part is under 2 bars."""
    inner = []
    for fold in folds:
        validation_start = fold.train_end - validation_bars
        train_end = validation_start - purge_bars
        if validation_bars < 2 or train_end - fold.train_start < 2:
            raise ValueError(
                f"validation tail of {validation_bars:,} bars: the train window of "
                f"{fold.train_end - fold.train_start:,} bars must hold it, the purge of "
                f"{purge_bars:,} and at least 2 inner train bars; fix: a --validation-bars "
                "from 2 up to the train window minus the purge minus 2"
            )
        inner.append(
            Fold(fold.index, fold.train_start, train_end, validation_start, fold.train_end)
        )
    return inner
