"""Human-facing outputs of a run: equity CSVs, PNG plots, the console table, and the workers that
write the files (:class:`BackgroundWrites`)."""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from jdqn.config import Config
    from jdqn.evaluation.judging import JudgedRun
    from jdqn.evaluation.stats import RunSeries

# matplotlib's object API, not pyplot: no global figure state, no GUI backend, each figure freed
# with its last reference. Imported where a plot is drawn (runs without plots never pay for it).
PLOT_MODULES = ("matplotlib.figure",)

# Training curves plotted per run, in this order (names of LearnerMetrics fields), with the
# panel's y label.
TRAINING_CURVES = (
    (("loss_mse", "loss_c51", "loss_causal", "loss_div"), "loss"),
    (("q_mean", "q_max"), "Q (reward units)"),
    (("edge_mass",), "target mass on the\nsupport's edge atoms"),
    (("grad_norm_mse", "grad_norm_c51", "grad_norm_mse_after", "grad_norm_c51_after"), "grad norm"),
)
# Baselines left out of plots and console tables unless output.show_random (results.json and the
# CSVs hold them all): a random policy pays the costs on most bars and dwarfs every other line.
HIDDEN_BASELINES = ("random",)
PNL_LABEL = "net PnL ($, after costs)"


def shown(names: Any, show_random: bool) -> list[str]:
    """``names`` less :data:`HIDDEN_BASELINES` unless ``show_random``."""
    return [n for n in names if show_random or n not in HIDDEN_BASELINES]


def number(value: float, spec: str) -> str:
    """``format(value, spec)`` without the minus of a value that rounds to zero ("-0")."""
    text = format(value, spec)
    return text[1:] if text.startswith("-") and not any(c in text for c in "123456789") else text


