"""Run directories: a Ctrl-C while one is made or removed leaves nothing behind."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import threading

import pytest
from smoke import SMOKE

from jdqn.cli import EXIT_USER_ERROR, main
from jdqn.config import SMOKETEST, apply_overrides
from jdqn.run import rundir, walkforward


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


# --- names, locks and atomic creation ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("../escape", "single path component"),
        ("/abs/path", "single path component"),
        ("a/b", "single path component"),
        ("x.incomplete", "ends with .incomplete"),
        (".hidden", "starts with a dot"),
        ("..", "starts with a dot"),
        ("", "is empty"),
    ],
)
def test_a_run_name_is_one_plain_path_component(tmp_path, capsys, name, problem):
    with pytest.raises(ValueError, match=problem):
        rundir.check_name(name)
    out = tmp_path / "runs"
    code = main([*SMOKE, "--name", name, "--out", str(out), "--no-progress"])
    assert code == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("jdqn: error: --name") and problem in err
    assert list(tmp_path.iterdir()) == []  # nothing beside --out either


def test_names_that_are_taken_get_the_next_free_suffix_and_the_directory_is_locked(tmp_path):
    first = rundir.new_run_dir(tmp_path, "r")
    (tmp_path / "r-1").mkdir()  # a complete run of the next name
    second = rundir.new_run_dir(tmp_path, "r")
    assert (first.path.name, second.path.name) == ("r.incomplete", "r-2.incomplete")
    with pytest.raises(ValueError, match=r"in use by another jdqn process \(pid \d+\)"):
        rundir.open_incomplete_run_dir(first.path)
    rundir.unlock(first)
    reopened = rundir.open_incomplete_run_dir(first.path)
    assert reopened.final_path == tmp_path / "r"
    assert rundir.finalize(reopened) == tmp_path / "r"
    assert not (tmp_path / "r" / rundir.LOCK_FILE).exists()
    rundir.discard(second)


_CREATE_MANY = """
import sys
from jdqn.run import rundir
for _ in range(int(sys.argv[2])):
    rundir.finalize(rundir.new_run_dir(sys.argv[1], "r"))
