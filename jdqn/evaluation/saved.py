"""``jdqn evaluate``: a run's saved policies over new bars, judged as a walk-forward test window
(docs/design.md §16). Sharpe ratios are annualised with the run's bars per year (a short file's
own count would be a poor estimate); a run's own test window, with the warm-up before it, gives
back the run's numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from jdqn.config import Config, DataConfig, apply_overrides
from jdqn.data import Bars, read_bars
from jdqn.data.calendars import CALENDARS
from jdqn.data.intervals import describe_reading
from jdqn.evaluation.env import make_params
from jdqn.evaluation.judging import judge_run
from jdqn.evaluation.policy import Policy, PolicyError, load_policy, saved_policies
from jdqn.evaluation.rollouts import evaluate_baselines
from jdqn.run import report, rundir, termination

# The data keys that say how a bar file is read (``jdqn evaluate --set``).
READING_KEYS = ("data.columns", "data.timezone", "data.timestamp_format")


@termination.sigterm_raises()  # SIGTERM ends it as Ctrl-C does: its directory is removed
def evaluate_saved(
    run_dir: str | os.PathLike[str],
    data: str | os.PathLike[str],
    *,
    fold: int | None = None,
    out: str | os.PathLike[str] | None = None,
    name: str | None = None,
    plots: bool = True,
    log: Callable[[str], None] = print,
    data_overrides: Sequence[str] = (),
) -> rundir.RunOutcome:
    """Judge each seed's saved policy of ``fold`` (None: the run's last) on the bars of ``data``
    after the feature warm-up, from flat, writing what a walk-forward run writes to
    ``<out>/<name>`` (default ``<run_dir>/evaluations/eval-<UTC time>``). The bars are read as
    the run read its own (its ``data`` section: columns, time zone, timestamp format,
    calendar), with ``data_overrides`` (``KEY=VALUE`` of :data:`READING_KEYS`) on top. Bad
    input (no such run or fold, a bar file that fails validation, bars of another instrument or
    features) raises ``ValueError`` with one line before anything is written."""
    _refuse_unfinished(run_dir)
    saved = saved_policies(run_dir)
    folds = sorted({f for f, _ in saved})
    if fold is None and folds:
        fold = folds[-1]
    seeds = [s for f, s in saved if f == fold]
    # No policy of that fold: load_policy names what there is.
    policies = [load_policy(run_dir, fold, s) for s in seeds] or [load_policy(run_dir, fold)]
    first = policies[0]
    fold = first.fold
    settings, bars, warmup = _read_window(first, data, data_overrides)
    features = first.features(bars)[warmup:]
    close = bars.close[warmup:]
    timestamps = bars.timestamp[warmup:]
    cfg = first.cfg
    bars_per_year = float(first.meta["bars_per_year"])
    calendar = CALENDARS[cfg.data.calendar]  # its trading days, as the run judged them
    baselines = _baselines(first, features, close, bars_per_year)
    window = {"test": [warmup, len(bars)], "test_time": [str(timestamps[0]), str(timestamps[-1])]}

    run: rundir.RunDir | None = None
    writes = report.BackgroundWrites()  # as a walk-forward run writes them
    try:  # a signal held while the directory is made is raised in here, which removes it
        with rundir.interrupts_deferred():
            parent = Path(run_dir) / "evaluations" if out is None else out
            stamp = name or datetime.now(UTC).strftime("eval-%Y%m%d-%H%M%S")
            run = rundir.new_run_dir(parent, stamp)
        rows, series = [], []
        with writes:
            for policy in policies:
                judged = judge_run(
                    fold,
                    policy.seed,
                    policy.evaluate(features, close),
                    baselines,
                    timestamps,
                    halted=False,
                    point_value_usd=cfg.env.point_value_usd,
                    bars_per_year=bars_per_year,
                    calendar=calendar,
                )
                series.append(judged.series)
                row = {"fold": fold, "seed": policy.seed, "status": "ok", "window": window}
                rows.append(row | {"agent": judged.agent, "baselines": judged.baselines})
                what = "saved policy on new bars"
                report.write_judged(writes, run.path, judged, timestamps, what, cfg, plots)
            summary = report.write_summary(writes, run.path, rows, series, cfg, plots)
        reading = describe_reading(bars, settings, cfg.env.instrument)
        origin = {"run": str(Path(run_dir)), "fold": fold, "bars": reading}
        results = report.results_record(cfg, str(data), bars_per_year, rows, summary, **origin)
        rundir.write_json(run.results_path, results)
        final = rundir.finalize(run, None)  # an evaluation is not resumed: run again
    except BaseException:
        if run is not None:
            with rundir.interrupts_deferred():
                writes.finish()  # a signal on the block's last line left them running
                rundir.discard(run)
        raise
    log(report.summary_table(rows, cfg.output.show_random))
    log(report.summary_text(summary, cfg.output.show_random))
    log(f"jdqn: results in {final / 'results.json'}")
    return rundir.RunOutcome(final, results)


def _refuse_unfinished(run_dir: str | os.PathLike[str]) -> None:
    unfinished = Path(run_dir).name.endswith(rundir.INCOMPLETE_SUFFIX)
    if unfinished or (Path(run_dir).is_dir() and not (Path(run_dir) / "results.json").is_file()):
        raise PolicyError(
            f"{run_dir}: an unfinished run (no results.json), whose policies may be missing or "
            f"stale; fix: finish it with jdqn walkforward --resume {run_dir}, then evaluate it"
        )


def _read_window(
    policy: Policy, data: str | os.PathLike[str], data_overrides: Sequence[str]
) -> tuple[DataConfig, Bars, int]:
    """The bars of ``data`` read as ``policy``'s run read its own (with ``data_overrides``), and
    the feature warm-up; refused when no bar is left after it."""
    settings = _data_settings(policy.cfg, data_overrides)
    bars = policy.bars(read_bars(settings, data))
    warmup = policy.warmup_bars
    if len(bars) < warmup + 2:
        raise PolicyError(
            f"{data}: {len(bars)} bars, but the policies need {warmup} bars of feature warm-up "
            f"and then at least 2; fix: pass at least {warmup + 2} bars"
        )
    return settings, bars, warmup


def _data_settings(cfg: Config, overrides: Sequence[str]) -> DataConfig:
    """The run's data section with overrides of how a file is read on top; the calendar and
    the features are the policy's own."""
    others = [item for item in overrides if item.split("=", 1)[0].strip() not in READING_KEYS]
    if others:
        raise ValueError(
            f"--set {others[0]}: evaluate changes only how the file is read "
            f"({', '.join(READING_KEYS)}); the calendar and features are the policy's; fix: "
            "drop it"
        )
    return apply_overrides(cfg, list(overrides)).data


def _baselines(
    policy: Policy, features: np.ndarray, close: np.ndarray, bars_per_year: float
) -> dict[str, Any]:
    """The window's baselines, the random one keyed as the run keyed this fold's."""
    from jdqn.run.walkforward import run_keys  # the run's key derivation, one place

    cfg = policy.cfg
    folds, seeds = np.asarray([policy.fold], np.int32), np.asarray([0], np.int32)
    key = run_keys(cfg.train.seed, folds, seeds).baselines[0]
    return evaluate_baselines(make_params(features, close, cfg.env), key, cfg.env, bars_per_year)