class BackgroundWrites:
    """Plots and CSVs written off the main thread, so that they overlap device work.

    CSVs (and, without plot processes, plots) go to one worker thread, in submission order. With
    ``plot_processes`` > 0 plots go to that many worker processes instead: rendering holds the
    GIL, so processes draw side by side on cores of their own. A plot is a pure function of its
    arguments, so where it is drawn does not change the file. Spawn imports the caller's main
    module again in each process, so ``run_walkforward`` asks for them only when told to (the
    ``jdqn`` command does; an unguarded script would run itself again).

    Files that no other write touches (each run's equity CSV) go to ``file_threads`` threads of
    their own, in any order: pyarrow formats a CSV off the GIL, and a sweep writes thousands.

    Leaving the ``with`` block waits for every write, also when the block raised, so nothing
    writes into a run directory after it is renamed or discarded; a failed write is re-raised
    there unless the block raised (its own exception takes precedence).
    """

    def __init__(
        self, preload: Sequence[str] = (), plot_processes: int = 0, file_threads: int = 1
    ) -> None:
        """``preload``: modules the writes will need, imported by the workers while the caller
        still compiles and trains (mostly waiting on XLA, off the GIL)."""
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jdqn-writes")
        self._files = ThreadPoolExecutor(file_threads, thread_name_prefix="jdqn-files")
        self._pending: list[Future[None]] = []
        self._plots = _plot_pool(plot_processes, tuple(preload)) if plot_processes > 0 else None
        if self._plots is None and preload:
            self.prefetch(preload)

    def prefetch(self, modules: Sequence[str]) -> None:
        """Imports ``modules`` on the writer thread, in order, ahead of the caller's first use
        (tensorboardX: queued once a chunk is on the device, imported while the caller
        waits on it). The caller runs no import of its own meanwhile: two threads importing
        different packages can meet in shared dependencies' module locks, and CPython then hands
        one a half-initialised module. A stop never leaves the caller holding the import lock
        that these imports need (:mod:`jdqn.run.termination` raises none inside importlib)."""
        for module in modules:
            self.submit(_import, module)

    def submit(self, write: Callable[..., None], *args: Any) -> None:
        """Queues ``write(*args)`` on the writer thread (from any thread: a wave is judged on a
        worker while the next one trains and logs its metrics); the arguments must not change
        afterwards."""
        self._record(self._pool, write, *args)

    def submit_file(self, write: Callable[..., None], *args: Any) -> None:
        """Queues ``write(*args)``, a write of a file no other write touches, on the file threads
        (unordered); as :meth:`submit` otherwise."""
        self._record(self._files, write, *args)

    def submit_plot(self, plot: Callable[..., None], *args: Any) -> None:
        """Queues ``plot(*args)``: in a plot process when there are any, else as :meth:`submit`.
        ``plot`` must be a module-level function and its arguments picklable."""
        if self._plots is not None:
            try:
                self._record(self._plots, plot, *args)
                return
            except BrokenProcessPool:  # a plot process died (killed, out of memory): drop them
                _discard_plot_pool(self._plots)
                self._plots = None
        self.submit(plot, *args)

    def _record(self, pool: Executor, write: Callable[..., None], *args: Any) -> None:
        """Queue ``write(*args)`` on ``pool`` and record its future, with Ctrl-C and SIGTERM held
        back until both are done: a stop handled inside the pool's start of a worker thread (CI
        met one, raised by that thread's first write) leaves a thread the pool's shutdown does
        not join, running a write whose future no wait sees."""
        from jdqn.run.rundir import interrupts_deferred  # here: plot processes need no JAX

        with interrupts_deferred():
            self._pending.append(pool.submit(write, *args))

    def __enter__(self) -> BackgroundWrites:
        return self

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        stopped = self.finish()
        if exc is not None:  # the block's own error takes precedence over a write's
            return
        if stopped is not None:
            raise stopped
        for future in self._pending:
            if (error := future.exception()) is not None:
                raise error

    def finish(self) -> KeyboardInterrupt | None:
        """Wait until every queued write has finished (again, if already waited for) and return
        the Ctrl-C or SIGTERM that arrived meanwhile, if any: left early, writes would go on into
        a directory the caller then removes (a write makes its parent directory again).

        Leaving the ``with`` block calls it, but a signal handled on ``__exit__``'s first line
        leaves before it, and Python cannot close that window: a caller that removes the
        directory on an error calls it first."""
        stopped: KeyboardInterrupt | None = None
        while True:
            try:
                self._wait()
                return stopped
            except KeyboardInterrupt as raised:  # in the wait: wait again, report it after
                stopped = stopped or raised

    def _wait(self) -> None:
        self._pool.shutdown(wait=True)
        self._files.shutdown(wait=True)
        wait(self._pending)  # the plot processes' share (they stay for the process's next run)


def _spare(cores: int, most: int) -> int:
    """Workers for a machine with ``cores`` usable cores: none below
    ``jdqn.run.background.MIN_CORES`` (they would compete with XLA's threads), else up to
    ``most`` while two cores stay for the caller and XLA."""
    from jdqn.run.background import MIN_CORES

    return 0 if cores < MIN_CORES else max(1, min(most, cores - 2))


def plot_processes(cores: int) -> int:
    """Plot processes for a machine with ``cores`` usable cores (:func:`_spare`)."""
    return _spare(cores, PLOT_PROCESSES)


# Plot processes at most: the main command draws six plots (two per fold).
PLOT_PROCESSES = 3


def file_threads(cores: int) -> int:
    """Threads for :meth:`BackgroundWrites.submit_file` on a machine with ``cores`` usable cores
    (:func:`_spare`, and at least the one)."""
    return max(1, _spare(cores, FILE_THREADS))


# File threads at most: a sweep's pass writes an equity CSV per run (1,536 at issue 46's grid).
FILE_THREADS = 8


# Plot process pools by (processes, preload), started by the first run that asks and kept for the
# Python process's later runs: shutting one down joins its processes, whose teardown would hold up
# the end of the run. They end with the Python process (see _start_plot_process).
_PLOT_POOLS: dict[tuple[int, tuple[str, ...]], ProcessPoolExecutor] = {}
_PLOT_POOLS_LOCK = threading.Lock()