"""


@pytest.mark.slow
def test_two_processes_creating_runs_of_one_name_never_collide(tmp_path):
    """Tight pairs raced into FileExistsError before creation was one exclusive mkdir."""
    n = 60
    command = [sys.executable, "-c", _CREATE_MANY, str(tmp_path), str(n)]
    children = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errors = [child.communicate(timeout=120)[1] for child in children]
    assert [child.returncode for child in children] == [0, 0], errors
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 * n and not [name for name in names if "incomplete" in name]


_HOLD_LOCK = """
import sys, time
from jdqn.run import rundir
run = rundir.open_incomplete_run_dir(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


def test_a_second_process_resuming_a_locked_run_is_refused_in_one_line(tmp_path, capsys):
    run = rundir.new_run_dir(tmp_path, "r")
    run.config_path.write_text(_cfg(tmp_path).to_json())
    rundir.unlock(run)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(run.path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        code = main(["walkforward", "--resume", str(run.path), "--no-progress"])
        err = capsys.readouterr().err
        assert code == EXIT_USER_ERROR and err.count("\n") == 1
        assert f"in use by another jdqn process (pid {holder.pid})" in err
    finally:
        holder.send_signal(signal.SIGKILL)  # the kernel drops a killed process's lock
        holder.wait(timeout=60)
    assert run.config_path.exists()
    rundir.unlock(rundir.open_incomplete_run_dir(run.path))


def test_resuming_r_incomplete_when_r_exists_is_refused_up_front(tmp_path, capsys):
    run = rundir.new_run_dir(tmp_path, "r")
    rundir.unlock(run)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text("{}")
    code = main(["walkforward", "--resume", str(run.path), "--no-progress"])
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR and err.count("\n") == 1
    assert f"{tmp_path / 'r'} already exists" in err and "fix: move" in err


def test_the_lock_is_on_the_directory_so_deleting_the_lock_file_lets_no_one_in(tmp_path):
    """Case LK: with the lock on `.lock`, deleting it let a second resume run beside the first."""
    run = rundir.new_run_dir(tmp_path, "r")
    (run.path / rundir.LOCK_FILE).unlink()
    with pytest.raises(ValueError, match=r"in use by another jdqn process \(pid \?\)"):
        rundir.open_incomplete_run_dir(run.path)
    final = rundir.finalize(run)  # the rename keeps the lock: no one resumes meanwhile
    assert final == tmp_path / "r" and list(final.iterdir()) == []


@pytest.mark.parametrize("moment", ["before the lock is taken", "as the lock is taken"])
def test_a_resume_racing_the_runs_completion_says_so_in_one_line(tmp_path, monkeypatch, moment):
    """Case L4: the holder renames the run between the resume's checks and its lock."""
    run = rundir.new_run_dir(tmp_path, "r")
    rundir.unlock(run)
    lock = rundir.RunLock.__init__

    def completed_meanwhile(self, directory):
        if moment == "as the lock is taken":
            lock(self, directory)
        directory.rename(tmp_path / "r")
        if moment == "before the lock is taken":
            lock(self, directory)

    monkeypatch.setattr(rundir.RunLock, "__init__", completed_meanwhile)
    with pytest.raises(ValueError, match=r"the run was just completed; nothing to resume$"):
        rundir.open_incomplete_run_dir(run.path)


def test_a_final_directory_made_during_the_run_is_refused_in_one_line(tmp_path):
    """Case L3: os.rename's ENOTEMPTY was a traceback."""
    run = rundir.new_run_dir(tmp_path, "r")
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "stray").write_text("x")
    with pytest.raises(ValueError, match="made by something else while the run ran") as refused:
        rundir.finalize(run)
    assert str(refused.value).endswith(f"then: jdqn walkforward --resume {run.path}")
    assert run.path.is_dir()
    rundir.discard(run)


def test_a_storage_failure_at_the_lock_leaves_no_directory(tmp_path, monkeypatch):
    """Case F1: a full disk when the pid is written left `name.incomplete/.lock`."""
    write = rundir.Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.name == rundir.LOCK_FILE:
            raise OSError(28, "No space left on device", str(self))
        return write(self, *args, **kwargs)

    monkeypatch.setattr(rundir.Path, "write_text", full_disk)
    with pytest.raises(OSError, match="No space left"):
        rundir.new_run_dir(tmp_path / "runs", "r")
    assert list((tmp_path / "runs").iterdir()) == []


@pytest.mark.parametrize(
    ("mask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)]
)
def test_written_files_and_staging_directories_follow_the_umask(
    tmp_path, mask, file_mode, dir_mode
):
    """Case PERM: mkstemp's 0600 and mkdtemp's 0700 kept results.json, manifests and policies
    from teammates while config.json and curves were readable."""
    previous = os.umask(mask)
    try:
        assert rundir.umask() == mask
        rundir.write_json(tmp_path / "results.json", {"a": 1})
        staging = rundir.make_staging_dir(tmp_path / "fold0_seed0")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "results.json").stat().st_mode) == file_mode
    assert stat.S_IMODE(staging.stat().st_mode) == dir_mode
    assert staging.name.startswith(".fold0_seed0.") and staging.name.endswith(".tmp")


def test_a_resume_removes_what_a_killed_writer_was_staging(tmp_path):
    """Case K5: a kill during policy writes left `.fold1_seed0.*.tmp/` in the finished run."""
    run = rundir.new_run_dir(tmp_path, "r")
    (run.path / "policies").mkdir()
    staged = rundir.make_staging_dir(run.path / "policies" / "fold1_seed0")
    (staged / "arrays.npz").write_bytes(b"half")
    (run.path / "results.json3k2j.tmp").write_text("{")
    (run.path / "policies" / "fold0_seed0").mkdir()
    rundir.unlock(run)
    rundir.unlock(rundir.open_incomplete_run_dir(run.path))
    left = sorted(str(p.relative_to(run.path)) for p in run.path.rglob("*"))
    assert left == [".lock", "policies", "policies/fold0_seed0"]


def test_run_paths_are_absolute_whatever_the_working_directory(tmp_path, monkeypatch):
    """Case REL: a relative --out printed and recorded relative paths."""
    monkeypatch.chdir(tmp_path)
    run = rundir.new_run_dir("runs", "r")
    assert run.path == tmp_path / "runs" / "r.incomplete" and run.path.is_absolute()
    rundir.unlock(run)
    monkeypatch.chdir(run.path.parent)
    reopened = rundir.open_incomplete_run_dir("r.incomplete")
    assert reopened.path == run.path and reopened.final_path == tmp_path / "runs" / "r"
    rundir.unlock(reopened)


def test_held_interrupts_are_handed_to_the_caller_not_raised():
    with rundir.interrupts_held() as received:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
    assert received == [signal.SIGINT, signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
