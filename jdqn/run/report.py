"""Human-facing outputs of a run: equity CSVs, PNG plots, the console table, and the workers that
write the files (:class:`BackgroundWrites`)."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from jdqn.evaluation.stats import RunSeries

# matplotlib's object API, not pyplot: no global figure state, no GUI backend, each figure freed
# with its last reference. Imported where a plot is drawn (runs without plots never pay for it).
PLOT_MODULES = ("matplotlib.figure",)

# Training curves plotted per run, in this order (names of LearnerMetrics fields).
TRAINING_CURVES = (
    ("loss_mse", "loss_c51", "loss_causal", "loss_div"),
    ("q_mean", "q_max"),
    ("edge_mass",),
    ("grad_norm_mse", "grad_norm_c51", "grad_norm_mse_after", "grad_norm_c51_after"),
)


class BackgroundWrites:
    """Plots and CSVs written off the main thread, so that they overlap device work.

    CSVs (and, without plot processes, plots) go to one worker thread, in submission order. With
    ``plot_processes`` > 0 plots go to that many worker processes instead: rendering is Python
    that holds the GIL, so processes draw side by side on cores of their own (:func:`plot_processes`
    says how many a machine can spare). A plot is a pure function of its arguments, so where it
    is drawn does not change the file. Spawn imports the caller's main module again in each
    process, so ``jdqn.run.walkforward.run_walkforward`` asks for them only when told to (the
    ``jdqn``
    command does; an unguarded script would run itself again).

    Leaving the ``with`` block waits for every write, also when the block raised, so nothing
    writes into a run directory after it is renamed or discarded; a failed write is re-raised
    there unless the block raised (its own exception takes precedence).
    """

    def __init__(self, preload: Sequence[str] = (), plot_processes: int = 0) -> None:
        """``preload``: modules the writes will need, imported by the workers while the caller
        still compiles and trains (mostly waiting on XLA, off the GIL)."""
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jdqn-writes")
        self._pending: list[Future[None]] = []
        self._plots = _plot_pool(plot_processes, tuple(preload)) if plot_processes > 0 else None
        if self._plots is None and preload:
            self.prefetch(preload)

    def prefetch(self, modules: Sequence[str]) -> None:
        """Imports ``modules`` on the writer thread, in order, ahead of the caller's first use
        (orbax, tensorboardX: queued once a chunk is on the device, imported while the caller
        waits on it). The caller runs no import of its own meanwhile: two threads importing
        different packages can meet in shared dependencies' module locks, and CPython then hands
        one a half-initialised module."""
        for module in modules:
            self.submit(_import, module)

    def submit(self, write: Callable[..., None], *args: Any) -> None:
        """Queues ``write(*args)`` on the writer thread (from the thread that owns this object);
        the arguments must not change afterwards."""
        self._pending.append(self._pool.submit(write, *args))

    def submit_plot(self, plot: Callable[..., None], *args: Any) -> None:
        """Queues ``plot(*args)``: in a plot process when there are any, else as :meth:`submit`.
        ``plot`` must be a module-level function and its arguments picklable."""
        if self._plots is not None:
            try:
                self._pending.append(self._plots.submit(plot, *args))
                return
            except BrokenProcessPool:  # a plot process died (killed, out of memory): drop them
                _discard_plot_pool(self._plots)
                self._plots = None
        self.submit(plot, *args)

    def __enter__(self) -> BackgroundWrites:
        return self

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        self._pool.shutdown(wait=True)  # every queued write finishes, also when the block raised
        wait(self._pending)  # the plot processes' share (they stay for the process's next run)
        if exc is None:  # the block's own error takes precedence over a write's
            for future in self._pending:
                if (error := future.exception()) is not None:
                    raise error


def plot_processes(cores: int) -> int:
    """Plot processes for a machine with ``cores`` usable cores: none below
    ``jdqn.run.background.MIN_CORES`` (they would compete with XLA's threads), else up to
    :data:`PLOT_PROCESSES` while two cores stay for the caller and XLA."""
    from jdqn.run.background import MIN_CORES

    return 0 if cores < MIN_CORES else max(1, min(PLOT_PROCESSES, cores - 2))


# Plot processes at most: the main command draws six plots (two per fold).
PLOT_PROCESSES = 3


# Plot process pools by (processes, preload), started by the first run that asks and kept for the
# Python process's later runs: shutting one down joins its processes, whose teardown would hold up
# the end of the run. They end with the Python process (see _start_plot_process).
_PLOT_POOLS: dict[tuple[int, tuple[str, ...]], ProcessPoolExecutor] = {}
_PLOT_POOLS_LOCK = threading.Lock()


def _plot_pool(processes: int, preload: tuple[str, ...]) -> ProcessPoolExecutor:
    with _PLOT_POOLS_LOCK:
        pool = _PLOT_POOLS.get((processes, preload))
        if pool is None:
            # spawn, not fork: the caller runs JAX's threads, which a fork would copy mid-state.
            pool = ProcessPoolExecutor(
                processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_plot_process,
                initargs=(preload,),
            )
            for _ in range(processes):  # start them all now, not at the first plot
                pool.submit(_ready)
            _PLOT_POOLS[(processes, preload)] = pool
        return pool


def _discard_plot_pool(pool: ProcessPoolExecutor) -> None:
    with _PLOT_POOLS_LOCK:
        for key in [key for key, kept in _PLOT_POOLS.items() if kept is pool]:
            del _PLOT_POOLS[key]
    pool.shutdown(wait=False)


def _start_plot_process(preload: tuple[str, ...]) -> None:
    # Ctrl-C reaches the whole process group: the caller handles it and still waits for the
    # queued plots, so a plot process ignores it rather than print a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A process whose parent is gone ends: the `jdqn` command leaves with os._exit, and a killed
    # parent sends no stop signal (the task queue never reports end-of-file).
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_end_with, args=(parent,), daemon=True).start()
    for module in preload:
        _import(module)


def _end_with(parent: multiprocessing.process.BaseProcess) -> None:
    parent.join()  # returns when the parent has exited
    os._exit(0)


def _ready() -> None:
    """A no-op task: submitted once per plot process so that each starts (and imports) early."""


def _import(module: str) -> None:
    importlib.import_module(module)


def write_equity_csv(
    path: Path,
    timestamps: np.ndarray,
    curves: Mapping[str, np.ndarray],
    positions: Mapping[str, np.ndarray],
) -> None:
    """One row per test bar interval t -> t+1: cumulative net PnL (points) and position held.

    ``timestamp`` is bar t+1, where the row's PnL is realised, so the curve lines up with a price
    chart of the same bars; ``<policy>_position`` is what was held over the interval.
    """
    columns = {f"{name}_equity_points": curve for name, curve in curves.items()}
    columns |= {f"{name}_position": held for name, held in positions.items()}
    _write_csv(path, timestamps[1 : _length(curves) + 1], columns)


def _write_csv(path: Path, timestamps: np.ndarray, columns: Mapping[str, np.ndarray]) -> None:
    """A ``timestamp`` column then ``columns`` as float64, written with pyarrow (faster than pandas
    and off the GIL); floats keep full precision (shortest round trip)."""
    stamps = np.asarray(timestamps, "datetime64[ns]")
    # Whole seconds (1-minute bars) are written without a fractional part.
    if np.all(stamps.astype(np.int64) % 10**9 == 0):
        stamps = stamps.astype("datetime64[s]")
    table = {"timestamp": pa.array(stamps)}
    table |= {name: pa.array(np.asarray(values, np.float64)) for name, values in columns.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    # The header is written by hand: pyarrow quotes header names whatever the quoting style.
    with path.open("wb") as handle:
        handle.write((",".join(table) + "\n").encode())
        options = pa_csv.WriteOptions(include_header=False, quoting_style="none")
        pa_csv.write_csv(pa.table(table), handle, options)


def _length(curves: Mapping[str, np.ndarray]) -> int:
    lengths = {len(c) for c in curves.values()}
    if len(lengths) != 1:
        raise ValueError(f"equity curves differ in length: {sorted(lengths)}")
    return lengths.pop()


def _figure(figsize: tuple[float, float]) -> Figure:
    from matplotlib.figure import Figure  # here, not at the top: see PLOT_MODULES

    return Figure(figsize=figsize)


def _equity_axes(ax: Any, title: str) -> None:
    ax.axhline(0.0, color="grey", linewidth=0.5)
    ax.set_title(title)
    ax.set_ylabel("net PnL (index points, after costs)")
    ax.legend(loc="upper left", fontsize=8)


def _save(fig: Figure, path: Path, dpi: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)


def plot_equity(
    path: Path, timestamps: np.ndarray, curves: Mapping[str, np.ndarray], title: str
) -> None:
    """Equity (cumulative net PnL, points) of the agent against the baselines."""
    # Fixed margins and legend corner instead of bbox_inches="tight" and loc="best": both make
    # matplotlib lay out or search over all the points again.
    fig = _figure(figsize=(10, 4.5))
    ax = fig.subplots()
    x = pd.to_datetime(timestamps[1 : _length(curves) + 1])  # PnL realised at bar t+1
    for name, curve in curves.items():
        ax.plot(x, curve, label=name, linewidth=1.6 if name.startswith("agent") else 1.0)
    _equity_axes(ax, title)
    fig.autofmt_xdate()
    fig.subplots_adjust(left=0.09, right=0.98, top=0.92, bottom=0.2)
    _save(fig, path, dpi=100)


def plot_training(path: Path, rows: Sequence[Mapping[str, Any]], title: str) -> None:
    """Training curves from metrics rows (one per chunk): losses, Q, edge mass, grad norms."""
    if not rows:
        return
    frame = pd.DataFrame(rows)
    fig = _figure(figsize=(9, 2.4 * len(TRAINING_CURVES)))
    axes = fig.subplots(len(TRAINING_CURVES), 1)
    for ax, names in zip(axes, TRAINING_CURVES, strict=True):
        for name in names:
            if name in frame:
                # A chunk without a value (e.g. no step where the causal term was due) is
                # left out, so the line joins the chunks that have one.
                known = frame[name].notna()
                ax.plot(frame["step"][known], frame[name][known], label=name, linewidth=1.0)
        ax.legend(loc="upper right", fontsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_title(title)
    axes[-1].set_xlabel("learner step")
    fig.subplots_adjust(left=0.1, right=0.98, top=0.96, bottom=0.06, hspace=0.3)
    _save(fig, path, dpi=90)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


# The baselines' columns (name, label, width): jdqn.evaluation.rollouts's three, then
# jdqn.evaluation.baselines' rules,
# forecaster and (synthetic data) informed rule, "-" where a run has none.
_BASELINE_COLUMNS = (
    ("flat", "flat $", 8),
    ("buy_and_hold", "b&h $", 10),
    ("random", "random $", 10),
    ("momentum", "tsmom $", 10),
    ("macd", "macd $", 10),
    ("ridge", "ridge $", 10),
    ("informed", "informed $", 10),
)


def summary_table(fold_results: Sequence[Mapping[str, Any]]) -> str:
    """Console table: one line per (fold, seed) with agent and baseline net PnL and Sharpe."""
    header = f"{'fold':>4} {'seed':>4}  {'status':<28} {'agent $':>10} {'Sh/day':>7} {'trades':>6} "
    header += "".join(f" {label:>{width}}" for _, label, width in _BASELINE_COLUMNS)
    lines = [header, "-" * len(header)]
    for row in fold_results:
        agent = row.get("agent") or {}
        lines.append(
            f"{row['fold']:>4} {row.get('seed', '-'):>4}  {row.get('status', 'ok'):<28.28} "
            f"{_fmt(agent.get('net_pnl_usd'), ',.0f'):>10} "
            f"{_fmt(agent.get('sharpe_daily'), '.2f'):>7} "
            f"{_fmt(agent.get('n_trades'), 'd'):>6} "
            + "".join(
                f" {_fmt((row['baselines'].get(name) or {}).get('net_pnl_usd'), ',.0f'):>{width}}"
                for name, _, width in _BASELINE_COLUMNS
            )
        )
    return "\n".join(lines)


def write_stitched_csv(
    path: Path,
    realised_at: np.ndarray,
    band: Mapping[str, np.ndarray],
    seeds: Mapping[int, np.ndarray],
    baselines: Mapping[str, np.ndarray],
) -> None:
    """The out-of-sample equity (points) of the folds' test windows end to end, one row per bar
    interval at the bar where its PnL lands: the seeds' band (``agent_p10``, ``agent_median``,
    ``agent_p90``), each seed's curve and each baseline's."""
    columns = {f"agent_{k}_equity_points": v for k, v in band.items()}
    columns |= {f"seed{s}_equity_points": v for s, v in seeds.items()}
    columns |= {f"{k}_equity_points": v for k, v in baselines.items()}
    _write_csv(path, realised_at, columns)


def plot_stitched(
    path: Path,
    realised_at: np.ndarray,
    band: Mapping[str, np.ndarray],
    baselines: Mapping[str, np.ndarray],
    title: str,
) -> None:
    """The stitched out-of-sample equity: the seeds' median with their 10-90 % band, and the
    baselines. Bars are plotted by their index (the windows' gaps closed), dates as ticks."""
    fig = _figure(figsize=(10, 4.5))
    ax = fig.subplots()
    x = np.arange(len(realised_at))
    ax.fill_between(x, band["p10"], band["p90"], alpha=0.25, label="agent, seeds 10-90 %")
    ax.plot(x, band["median"], linewidth=1.6, label="agent, median of seeds")
    for name, curve in baselines.items():
        ax.plot(x, curve, linewidth=1.0, label=name)
    ticks = np.linspace(0, max(len(x) - 1, 0), num=min(6, len(x))).astype(int)
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(realised_at[i])[:16] for i in ticks], fontsize=7)
    _equity_axes(ax, title)
    fig.subplots_adjust(left=0.09, right=0.98, top=0.92, bottom=0.12)
    _save(fig, path, dpi=100)


