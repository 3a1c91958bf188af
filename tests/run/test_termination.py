"""SIGTERM ends a run as Ctrl-C does, at a chunk boundary with the state checkpointed there; a
damaged checkpoint is refused and the run resumes from the one before, to the same numbers."""

from __future__ import annotations

import _imp
import gc
import importlib
import os
import shutil
import signal
import subprocess
import sys
import traceback
from pathlib import Path
from types import FrameType

import pytest
from es_sample import ES_FOLDS, ES_SAMPLE
from smoke import SMOKE
from test_checkpoint_integrity import _flip_64_bytes

from jdqn.cli import EXIT_TERMINATED, main
from jdqn.config import SMOKETEST, apply_overrides
from jdqn.run import rundir, termination, walkforward
from jdqn.run.metrics_log import MetricsLog


@pytest.fixture(autouse=True)
def _ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt, as in a terminal (pytest started as a background job of a
    non-interactive shell begins with SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_sigterm_raises_terminated_which_is_a_ctrl_c():
    with pytest.raises(termination.Terminated), termination.sigterm_raises():
        signal.raise_signal(signal.SIGTERM)
    assert issubclass(termination.Terminated, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "raised"),
    [(signal.SIGTERM, termination.Terminated), (signal.SIGINT, KeyboardInterrupt)],
)
def test_a_signal_taken_by_a_garbage_collector_callback_is_delivered_again(signum, raised):
    """A signal handled while a gc callback runs (JAX registers one) raises there, where Python
    prints the exception and drops it: the run went on and exited 0 (seen on CI)."""
    armed = []

    def callback(phase: str, info: dict) -> None:
        if phase == "start" and armed:  # this collection only
            armed.clear()
            signal.raise_signal(signum)  # handled at once, inside this callback

    after = []
    gc.callbacks.append(callback)
    try:  # removed outside the block: the signal may be raised again at any call in it
        with pytest.raises(raised), termination.sigterm_raises():
            armed.append(True)
            gc.collect()
            after.append("collected")  # not reached: raised as gc.collect returns
    finally:
        gc.callbacks.remove(callback)
    assert after == []


def test_a_signal_handled_inside_the_unraisable_hook_is_raised_after_it(monkeypatch):
    """The hook passes other exceptions on to the hook before it; a SIGTERM handled while that
    runs would be dropped for good if raised there."""
    monkeypatch.setattr(sys, "unraisablehook", lambda _: signal.raise_signal(signal.SIGTERM))

    class Finalised:
        def __del__(self) -> None:
            raise ValueError("dropped by Python, handed to the hook")

    after = []
    with pytest.raises(termination.Terminated), termination.sigterm_raises():
        Finalised()  # finalised at once: the hook runs, the SIGTERM is handled inside it
        after.append("finalised")
    assert after == [] and sys.getprofile() is None


@pytest.mark.parametrize("route", ["handled there", "raised again after a gc callback"])
def test_a_signal_inside_the_import_machinery_is_raised_outside_it(tmp_path, monkeypatch, route):
    """A stop raised in importlib's own code right after it takes the global import lock leaves
    that lock held: the writer thread's next import then waits for ever while the main thread
    waits for the writer (CI's hung Ctrl-C). The stop comes from the first code outside
    importlib instead, with the import lock free."""
    (tmp_path / "jdqn_fresh_module.py").write_text("value = 1\n")
    monkeypatch.syspath_prepend(tmp_path)
    armed = [True]

    def signal_after_the_lock(frame: FrameType, event: str, arg: object) -> None:
        if event == "c_return" and arg is _imp.acquire_lock and armed:
            armed.clear()  # frame: importlib's, the lock just taken
            if route == "handled there":
                termination._raise_interrupt(signal.SIGINT, frame)
            else:
                termination._raise_after_hook(KeyboardInterrupt)

    module: list[object] = []
    try:
        with pytest.raises(KeyboardInterrupt) as stopped, termination.sigterm_raises():
            sys.setprofile(signal_after_the_lock)
            module.append(importlib.import_module("jdqn_fresh_module"))
    finally:
        sys.setprofile(None)
        leaked = _import_lock_levels_given_back()
    assert leaked == 0 and not armed and module == []
    frames = traceback.extract_tb(stopped.value.__traceback__)
    raised_in = [f.filename for f in frames if f.filename != termination.__file__][-1]
    assert "_bootstrap" not in raised_in  # in a finder's code here (pytest has one)
    assert "jdqn_fresh_module" not in sys.modules