def _plot_pool(processes: int, preload: tuple[str, ...]) -> ProcessPoolExecutor:
    with _PLOT_POOLS_LOCK:
        pool = _PLOT_POOLS.get((processes, preload))
        if pool is None:
            _start_resource_tracker_quietly()
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


# The -W option multiprocessing's resource tracker is started with (see below).
_TRACKER_QUIET = "ignore:resource_tracker:UserWarning"


def _start_resource_tracker_quietly() -> None:
    """Starts multiprocessing's resource tracker, unless running, without its leak warning. A
    plot pool's queues hold named semaphores; the `jdqn` command ends with ``os._exit``, which
    runs no finalizer, so the tracker unlinks them when the process has gone (its job) and
    would print "There appear to be 5 leaked semaphore objects" under the command's last line.
    Its command line copies ``sys.warnoptions``; the option is removed again at once."""
    from multiprocessing import resource_tracker

    sys.warnoptions.append(_TRACKER_QUIET)
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(_TRACKER_QUIET)


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


def read_equity_csv(path: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """What :func:`write_equity_csv` wrote: the ``timestamp`` column (datetime64[ns]) and each
    policy's cumulative net PnL in points, by policy name. Read with pyarrow (a sweep reads
    thousands of these; pandas with its timestamp parsing took 2.4 times as long)."""
    table = pa_csv.read_csv(path)
    stamps = table.column("timestamp").to_numpy().astype("datetime64[ns]")
    suffix = "_equity_points"
    curves = {
        name.removesuffix(suffix): table.column(name).to_numpy().astype(np.float64)
        for name in table.column_names
        if name.endswith(suffix)
    }
    return stamps, curves


def _length(curves: Mapping[str, np.ndarray]) -> int:
    lengths = {len(c) for c in curves.values()}
    if len(lengths) != 1:
        raise ValueError(f"equity curves differ in length: {sorted(lengths)}")
    return lengths.pop()


def _figure(figsize: tuple[float, float]) -> Figure:
    from matplotlib.figure import Figure  # here, not at the top: see PLOT_MODULES

    # Constrained layout fits the labels whatever their length: none is clipped.
    return Figure(figsize=figsize, layout="constrained")


def _thousands(axis: Any) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda value, _: number(value, ",.0f")))


def _equity_axes(ax: Any, title: str, xlabel: str) -> None:
    ax.axhline(0.0, color="grey", linewidth=0.5)
    ax.set_title(title)
    ax.set_ylabel(PNL_LABEL)
    ax.set_xlabel(xlabel)
    _thousands(ax.yaxis)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # beside: hides no line


def _save(fig: Figure, path: Path, dpi: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)


def plot_equity(
    path: Path,
    timestamps: np.ndarray,
    curves: Mapping[str, np.ndarray],
    title: str,
    point_value_usd: float,
    show_random: bool = False,
) -> None:
    """Equity (cumulative net PnL: ``curves`` in points, drawn in $) of the agent against the
    baselines (positional arguments: :meth:`BackgroundWrites.submit_plot` passes them on)."""
    # A fixed legend corner instead of loc="best", which searches over all the points again.
    fig = _figure(figsize=(10, 4.5))
    ax = fig.subplots()
    x = pd.to_datetime(timestamps[1 : _length(curves) + 1])  # PnL realised at bar t+1
    for name in shown(curves, show_random):
        width = 1.6 if name.startswith("agent") else 1.0
        ax.plot(x, curves[name] * point_value_usd, label=name, linewidth=width)
    _equity_axes(ax, title, "bar time (exchange clock)")
    fig.autofmt_xdate()
    _save(fig, path, dpi=100)