# The summary's metrics as the table names them, with their number formats.
_SUMMARY_LABELS = {
    "net_pnl_usd": ("net $", ",.0f"),
    "sharpe_daily": ("Sharpe (daily, ann.)", ".2f"),
    "sharpe": ("Sharpe (per bar, ann.)", ".2f"),
    "max_drawdown_usd": ("max drawdown $", ",.0f"),
    "turnover": ("turnover", ",.0f"),
    "exposure": ("exposure (bars held)", ".0%"),
}


def _estimate(entry: Mapping[str, Any], key: str, spec: str) -> str:
    """``estimate [low, high]``, ``*`` after an interval from too few seeds, n/a if undefined."""
    if entry.get(key) is None:
        return "n/a"
    low, high = entry[f"{key}_ci"]
    flag = "*" if entry.get("few_seeds") else " "
    return f"{format(entry[key], spec)} [{format(low, spec)}, {format(high, spec)}]{flag}"


def summary_text(summary: Mapping[str, Any]) -> str:
    """Console table of results.json's ``summary``: per scope (all folds, then each fold) the
    agent's median and IQM with their 95 % intervals, the agent minus each baseline in net $,
    and the best seed's deflated Sharpe ratio."""
    header = f"{'scope':<7} {'metric':<22} {'median [95% CI]':>34} {'IQM [95% CI]':>34}"
    lines = [
        "across seeds: median and interquartile mean, stratified bootstrap 95% CIs "
        "(strata = folds; they cover seed noise only, not the test windows' price noise)",
        header,
        "-" * len(header),
    ]
    if summary.get("few_seeds"):
        lines.insert(1, f"* from fewer than {summary['min_seeds_for_ci']} seeds: not reliable")
    scopes = [("all", summary["overall"])]
    if len(summary["folds"]) > 1:  # one fold: "all" is that fold
        scopes += [(f"fold {k}", block) for k, block in summary["folds"].items()]
    for scope, block in scopes:
        for metric, (label, spec) in _SUMMARY_LABELS.items():
            entry = block["agent"][metric]
            lines.append(
                f"{scope:<7} {label:<22} {_estimate(entry, 'median', spec):>34} "
                f"{_estimate(entry, 'iqm', spec):>34}"
            )
        for name, metrics in block["agent_minus"].items():
            entry = metrics["net_pnl_usd"]
            lines.append(
                f"{scope:<7} {'agent - ' + name + ' $':<22} "
                f"{_estimate(entry, 'median', ',.0f'):>34} {_estimate(entry, 'iqm', ',.0f'):>34}"
            )
        dsr = block["deflated_sharpe"]
        if "best_seed" in dsr:
            value = "n/a" if dsr["dsr"] is None else format(dsr["dsr"], ".3f")
            lines.append(
                f"{scope:<7} {'deflated Sharpe':<22} {value:>34}   (best seed "
                f"{dsr['best_seed']}; {dsr['n_trials']} trials = {dsr['settings_tried']} "
                f"setting(s) x seeds; {block['n_halted']} halted)"
            )
    return "\n".join(lines)