def _import_lock_levels_given_back() -> int:
    """The levels of the global import lock this thread holds, given back so that the session can
    import again."""
    leaked = 0
    while True:
        try:
            _imp.release_lock()
        except RuntimeError:  # this thread holds none
            return leaked
        leaked += 1


def test_a_signal_delivered_in_importlib_code_is_raised_after_that_code():
    """A real delivery: the handler runs as Python code, and the profile function it sets sees
    the handler's own frames return first, into the frame the signal interrupted. Raised there,
    the stop left importlib's frame with the global import lock held (CI's hung Ctrl-C, seen
    again: the writer thread's import waited for ever)."""
    namespace = {"__name__": "importlib._bootstrap", "_imp": _imp, "signal": signal}
    code = (
        "def locked(done):\n"
        "    _imp.acquire_lock()\n"
        "    signal.raise_signal(signal.SIGINT)  # handled as this call returns, in this frame\n"
        "    _imp.release_lock()\n"
        "    done.append('released')\n"
    )
    exec(compile(code, "<frozen importlib._bootstrap>", "exec"), namespace)
    done: list[str] = []
    try:
        with pytest.raises(KeyboardInterrupt), termination.sigterm_raises():
            namespace["locked"](done)
            done.append("back in the caller")  # not reached: raised at its first call
    finally:
        sys.setprofile(None)
        leaked = _import_lock_levels_given_back()
    assert leaked == 0 and done == ["released"]


@pytest.mark.parametrize(
    ("signum", "raised"),
    [(signal.SIGTERM, termination.Terminated), (signal.SIGINT, KeyboardInterrupt)],
)
def test_at_chunk_boundaries_a_signal_only_asks_and_is_delivered_at_the_end(signum, raised):
    """Case I3: Ctrl-C, as SIGTERM, lets the chunk end (the loop checkpoints it) and raises its
    own exception: 130 for Ctrl-C, 143 for SIGTERM."""
    done = []
    with (
        pytest.raises(raised) as stopped,
        termination.sigterm_raises(),
        termination.ChunkBoundaries() as boundaries,
    ):
        signal.raise_signal(signum)
        signal.raise_signal(signal.SIGTERM if signum == signal.SIGINT else signal.SIGINT)
        done.append(boundaries.requested)  # the chunk goes on
    assert done == [True] and type(stopped.value) is raised  # the first signal's
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with termination.ChunkBoundaries() as boundaries:  # SIGTERM not handled: nothing changes
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_sigterm_while_a_run_directory_is_made_waits_for_it():
    done = []
    with (
        pytest.raises(termination.Terminated),
        termination.sigterm_raises(),
        rundir.interrupts_deferred(),
    ):
        signal.raise_signal(signal.SIGTERM)
        done.append("after the signal")
    assert done == ["after the signal"]


# --- a whole run, in this process (one compile for all of them) -------------------------------

# 1,000 train bars / 16 slices = 62 iterations per epoch: 4 chunks of 16. One fold of the three.
SMALL = [
    *ES_FOLDS,
    "walkforward.n_folds=1",
    f"data.path={ES_SAMPLE}",
    "train.epochs=2",
    "train.chunk_iterations=16",
    "output.plots=false",
    "output.tensorboard=false",
]


def _cfg(out: Path):
    return apply_overrides(SMOKETEST, [*SMALL, f"output.out_dir={out}"])


def _sigterm_at(monkeypatch, epoch: int, chunk: int) -> None:
    """A SIGTERM to this process while chunk ``chunk`` of ``epoch`` is on the device."""
    add = MetricsLog.add

    def add_then_signal(self, e, c, *args):
        if (e, c) == (epoch, chunk):
            signal.raise_signal(signal.SIGTERM)
        return add(self, e, c, *args)

    monkeypatch.setattr(MetricsLog, "add", add_then_signal)