def plot_training(path: Path, rows: Sequence[Mapping[str, Any]], title: str) -> None:
    """Training curves from metrics points (``jdqn.run.metrics_log``: several per chunk):
    losses, Q, edge mass, grad norms against the learner step."""
    if not rows:
        return
    frame = pd.DataFrame(rows)
    fig = _figure(figsize=(9, 2.4 * len(TRAINING_CURVES)))
    axes = fig.subplots(len(TRAINING_CURVES), 1, sharex=True)
    for ax, (names, ylabel) in zip(axes, TRAINING_CURVES, strict=True):
        drawn = [name for name in names if name in frame]
        for name in drawn:
            # A point without a value (e.g. no step where the causal term was due) is left out,
            # so the line joins the points that have one.
            known = frame[name].notna()
            ax.plot(frame["step"][known], frame[name][known], label=name, linewidth=1.0)
        ax.set_ylabel(ylabel)
        if drawn:  # a panel whose metrics this run does not record has no legend
            ax.legend(loc="upper right", fontsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_title(title)
    axes[-1].set_xlabel("learner step")
    _save(fig, path, dpi=90)


def _fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else number(value, spec)


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


def summary_table(fold_results: Sequence[Mapping[str, Any]], show_random: bool = False) -> str:
    """Console table: one line per (fold, seed) with agent and baseline net PnL and Sharpe
    ("n/a": none, as the oracle on a user's bars)."""
    columns = [c for c in _BASELINE_COLUMNS if c[0] in shown([c[0]], show_random)]
    header = f"{'fold':>4} {'seed':>4}  {'status':<28} {'agent $':>10} {'Sh/day':>7} {'trades':>6} "
    header += "".join(f" {label:>{width}}" for _, label, width in columns)
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
                for name, _, width in columns
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


MIN_SEEDS_FOR_BAND = 5  # fewer seeds: each seed's curve, not a 10-90 % band of two or three


def plot_stitched(
    path: Path,
    realised_at: np.ndarray,
    seeds: Mapping[int, np.ndarray],
    baselines: Mapping[str, np.ndarray],
    fold_starts: Mapping[int, int],
    title: str,
) -> None:
    """The stitched out-of-sample equity in $: the seeds' median with their 10-90 % band (from
    :data:`MIN_SEEDS_FOR_BAND` seeds; fewer: each seed), the baselines, and a line where each
    fold's test window starts (``fold_starts``: fold -> bar index). Bars are plotted by their
    index (the windows' gaps closed), dates as ticks."""
    fig = _figure(figsize=(10, 4.5))
    ax = fig.subplots()
    x = np.arange(len(realised_at))
    curves = np.stack(list(seeds.values()))  # [S, n] $
    if len(seeds) >= MIN_SEEDS_FOR_BAND:
        low, high = np.percentile(curves, [10.0, 90.0], axis=0)
        ax.fill_between(x, low, high, alpha=0.25, label=f"agent, 10-90 % of {len(seeds)} seeds")
        ax.plot(x, np.median(curves, axis=0), linewidth=1.6, label="agent, median of seeds")
    else:
        for seed, curve in seeds.items():
            ax.plot(x, curve, linewidth=1.4, label=f"agent, seed {seed}")
    for name, curve in baselines.items():
        ax.plot(x, curve, linewidth=1.0, label=name)
    for fold, start in fold_starts.items():
        ax.axvline(start, color="black", linewidth=0.6, linestyle=":")
        ax.annotate(f"fold {fold}", (start, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(3, -12), textcoords="offset points", fontsize=8)  # fmt: skip
    ticks = np.linspace(0, max(len(x) - 1, 0), num=min(6, len(x))).astype(int)
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(realised_at[i])[:16] for i in ticks], fontsize=7)
    _equity_axes(ax, title, "bar time, test windows end to end (exchange clock)")
    _save(fig, path, dpi=100)


# Left out of "the best baseline": the oracle knows the planted model (synthetic bars only).
_NOT_CANDIDATES = ("oracle",)


def best_baselines(
    fold_results: Sequence[Mapping[str, Any]], show_random: bool = False
) -> dict[int, str]:
    """Per fold, the baseline with the highest median net $ across its seeds (the oracle and
    the hidden baselines left out)."""
    best = {}
    for fold in sorted({int(row["fold"]) for row in fold_results}):
        rows = [row for row in fold_results if int(row["fold"]) == fold]
        names = [n for n in shown(rows[0]["baselines"], show_random) if n not in _NOT_CANDIDATES]
        nets = {n: np.median([r["baselines"][n]["net_pnl_usd"] for r in rows]) for n in names}
        best[fold] = max(nets, key=nets.__getitem__)
    return best