def write_stitched(
    run_path: Path,
    series: Sequence[RunSeries],
    plots: bool,
    writes: BackgroundWrites | None = None,
) -> None:
    """The folds' test windows end to end (``curves/stitched_equity.csv`` and its plot): the
    seeds' median equity with their 10-90 % band, each seed's and each baseline's, for the seeds
    that trained every fold to its end (none: nothing is written). With ``writes`` the files are
    queued there, else written now."""
    from jdqn.evaluation.stats import (  # here: the plot processes import this module
        equity_band,
        stitch,
    )

    stitched = stitch(series, sorted({s.fold for s in series}))
    if not stitched.seeds:
        return
    band = equity_band(stitched.agent)
    baselines = {name: np.cumsum(net) for name, net in stitched.baselines.items()}
    seeds = dict(zip(stitched.seeds, np.cumsum(stitched.agent, axis=-1), strict=True))
    now = lambda write, *args: write(*args)
    submit, submit_plot = (now, now) if writes is None else (writes.submit, writes.submit_plot)
    at = stitched.realised_at
    submit(
        write_stitched_csv, run_path / "curves" / "stitched_equity.csv", at, band, seeds, baselines
    )
    if plots:
        title = f"out-of-sample equity, {len(stitched.seeds)} seed(s), test windows end to end"
        submit_plot(
            plot_stitched, run_path / "plots" / "stitched_equity.png", at, band, baselines, title
        )
