"""CLI error paths: one line naming the problem and the fix, exit 2, no traceback, no run dir."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time

import pytest
from child import run_child
from es_sample import ES_FOLDS, ES_SAMPLE
from malformed_bars import MALFORMED_CASES
from smoke import SMOKE

from jdqn.cli import EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USER_ERROR, main


def _assert_one_line_error(err: str, expected: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("jdqn: error: "), err
    assert expected.lower() in lines[0].lower(), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("case", "content", "expected"), MALFORMED_CASES, ids=[c[0] for c in MALFORMED_CASES]
)
def test_malformed_bar_file_is_one_line_exit_2_and_no_run_dir(
    tmp_path, capsys, case, content, expected
):
    path = tmp_path / f"{case}.csv"
    path.write_text(content)
    out = tmp_path / "runs"
    code = main([*SMOKE, "--data", str(path), "--out", str(out), "--no-progress"])
    assert code == EXIT_USER_ERROR
    _assert_one_line_error(capsys.readouterr().err, expected)
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([*SMOKE, "--data", "/no/such/file.csv"], "no such file"),
        ([*SMOKE, "--set", "network.v_min=999"], "network.v_min"),
        ([*SMOKE, "--set", "train.bogus=1"], "valid keys of train"),
        ([*SMOKE, "--set", "nonsense"], "section.field=value"),
        ([*SMOKE, "--folds", "0"], "walkforward.n_folds"),
        (["walkforward", "--profile", "huge"], "invalid choice"),
        ([*SMOKE, "--data", str(ES_SAMPLE)], "fix"),  # default folds do not fit 2,264 bars
        (["walkforward", "--resume", "/no/such/run"], "no such directory"),
        (["walkforward", "--resume", "/no/such/run", "--epochs", "3"], "drop --data"),
        ([*SMOKE, "--set", "train.n_slices=300"], "replay.capacity"),
        (["data", "synth", "--bars", "10", "--out", "x.csv"], "--bars"),
        (["data", "check", "/no/such/file.csv"], "does not exist"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_user_errors_are_one_line_exit_2(tmp_path, capsys, argv, expected):
    out = tmp_path / "runs"
    if argv[0] == "walkforward":
        argv = [*argv, "--no-progress"] + ([] if "--resume" in argv else ["--out", str(out)])
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse errors exit through SystemExit
        code = stop.code
    assert code == EXIT_USER_ERROR
    _assert_one_line_error(capsys.readouterr().err, expected)
    assert not out.exists() or not any(out.iterdir())


def test_folds_that_do_not_fit_say_what_to_change(capsys, tmp_path):
    code = main([*SMOKE, "--data", str(ES_SAMPLE), "--out", str(tmp_path), "--no-progress"])
    assert code == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "2,264" in err or "2264" in err
    assert "walkforward.train_bars" in err


@pytest.mark.slow
def test_subprocess_exit_code_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,open,high,low,close\n2024-01-02 09:30:00,1,2,0.5,nan\n")
    result = subprocess.run(
        [sys.executable, "-m", "jdqn", *SMOKE, "--data", str(bad), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == EXIT_USER_ERROR
    _assert_one_line_error(result.stderr, "close")
    assert not list(tmp_path.glob("run-*"))


def test_data_synth_then_check_round_trip(tmp_path, capsys):
    path = tmp_path / "bars.parquet"
    assert main(["data", "synth", "--bars", "2000", "--seed", "3", "--out", str(path)]) == 0
    assert main(["data", "check", str(path)]) == 0
    assert "2,000 valid bars" in capsys.readouterr().out


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("jdqn.run.walkforward.run_walkforward", interrupted)
    assert main(["walkforward", "--no-progress"]) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert err == "jdqn: interrupted\n"


@pytest.mark.slow
def test_ctrl_c_during_a_run_leaves_no_directory_and_no_traceback(tmp_path):
    """A real SIGINT to `jdqn walkforward` once its run directory exists (it is compiling or
    training; no checkpoint is ever written here): exit 130, one line, nothing left behind."""
    out = tmp_path / "runs"
    args = [
        *SMOKE, "--data", str(ES_SAMPLE), "--no-progress",
        *[arg for item in ES_FOLDS for arg in ("--set", item)],
        "--set", "output.checkpoints=false", "--out", str(out),
    ]  # fmt: skip
    # Python turns SIGINT into KeyboardInterrupt unless it starts with SIGINT ignored (as
    # background jobs of a non-interactive shell do): the child installs the handler itself.
    # SIGUSR1 prints every thread's stack: what a child that never ends was waiting for.
    child = (
        "import faulthandler, runpy, signal, sys; signal.signal(signal.SIGINT, "
        "signal.default_int_handler); faulthandler.register(signal.SIGUSR1, all_threads=True); "
        f"sys.argv = ['jdqn', *{args!r}]; runpy.run_module('jdqn', run_name='__main__')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 300
    while time.time() < deadline and not list(out.glob("*.incomplete")):
        time.sleep(0.05)
    # Again every 2 s, as a user would: Python drops a KeyboardInterrupt raised inside a garbage
    # collector callback (JAX registers one), printing "Exception ignored in ...".
    while proc.poll() is None and time.time() < deadline:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
    if proc.poll() is None:  # CI once saw every Ctrl-C absorbed by a deadlock (cb86698)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the command did not end after 300 s of Ctrl-Cs; its threads:\n{err}")
    _, err = proc.communicate()
    assert proc.returncode == EXIT_INTERRUPTED, err[-2000:]
    lines = err.splitlines()
    uncaught = [
        i
        for i, line in enumerate(lines)
        if line.startswith("Traceback") and not (i and lines[i - 1].startswith("Exception ignored"))
    ]
    assert not uncaught, err[-2000:]
    assert lines[-1] == "jdqn: interrupted"
    assert not list(out.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("second_ctrl_c", [False, True])
def test_an_interrupted_command_ends_at_once_with_130(second_ctrl_c):
    """After a handled Ctrl-C the process ends without the interpreter's teardown, where another
    Ctrl-C killed it by the signal (CI saw exit -2 after "jdqn: interrupted"): no exit handler
    runs. A Ctrl-C that escapes main's own handler ends the same way, without a traceback."""
    interrupted = (
        "def interrupted(argv=None, ending=False):\n    raise KeyboardInterrupt\n"
        if second_ctrl_c
        else "def interrupted(argv=None, ending=False):\n    return cli.EXIT_INTERRUPTED\n"
    )
    child = (
        "import atexit, sys\n"
        "from jdqn import cli\n"
        f"{interrupted}"
        "cli.main = interrupted\n"
        "atexit.register(lambda: print('exit handler ran'))\n"
        "sys.exit(cli.console())\n"
    )
    done = run_child(child)
    assert done.returncode == EXIT_INTERRUPTED, done.stderr
    assert "Traceback" not in done.stderr and "exit handler ran" not in done.stdout
    assert done.stderr.count("jdqn: interrupted") == int(second_ctrl_c)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "code"),
    [(["data", "check", str(ES_SAMPLE)], 0), (["data", "check", "no/such/bars.csv"], 2)],
)
def test_a_finished_command_skips_the_interpreter_teardown(argv, code):
    """A finished command's output, or a one-line error's line, arrives whole through a pipe and
    its status is kept, and the process ends without running exit handlers (the interpreter's
    teardown cost a warm run on the H200 ~0.7 s, and library threads printed tracebacks in it
    under an error's one line)."""
    child = (
        "import atexit, sys\n"
        "from jdqn import cli\n"
        "atexit.register(lambda: print('exit handler ran'))\n"
        f"sys.argv = ['jdqn', *{argv!r}]\n"
        "sys.exit(cli.console())\n"
    )
    done = run_child(child)
    assert done.returncode == code, done.stderr
    if code == 0:
        assert ": 2,264 valid bars, 2013-09-01T17:00:00.000000000 .. " in done.stdout
        assert done.stdout.endswith(
            ": gaps within trading days: 36 (longest 3 min after 2013-09-01T23:57:00)\n"
        )
    else:
        _assert_one_line_error(done.stderr, "no/such/bars.csv")
    assert "exit handler ran" not in done.stdout