@pytest.mark.slow
def test_a_sigterm_checkpoints_mid_epoch_and_resume_gives_the_uninterrupted_numbers(
    tmp_path, monkeypatch
):
    out = tmp_path / "runs"
    quiet = {"progress": False, "log": lambda _: None}
    reference = walkforward.run_walkforward(_cfg(out), name="reference", **quiet)

    _sigterm_at(monkeypatch, epoch=1, chunk=1)
    lines: list[str] = []
    with pytest.raises(termination.Terminated):
        walkforward.run_walkforward(_cfg(out), name="t", progress=False, log=lines.append)
    monkeypatch.undo()
    stopped = out / "t.incomplete"
    assert lines[-1] == f"jdqn: run interrupted; resume with: jdqn walkforward --resume {stopped}"
    # Epoch 1's end (4 chunks) and the SIGTERM's chunk boundary (4 + 2 chunks).
    assert sorted(p.name for p in (stopped / "checkpoints" / "group0").glob("*.npz")) == [
        "4.npz",
        "6.npz",
    ]
    shutil.copytree(stopped, out / "damaged.incomplete")

    resumed_log: list[str] = []
    resumed = walkforward.run_walkforward(
        None, resume=stopped, progress=False, log=resumed_log.append
    )
    assert "jdqn: resumed group 0 after epoch 1, chunk 2 of epoch 2" in resumed_log
    assert resumed.results["folds"] == reference.results["folds"]
    assert (out / "t" / "metrics.jsonl").read_text() == (
        out / "reference" / "metrics.jsonl"
    ).read_text()

    # The latest checkpoint damaged (64 bytes flipped, size unchanged): refused in one line,
    # the run resumes from epoch 1's end, and its numbers are still the uninterrupted run's.
    damaged = out / "damaged.incomplete"
    _flip_64_bytes(damaged / "checkpoints" / "group0" / "6.npz")
    fallback_log: list[str] = []
    fallback = walkforward.run_walkforward(
        None, resume=damaged, progress=False, log=fallback_log.append
    )
    refused = [line for line in fallback_log if line.startswith("jdqn: refused checkpoint")]
    assert len(refused) == 1 and "cannot be read (BadZipFile: Bad CRC-32" in refused[0]
    assert "jdqn: resuming from the previous intact checkpoint, step 4" in fallback_log
    assert "jdqn: resumed group 0 after epoch 1" in fallback_log
    assert fallback.results["folds"] == reference.results["folds"]


# The command in a child pinned to one core (so the overlapped work runs inline, as on a small
# allocation), which signals itself at a named moment: on entry to (or return from) a function.
_SIGNALLED_AT = """
import os, runpy, signal, sys
from jdqn.run import metrics_log, rundir, walkforward
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
where, name, when, signame, times = sys.argv[1:6]
owner = {"walkforward": walkforward, "rundir": rundir, "programs": walkforward.GroupPrograms,
         "metrics": metrics_log.MetricsLog}[where]
original = getattr(owner, name)
def signalled(*args, **kwargs):
    if when == "after":
        result = original(*args, **kwargs)
    if name != "write_json" or "results.json" in str(args[0]):  # not a checkpoint manifest
        for _ in range(int(times)):
            os.kill(os.getpid(), getattr(signal, signame))
    return result if when == "after" else original(*args, **kwargs)
setattr(owner, name, signalled)
sys.argv = ["jdqn", *sys.argv[6:]]
runpy.run_module("jdqn", run_name="__main__")
"""


def _signalled_child(out: Path, moment: tuple[str, str, str], signame: str, times: int = 1):
    """The command, run in ``out``'s parent with relative paths (--out, the bar file)."""
    cwd = out.parent
    args = [*SMOKE, "--no-progress", "--out", out.name, "--name", "r"]
    for item in [*SMALL, f"data.path={os.path.relpath(ES_SAMPLE, cwd)}"]:
        args += ["--set", item]
    command = [sys.executable, "-c", _SIGNALLED_AT, *moment, signame, str(times), *args]
    return subprocess.run(
        ["taskset", "-c", "0", *command],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(Path(walkforward.__file__).parents[2])},
    )


_EXIT = {"SIGTERM": (EXIT_TERMINATED, "jdqn: terminated"), "SIGINT": (130, "jdqn: interrupted")}