def plot_summary(
    path: Path,
    fold_results: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    show_random: bool = False,
) -> None:
    """The run on one figure: per fold, the agent's median net $ across seeds with its 95 %
    bootstrap CI beside the fold's best baseline (:func:`best_baselines`), and the agent minus
    that baseline with its CI above them."""
    best = best_baselines(fold_results, show_random)
    fig = _figure(figsize=(max(6.0, 2.2 * len(best) + 2), 4.5))
    ax = fig.subplots()
    seeds = len({row["seed"] for row in fold_results})
    for i, (fold, name) in enumerate(best.items()):
        block = summary["folds"][str(fold)]
        agent, minus = block["agent"]["net_pnl_usd"], block["agent_minus"][name]["net_pnl_usd"]
        rows = [row for row in fold_results if int(row["fold"]) == fold]
        baseline = float(np.median([r["baselines"][name]["net_pnl_usd"] for r in rows]))
        ax.bar(i + 0.2, baseline, 0.4, color="tab:grey", label="best baseline" if i == 0 else None)
        ax.annotate(name, (i + 0.2, baseline), ha="center", va="bottom", fontsize=8)
        if agent["median"] is None:  # every seed of the fold halted
            ax.annotate("halted", (i - 0.2, 0.0), ha="center", va="bottom", fontsize=8)
            continue
        low, high = agent["median_ci"]
        error = [[agent["median"] - low], [high - agent["median"]]]
        label = "agent, median of seeds, 95 % CI" if i == 0 else None
        ax.bar(i - 0.2, agent["median"], 0.4, yerr=error, capsize=4, color="tab:blue", label=label)
        text = f"agent - {name}:\n{_estimate(minus, 'median', ',.0f').rstrip()}"
        ax.annotate(text, (i, 1.0), xycoords=("data", "axes fraction"), ha="center",
                    va="top", xytext=(0, -4), textcoords="offset points", fontsize=8)  # fmt: skip
    ax.set_xticks(range(len(best)), [f"fold {fold}" for fold in best])
    ax.axhline(0.0, color="grey", linewidth=0.5)
    ax.set_ylabel("net PnL over the test window ($, after costs)")
    _thousands(ax.yaxis)
    ax.margins(y=0.25)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_title(
        f"agent against each fold's best baseline ({seeds} seed(s); CIs: stratified bootstrap "
        "over seeds)",
        fontsize=10,
    )
    _save(fig, path, dpi=100)


# The summary's metrics as the table names them, with their number formats.
_SUMMARY_LABELS = {
    "net_pnl_usd": ("net $", ",.0f"),
    "sharpe_daily": ("Sharpe (daily, ann.)", ".2f"),
    "sharpe": ("Sharpe (per bar, ann.)", ".2f"),
    "max_drawdown_usd": ("max drawdown $", ",.0f"),
    "turnover": ("turnover, units traded", ",.0f"),
    "exposure": ("exposure (bars held)", ".0%"),
}


def _estimate(entry: Mapping[str, Any], key: str, spec: str) -> str:
    """``estimate [low, high]``, ``*`` after an interval from too few seeds, n/a if undefined."""
    if entry.get(key) is None:
        return "n/a"
    low, high = entry[f"{key}_ci"]
    flag = "*" if entry.get("few_seeds") else " "
    return f"{number(entry[key], spec)} [{number(low, spec)}, {number(high, spec)}]{flag}"