@pytest.mark.slow
def test_ending_the_process_survives_a_stream_that_cannot_be_flushed():
    """A reader that went away (`jdqn ... | head`) leaves an unflushable stdout: the command's
    status stands, with no traceback."""
    child = (
        "import io, sys\n"
        "from jdqn import cli\n"
        "print('pending', end='')\n"
        "sys.stdout = io.StringIO()\n"
        "sys.stdout.close()\n"
        "cli.end_process(3)\n"
    )
    done = run_child(child)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow
def test_a_sigterm_while_the_command_imports_is_one_line_and_143():
    """Item 15: before the run installed its handling, a SIGTERM (here during the imports of
    `jdqn walkforward`) killed the process by the signal, with no message."""
    child = (
        "import os, signal, sys\n"
        "from jdqn import cli\n"
        "def importing(args):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    import jdqn.run.walkforward\n"
        "    return 0\n"
        "cli._walkforward = importing\n"
        "sys.argv = ['jdqn', 'walkforward']\n"
        "sys.exit(cli.console())\n"
    )
    done = run_child(child)
    assert done.returncode == EXIT_TERMINATED and done.stderr == "jdqn: terminated\n", done.stderr


# The command's modules load with the signal sent once `jdqn.cli` starts loading: `before` is
# the SIGINT handler the process starts with (a background job's is SIG_IGN).
_SIGNAL_WHILE_LOADING = """
import builtins, os, signal, sys
signal.signal(signal.SIGINT, {before})
import jdqn.__main__ as entry
load = builtins.__import__
def sending(name, *args, **kwargs):
    if name == "jdqn.cli":
        builtins.__import__ = load
        os.kill(os.getpid(), signal.{signal})
    return load(name, *args, **kwargs)
builtins.__import__ = sending
sys.argv = ["jdqn", "config", "keys"]
entry.run()
"""


@pytest.mark.parametrize(
    ("sent", "before", "code", "line"),
    [
        ("SIGTERM", "signal.default_int_handler", EXIT_TERMINATED, "jdqn: terminated"),
        ("SIGINT", "signal.default_int_handler", EXIT_INTERRUPTED, "jdqn: interrupted"),
        ("SIGINT", "signal.SIG_IGN", 0, None),
    ],
)
def test_a_signal_while_the_command_loads_gets_its_line_and_status(sent, before, code, line):
    """SIGTERM or Ctrl-C while `jdqn`'s modules load (before the run's handlers exist) ends with
    the command's own line and status, no traceback; an ignored SIGINT stays ignored."""
    child = _SIGNAL_WHILE_LOADING.format(signal=sent, before=before)
    proc = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == code, proc.stderr[-2000:]
    if line is None:
        assert "optim.learning_rate" in proc.stdout
    else:
        assert proc.stderr == f"{line}\n" and proc.stdout == ""