def test_a_ctrl_c_as_the_new_run_directory_is_handed_back_leaves_nothing(tmp_path, monkeypatch):
    """A Ctrl-C let through once the directory is made, but raised before the run has it in
    hand (a re-raise after a garbage-collector callback lands on a later call, which left a
    directory holding only config.json and the lock): the directory is removed all the same."""
    new_run = walkforward._new_run

    def interrupted_on_return(*args, **kwargs):
        new_run(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(walkforward, "_new_run", interrupted_on_return)
    out = tmp_path / "runs"
    with pytest.raises(KeyboardInterrupt):
        walkforward.run_walkforward(_cfg(out), progress=False, log=lambda _: None)
    assert list(out.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("moment", "signame"),
    [
        (("programs", "compile_chunk", "before"), "SIGTERM"),  # before compilation
        (("programs", "compile_chunk", "after"), "SIGINT"),  # as it ends
        (("walkforward", "_extra_baselines", "before"), "SIGTERM"),  # after it: WRAP-T
        (("walkforward", "_extra_baselines", "before"), "SIGINT"),  # WRAP-I
    ],
)
def test_a_signal_before_training_on_one_core_ends_the_run_at_once(tmp_path, moment, signame):
    """Cases LAT, WRAP-T, WRAP-I: on one core the baselines run inline, and a signal there was
    kept in their future until every epoch had trained (then a resume line and checkpoints)."""
    done = _signalled_child(tmp_path / "runs", moment, signame)
    code, line = _EXIT[signame]
    assert done.returncode == code, done.stderr[-2000:]
    assert done.stderr.splitlines() == [line]
    assert "resume with" not in done.stdout
    assert list((tmp_path / "runs").iterdir()) == []  # no epoch trained, nothing to resume


@pytest.mark.slow
@pytest.mark.parametrize(("signame", "times"), [("SIGTERM", 1), ("SIGINT", 3)])
def test_a_signal_while_training_checkpoints_the_chunk_and_prints_the_resume_line(
    tmp_path, monkeypatch, signame, times
):
    """Case I3 and item 15: Ctrl-C does what SIGTERM does (the chunk checkpointed, the resume
    command); three quick Ctrl-Cs print no "Exception ignored"."""
    done = _signalled_child(tmp_path / "runs", ("metrics", "add", "before"), signame, times)
    code, line = _EXIT[signame]
    assert done.returncode == code and done.stderr.splitlines() == [line], done.stderr[-2000:]
    stopped = tmp_path / "runs" / "r.incomplete"
    resume = f"jdqn: run interrupted; resume with: jdqn walkforward --resume {stopped}"
    assert done.stdout.splitlines()[-1] == resume
    # The first chunk's boundary, mid-epoch (an epoch is 4 chunks).
    assert [p.name for p in (stopped / "checkpoints" / "group0").glob("*.npz")] == ["1.npz"]
    if signame == "SIGTERM":  # case REL: paths recorded absolute, resumed from elsewhere
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        monkeypatch.chdir(elsewhere)
        assert main(["walkforward", "--resume", os.path.relpath(stopped, elsewhere), "-q"]) == 0
        assert (tmp_path / "runs" / "r" / "results.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_after_results_json_before_the_rename_prints_the_resume_line(tmp_path, signame):
    """Cases T7, I7: the run stopped with its status but no resume command."""
    done = _signalled_child(tmp_path / "runs", ("rundir", "write_json", "after"), signame)
    code, line = _EXIT[signame]
    assert done.returncode == code and done.stderr.splitlines() == [line], done.stderr[-2000:]
    stopped = tmp_path / "runs" / "r.incomplete"
    resume = f"jdqn: run interrupted; resume with: jdqn walkforward --resume {stopped}"
    assert done.stdout.splitlines()[-1] == resume
    assert (stopped / "results.json").is_file() and not (tmp_path / "runs" / "r").exists()


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_at_the_final_rename_reports_the_complete_run(tmp_path, signame):
    """Cases T5, I5: a complete run reported "terminated", exit 143, with `.lock` left in it."""
    done = _signalled_child(tmp_path / "runs", ("rundir", "finalize", "before"), signame)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    final = tmp_path / "runs" / "r"
    assert f"jdqn: results in {final / 'results.json'}" in done.stdout
    assert done.stdout.splitlines()[-1] == (
        f"jdqn: {signame} arrived as the run completed; it is complete"
    )
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["r"]
    assert (final / "results.json").is_file() and not (final / rundir.LOCK_FILE).exists()