def summary_text(summary: Mapping[str, Any], show_random: bool = False) -> str:
    """Console table of results.json's ``summary``: per scope (all folds, then each fold) the
    agent's median and IQM with their 95 % intervals, the agent minus each baseline in net $,
    and the best seed's deflated Sharpe ratio. Turnover: position units traded per window."""
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
        for name in shown(block["agent_minus"], show_random):
            entry = block["agent_minus"][name]["net_pnl_usd"]
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
    writes: BackgroundWrites,
    *,
    point_value_usd: float,
    show_random: bool = False,
) -> None:
    """The folds' test windows end to end (``curves/stitched_equity.csv`` in points, its plot in
    $), queued on ``writes``: the seeds' median equity with their 10-90 % band, each seed's and
    each baseline's, for the seeds that trained every fold to its end (none: nothing is written)."""
    from jdqn.evaluation.stats import equity_band, stitch  # here: plot processes import report

    folds = sorted({s.fold for s in series})
    stitched = stitch(series, folds)
    if not stitched.seeds:
        return
    band = equity_band(stitched.agent)
    baselines = {name: np.cumsum(net) for name, net in stitched.baselines.items()}
    seeds = dict(zip(stitched.seeds, np.cumsum(stitched.agent, axis=-1), strict=True))
    at = stitched.realised_at
    writes.submit(
        write_stitched_csv, run_path / "curves" / "stitched_equity.csv", at, band, seeds, baselines
    )
    if plots:
        lengths = {s.fold: len(s.realised_at) for s in series if s.seed == stitched.seeds[0]}
        starts = dict(zip(folds, np.cumsum([0] + [lengths[f] for f in folds[:-1]]), strict=True))
        dollars = {seed: curve * point_value_usd for seed, curve in seeds.items()}
        drawn = {n: baselines[n] * point_value_usd for n in shown(baselines, show_random)}
        title = f"out-of-sample equity, {len(stitched.seeds)} seed(s), test windows end to end"
        path = run_path / "plots" / "stitched_equity.png"
        writes.submit_plot(plot_stitched, path, at, dollars, drawn, starts, title)


def write_judged(
    writes: BackgroundWrites,
    run_path: Path,
    judged: JudgedRun,
    timestamps: np.ndarray,
    what: str,
    cfg: Config,
    plots: bool,
) -> None:
    """A judged run's equity CSV (``curves/fold<f>_seed<s>_equity.csv``) and, with ``plots``,
    its plot titled ``fold <f> seed <s>: <what>``, queued on ``writes``."""
    fold, seed = judged.series.fold, judged.series.seed
    stem = f"fold{fold}_seed{seed}"
    csv_path = run_path / "curves" / f"{stem}_equity.csv"
    writes.submit_file(write_equity_csv, csv_path, timestamps, judged.curves, judged.held)
    if plots:
        title = f"fold {fold} seed {seed}: {what}"
        png = run_path / "plots" / f"{stem}_equity.png"
        dollars, show_random = cfg.env.point_value_usd, cfg.output.show_random
        writes.submit_plot(plot_equity, png, timestamps, judged.curves, title, dollars, show_random)


def write_summary(
    writes: BackgroundWrites,
    run_path: Path,
    rows: Sequence[Mapping[str, Any]],
    series: Sequence[RunSeries],
    cfg: Config,
    plots: bool,
) -> dict[str, Any]:
    """results.json's summary of the judged ``rows`` (``stats.summarise``), with the stitched
    equity (:func:`write_stitched`) and, with ``plots``, the summary figure queued on ``writes``."""
    from jdqn.evaluation.stats import summarise  # here: the plot processes import this module

    tried = cfg.output.settings_tried
    summary = summarise(rows, series, seed=cfg.train.seed, settings_tried=tried)
    show_random, dollars = cfg.output.show_random, cfg.env.point_value_usd
    write_stitched(
        run_path, series, plots, writes, point_value_usd=dollars, show_random=show_random
    )
    if plots:
        png = run_path / "plots" / "summary.png"
        writes.submit_plot(plot_summary, png, rows, summary, show_random)
    return summary


def results_record(
    cfg: Config, source: str, bars_per_year: float, rows: list[Any], summary: Any, **more: Any
) -> dict[str, Any]:
    """results.json of a walk-forward run, a sweep or an evaluation: the config, the bars' source
    and bars per year, the result rows and their summary, the JAX version and backend; ``more``."""
    import jax  # here: the plot processes import this module

    return {
        "config": json.loads(cfg.to_json()),  # lists, as read back from results.json
        "source": source,
        "bars_per_year": bars_per_year,
        "folds": rows,
        "summary": summary,
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        **more,
    }
