"""Run directories: a Ctrl-C while one is made or removed leaves nothing behind."""

from __future__ import annotations

import shutil
import signal
import threading

import pytest

from jdqn import rundir, walkforward
from jdqn.config import SMOKETEST, apply_overrides


@pytest.fixture(autouse=True)
def _ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt, as in a terminal: pytest started as a background job of a
    non-interactive shell (as CI may start it) begins with SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_inside_the_block_arrives_once_the_block_is_done():
    done = []
    with pytest.raises(KeyboardInterrupt), rundir.interrupts_deferred():
        signal.raise_signal(signal.SIGINT)
        done.append("after the signal")
    assert done == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_ctrl_c_the_block_ends_quietly_and_the_handler_is_back():
    with rundir.interrupts_deferred():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_off_the_main_thread_nothing_is_changed():
    seen = []

    def worker():
        with rundir.interrupts_deferred():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


def _cfg(tmp_path):
    return apply_overrides(SMOKETEST, [f"output.out_dir={tmp_path / 'runs'}"])


def test_a_ctrl_c_as_the_directory_is_made_removes_it(tmp_path, monkeypatch):
    made = rundir.new_run_dir

    def interrupted_mkdir(*args, **kwargs):
        run = made(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # between mkdir and anything that could clean up
        return run

    monkeypatch.setattr(rundir, "new_run_dir", interrupted_mkdir)
    with pytest.raises(KeyboardInterrupt):
        walkforward.run_walkforward(_cfg(tmp_path), progress=False, log=lambda _: None)
    assert not list((tmp_path / "runs").iterdir())


def test_a_second_ctrl_c_during_the_clean_up_does_not_stop_it(tmp_path, monkeypatch):
    """The CI failure: the first Ctrl-C's clean-up was itself interrupted."""

    def first_ctrl_c(*_args, **_kwargs):
        raise KeyboardInterrupt

    remove = shutil.rmtree

    def interrupted_rmtree(path, *args, **kwargs):
        signal.raise_signal(signal.SIGINT)
        remove(path, *args, **kwargs)

    monkeypatch.setattr(walkforward, "_run_all_folds", first_ctrl_c)
    monkeypatch.setattr(rundir.shutil, "rmtree", interrupted_rmtree)
    with pytest.raises(KeyboardInterrupt):
        walkforward.run_walkforward(_cfg(tmp_path), progress=False, log=lambda _: None)
    assert not list((tmp_path / "runs").iterdir())
