"""report: BackgroundWrites (writes happen in order, all before the block ends, errors surface;
plot processes draw the thread's files) and the equity CSV (exact round trip)."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from child import run_child

from jdqn.run import report
from jdqn.run.report import BackgroundWrites
from jdqn.run.termination import Terminated


def test_writes_run_in_order_on_a_worker_and_finish_with_the_block():
    done: list[tuple[int, str]] = []
    with BackgroundWrites() as writes:
        for i in range(20):
            writes.submit(lambda i: done.append((i, threading.current_thread().name)), i)
    assert [i for i, _ in done] == list(range(20))
    assert all(name.startswith("jdqn-writes") for _, name in done)


def test_a_failed_write_is_raised_when_the_block_ends():
    done = []

    def fail():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"), BackgroundWrites() as writes:
        writes.submit(fail)
        writes.submit(done.append, "after")  # later writes still run
    assert done == ["after"]


def test_file_writes_run_on_their_threads_all_finish_with_the_block_and_raise(tmp_path):
    stamps = np.arange(np.datetime64("2024-01-02T14:30"), np.datetime64("2024-01-02T16:31"))
    curves = {f"p{k}": np.cumsum(np.random.default_rng(k).normal(size=120)) for k in range(3)}
    held = {name: np.sign(curve) for name, curve in curves.items()}
    names: set[str] = set()
    with BackgroundWrites(file_threads=4) as writes:
        for k in range(24):  # as a sweep's runs' equity CSVs: each file its own
            path = tmp_path / f"r{k}.csv"
            writes.submit_file(report.write_equity_csv, path, stamps, curves, held)
            writes.submit_file(lambda: names.add(threading.current_thread().name))
    assert all(name.startswith("jdqn-files") for name in names)
    one = tmp_path / "one.csv"
    with BackgroundWrites() as writes:
        writes.submit(report.write_equity_csv, one, stamps, curves, held)
    assert all((tmp_path / f"r{k}.csv").read_bytes() == one.read_bytes() for k in range(24))

    def fail():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"), BackgroundWrites(file_threads=2) as writes:
        writes.submit_file(fail)


def test_file_threads_leave_two_cores_and_a_small_machine_one_thread():
    assert report.file_threads(2) == 1
    assert report.file_threads(4) == 2
    assert report.file_threads(64) == report.FILE_THREADS


def test_the_blocks_own_error_wins_and_queued_writes_still_finish():
    done = []
    started = threading.Event()

    def slow():
        started.wait(5)
        done.append("slow")

    def fail():
        raise OSError("not the error the caller sees")

    with pytest.raises(KeyboardInterrupt), BackgroundWrites() as writes:
        writes.submit(slow)
        writes.submit(fail)
        started.set()
        raise KeyboardInterrupt
    assert done == ["slow"]


def test_a_signal_raised_while_the_block_ends_waits_for_every_write_then_is_raised():
    """SIGTERM raised by a write (as in `jdqn evaluate`'s case EV-T) while the block's end waited
    for the writer thread was handled after that wait and left ``__exit__`` before the file
    threads' wait: a file went on being written into a directory the caller was removing (CI,
    2026-12-06)."""
    done = []
    queued = threading.Event()

    def terminated(_number, _frame):
        raise Terminated

    def slow_file():
        time.sleep(0.5)
        done.append("file")

    def signalled():
        queued.wait(5)
        time.sleep(0.1)  # the caller is in the block's end by now
        signal.raise_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        with pytest.raises(Terminated), BackgroundWrites() as writes:
            writes.submit_file(slow_file)
            writes.submit(signalled)
            writes.submit(done.append, "after")
            queued.set()
        assert done == ["after", "file"]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_finish_waits_for_writes_a_stop_on_the_first_line_of_exit_left_running():
    """A signal handled on ``__exit__``'s first line leaves it before any wait (CI, 2026-12-06:
    an ``eval-*.incomplete`` made again by a plot written after its removal); the caller's
    clean-up waits with ``finish``, which returns the stop that arrived meanwhile."""
    done = []

    def slow():
        time.sleep(0.3)
        done.append("slow")

    writes = BackgroundWrites()
    writes.submit(slow)
    writes.submit_file(slow)
    assert done == []  # the block was left without waiting
    assert writes.finish() is None
    assert done == ["slow", "slow"]
    assert writes.finish() is None  # again: nothing left to wait for


def _write_pid(path):  # module level, so that a plot process can unpickle it
    path.write_text(str(os.getpid()))


def _failing_plot():
    raise OSError("plot: disk full")


@pytest.mark.parametrize(("cores", "processes"), [(1, 0), (2, 0), (3, 0), (4, 2), (5, 3), (16, 3)])
def test_plot_processes_only_where_cores_are_spare(cores, processes):
    assert report.plot_processes(cores) == processes


@pytest.mark.slow
def test_plot_processes_draw_the_files_the_writer_thread_draws(tmp_path):
    names = [name for panel in report.TRAINING_CURVES for name in panel]
    rows = [
        {"step": 100 * i, **{n: 1.0 / (i + j + 1) for j, n in enumerate(names)}} for i in range(4)
    ]
    rows[1]["loss_causal"] = None  # a chunk without a step where the causal term was due
    stamps = np.datetime64("2013-09-03T09:30") + np.arange(301).astype("timedelta64[m]")
    rng = np.random.default_rng(0)
    curves = {"agent": np.cumsum(rng.normal(size=300)), "flat": np.zeros(300)}

    def draw(writes, directory):
        writes.submit_plot(report.plot_training, directory / "training.png", rows, "training")
        writes.submit_plot(report.plot_equity, directory / "equity.png", stamps, curves, "eq", 50.0)

    with BackgroundWrites(report.PLOT_MODULES) as writes:
        draw(writes, tmp_path / "thread")
    with BackgroundWrites(report.PLOT_MODULES, plot_processes=2) as writes:
        draw(writes, tmp_path / "processes")
        writes.submit_plot(_write_pid, tmp_path / "pid")
    assert int((tmp_path / "pid").read_text()) != os.getpid()
    for name in ("training.png", "equity.png"):
        drawn = (tmp_path / "processes" / name).read_bytes()
        assert drawn == (tmp_path / "thread" / name).read_bytes(), name


@pytest.mark.slow
def test_a_plot_process_imports_no_jax():
    """What a plot process imports (``jdqn.run.report`` and the plotting library) leaves JAX out,
    so the processes are ready before training ends; the package's learner names still load
    on first use."""
    code = (
        "import sys, jdqn.run.report, matplotlib.figure\n"
        "print('jax' in sys.modules, 'flax' in sys.modules)\n"
        "from jdqn import make_learner\n"
        "print(make_learner.__module__)\n"
    )
    done = run_child(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "jdqn.agent.step"]


@pytest.mark.slow
def test_plot_processes_serve_the_later_runs_of_a_python_process(tmp_path):
    """Started once, kept: a later run's plots skip the start-up, and a run's end does not wait
    for the processes to exit (it did: 0.2 s, run V4)."""
    pids = []
    for run in range(2):
        with BackgroundWrites(plot_processes=1) as writes:
            writes.submit_plot(_write_pid, tmp_path / f"pid{run}")
        pids.append(int((tmp_path / f"pid{run}").read_text()))
    assert pids[0] == pids[1] != os.getpid()


def _ended(pid: int) -> bool:
    """The process is gone or a zombie (ended, not yet reaped by whoever adopted it)."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) in "ZX"
    except FileNotFoundError:
        return True


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_plot_processes_end_with_a_parent_that_leaves_abruptly(tmp_path):
    """The `jdqn` command ends with os._exit, which sends the pool no stop signal: the plot
    processes notice their parent is gone and end instead of waiting for work forever, and
    multiprocessing's resource tracker unlinks the pool's semaphores without a warning under
    the command's last line."""
    script = tmp_path / "leave.py"
    script.write_text(
        "import os, sys\n"
        "from pathlib import Path\n"
        "from jdqn.run import report\n"
        "def write_pid(path):\n"
        "    Path(path).write_text(str(os.getpid()))\n"
        "if __name__ == '__main__':\n"
        "    with report.BackgroundWrites(plot_processes=1) as writes:\n"
        "        writes.submit_plot(write_pid, sys.argv[1])\n"
        "    os._exit(0)\n"
    )
    pid_file = tmp_path / "pid"
    # A script's own directory leads sys.path, not the working directory: point it at jdqn.
    root = str(Path(report.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    ended = subprocess.run(
        [sys.executable, str(script), str(pid_file)],
        check=True, timeout=120, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert ended.stderr == ""  # read to its end: the tracker and the plot process have closed it
    pid = int(pid_file.read_text())
    deadline = time.time() + 20
    while not _ended(pid) and time.time() < deadline:
        time.sleep(0.1)
    assert _ended(pid)


def _die():
    os._exit(1)


@pytest.mark.slow
def test_after_a_plot_process_dies_the_plots_go_to_the_writer_thread(tmp_path):
    """A plot process that dies (killed, out of memory) fails its own plot, which the block
    raises at its end like any failed write; the run's later plots are drawn on the writer
    thread, and the next run starts new processes."""
    preload = ("json",)  # a pool of its own: the other tests' pools stay whole
    with pytest.raises(BrokenProcessPool), BackgroundWrites(preload, plot_processes=1) as writes:
        writes.submit_plot(_die)
        assert isinstance(writes._pending[-1].exception(timeout=60), BrokenProcessPool)
        writes.submit_plot(_write_pid, tmp_path / "pid")
    assert int((tmp_path / "pid").read_text()) == os.getpid()
    with BackgroundWrites(preload, plot_processes=1) as writes:
        writes.submit_plot(_write_pid, tmp_path / "pid2")
    assert int((tmp_path / "pid2").read_text()) != os.getpid()


def test_a_failed_plot_in_a_process_is_raised_when_the_block_ends():
    with pytest.raises(OSError, match="disk full"), BackgroundWrites(plot_processes=1) as writes:
        writes.submit_plot(_failing_plot)


def test_equity_csv_round_trips_exactly_with_rows_at_the_realising_bar(tmp_path) -> None:
    n = 500
    stamps = np.datetime64("2013-09-03T09:30") + np.arange(n + 1).astype("timedelta64[m]")
    rng = np.random.default_rng(0)
    curves = {"agent": np.cumsum(rng.normal(size=n)) * 1e3, "flat": np.zeros(n)}
    held = {"agent": rng.choice([-1.0, 0.0, 1.0], size=n)}
    path = tmp_path / "curves" / "fold0.csv"
    report.write_equity_csv(path, stamps, curves, held)

    header, first = path.read_text().splitlines()[:2]
    assert header == "timestamp,agent_equity_points,flat_equity_points,agent_position"
    assert first.startswith("2013-09-03 09:31:00,")  # bar t+1, whole seconds without fraction
    back = pd.read_csv(path, parse_dates=["timestamp"])
    assert len(back) == n
    # The numbers through Python's float(), which rounds correctly: pandas 3.0.6's default
    # parser (on the H200's image) did not give back every float the file holds exactly.
    fields = [line.split(",") for line in path.read_text().splitlines()[1:]]
    np.testing.assert_array_equal([float(f[1]) for f in fields], curves["agent"])
    np.testing.assert_array_equal([float(f[3]) for f in fields], held["agent"])
    np.testing.assert_array_equal(
        back["timestamp"].to_numpy().astype("datetime64[s]"), stamps[1:].astype("datetime64[s]")
    )
    with pytest.raises(ValueError, match="differ in length"):
        report.write_equity_csv(path, stamps, {"a": np.zeros(3), "b": np.zeros(4)}, {})


@pytest.mark.slow
def test_the_plotting_library_is_imported_only_for_plots_and_off_the_main_thread():
    """``import jdqn.run.walkforward`` leaves matplotlib out (runs without plots never pay its
    import); ``BackgroundWrites(PLOT_MODULES)`` imports it on the writer thread."""
    code = (
        "import sys, threading, jdqn.run.walkforward\n"
        "from jdqn.run import report\n"
        "before = 'matplotlib' in sys.modules\n"
        "main = threading.get_ident()\n"
        "with report.BackgroundWrites(report.PLOT_MODULES) as writes:\n"
        "    writes.submit(lambda: print(threading.get_ident() != main))\n"
        "print(before, 'matplotlib.figure' in sys.modules)\n"
    )
    done = run_child(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "True"]


# ---------------------------------------------------------------------------------------------
# What a quant reads: $ with thousands separators, no "-0", random left out unless asked for


def test_numbers_that_round_to_zero_print_without_a_sign():
    assert [report.number(v, ",.0f") for v in (-0.4, -0.0, 0.3, -1.5, -1234.6)] == [
        "0",
        "0",
        "0",
        "-2",
        "-1,235",
    ]
    assert report.number(-0.004, ".2f") == "0.00" and report.number(-0.006, ".2f") == "-0.01"


def _rows() -> list[dict]:
    """Two folds x two seeds; fold 0's best baseline is momentum, fold 1's flat (the oracle,
    though higher, knows the planted model, and random is hidden)."""
    nets = {0: {"flat": 0, "random": 9e9, "momentum": 300, "oracle": 1e6}, 1: {"flat": 0}}
    nets[1] |= {"random": 9e9, "momentum": -50, "oracle": 1e6}
    rows = []
    for fold, seed in ((0, 0), (0, 1), (1, 0), (1, 1)):
        baselines = {name: {"net_pnl_usd": float(v)} for name, v in nets[fold].items()}
        agent = {"net_pnl_usd": -1e-9, "sharpe": None, "n_trades": 3}
        rows.append({"fold": fold, "seed": seed, "agent": agent, "baselines": baselines})
    return rows


def test_tables_print_zero_and_n_a_and_leave_random_out_unless_asked():
    table = report.summary_table(_rows())
    assert "random" not in table and " n/a " in table and "-0" not in table
    assert "random $" in report.summary_table(_rows(), show_random=True)
    entry = {"median": -1e-9, "median_ci": [-0.2, 0.0], "iqm": None, "iqm_ci": None}
    block = {
        "agent": dict.fromkeys(["net_pnl_usd", "sharpe", "sharpe_daily", "turnover"], entry)
        | {"max_drawdown_usd": entry, "exposure": entry},
        "agent_minus": {"random": {"net_pnl_usd": entry}, "ridge": {"net_pnl_usd": entry}},
        "deflated_sharpe": {"dsr": None},
        "n_halted": 0,
    }
    text = report.summary_text({"overall": block, "folds": {"0": block}})
    assert "agent - ridge $" in text and "agent - random" not in text
    assert "0 [0, 0]" in text and not re.search(r"-0(?![.\d])", text) and "n/a" in text
    assert "turnover, units traded" in text
    assert "agent - random $" in report.summary_text({"overall": block, "folds": {}}, True)


def test_the_best_baseline_per_fold_by_hand():
    assert report.best_baselines(_rows()) == {0: "momentum", 1: "flat"}
    assert report.best_baselines(_rows(), show_random=True) == {0: "random", 1: "random"}


def _figures(monkeypatch) -> list:
    drawn: list = []
    monkeypatch.setattr(report, "_save", lambda fig, path, dpi: drawn.append(fig))
    return drawn


def _series(seeds: int) -> list:
    from jdqn.evaluation.stats import RunSeries

    rng = np.random.default_rng(0)
    start = np.datetime64("2021-01-04T00:00", "ns")
    series = []
    for fold in range(3):
        at = start + np.arange(fold * 500, fold * 500 + 400) * np.timedelta64(1, "m")
        baselines = {"flat": np.zeros(400), "random": np.full(400, -3.0)}
        series += [RunSeries(fold, s, rng.normal(0, 1, 400), baselines, at) for s in range(seeds)]
    return series


@pytest.mark.parametrize(("seeds", "band"), [(4, False), (5, True)])
def test_the_stitched_plot_in_dollars_with_fold_lines_and_a_band_only_from_5_seeds(
    tmp_path, monkeypatch, seeds, band
):
    drawn = _figures(monkeypatch)
    with report.BackgroundWrites() as writes:
        report.write_stitched(tmp_path, _series(seeds), True, writes, point_value_usd=50.0)
    ((ax,),) = [fig.axes for fig in drawn]
    assert ax.get_ylabel() == "net PnL ($, after costs)" and ax.get_xlabel()
    assert ax.yaxis.get_major_formatter()(-12345.0, 0) == "-12,345"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "random" not in labels and "flat" in labels
    assert (f"agent, 10-90 % of {seeds} seeds" in labels) == band
    assert (f"agent, seed {seeds - 1}" in labels) == (not band)
    fold_lines = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert [line.get_xdata()[0] for line in fold_lines] == [0, 400, 800]  # test windows' starts
    if not band:  # each seed's curve in $: 50 x its cumulative points
        (seed0,) = [line for line in ax.get_lines() if line.get_label() == "agent, seed 0"]
        expected = 50 * np.cumsum(np.concatenate([s.agent for s in _series(seeds) if s.seed == 0]))
        np.testing.assert_allclose(seed0.get_ydata(), expected)


def test_equity_and_summary_plots_label_their_axes(tmp_path, monkeypatch):
    drawn = _figures(monkeypatch)
    stamps = np.arange(np.datetime64("2021-01-04T00:00"), np.datetime64("2021-01-04T00:05"))
    curves = {"agent": np.arange(4.0), "random": np.zeros(4), "flat": np.zeros(4)}
    report.plot_equity(tmp_path / "e.png", stamps, curves, "equity", 50.0)
    rows = _rows()
    entry = {"median": 10.0, "median_ci": [5.0, 20.0]}
    block = {"agent": {"net_pnl_usd": entry}, "agent_minus": {"momentum": {"net_pnl_usd": entry}}}
    block["agent_minus"]["flat"] = block["agent_minus"]["momentum"]
    report.plot_summary(tmp_path / "s.png", rows, {"folds": {"0": block, "1": block}})
    equity, summary = (fig.axes[0] for fig in drawn)
    assert [line.get_label() for line in equity.get_lines()[:2]] == ["agent", "flat"]
    np.testing.assert_allclose(equity.get_lines()[0].get_ydata(), 50 * np.arange(4.0))
    assert equity.get_ylabel() == "net PnL ($, after costs)" and equity.get_xlabel()
    texts = [t.get_text() for t in summary.texts]
    assert "agent - momentum:\n10 [5, 20]" in texts and "agent - flat:\n10 [5, 20]" in texts
    assert summary.get_ylabel().startswith("net PnL") and summary.get_title()
