"""SIGTERM ends a run as Ctrl-C does, at a chunk boundary with the state checkpointed there; a
damaged checkpoint is refused and the run resumes from the one before, to the same numbers."""

from __future__ import annotations

import gc
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from es_sample import ES_FOLDS, ES_SAMPLE
from smoke import SMOKE
from test_checkpoint_integrity import _flip_64_bytes, _largest_data_file

from jdqn.cli import EXIT_TERMINATED
from jdqn.config import SMOKETEST, apply_overrides
from jdqn.run import rundir, termination, walkforward
from jdqn.run.metrics_log import MetricsLog


def test_sigterm_raises_terminated_which_is_a_ctrl_c():
    with pytest.raises(termination.Terminated), termination.sigterm_raises():
        signal.raise_signal(signal.SIGTERM)
    assert issubclass(termination.Terminated, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize(
    ("signum", "raised"),
    [(signal.SIGTERM, termination.Terminated), (signal.SIGINT, KeyboardInterrupt)],
)
def test_a_signal_taken_by_a_garbage_collector_callback_is_delivered_again(signum, raised):
    """A signal handled while a gc callback runs (JAX registers one) raises there, where Python
    prints the exception and drops it: the run went on and exited 0 (seen on CI)."""

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            signal.raise_signal(signum)  # handled at once, inside this callback

    waited = 0.0
    with pytest.raises(raised), termination.sigterm_raises():
        gc.callbacks.append(callback)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(callback)
        start = time.monotonic()
        while time.monotonic() - start < 5:
            time.sleep(0.01)
        waited = time.monotonic() - start
    assert waited == 0.0  # delivered within the loop, not after it


def test_at_chunk_boundaries_sigterm_only_asks_and_is_delivered_at_the_end():
    done = []
    with (
        pytest.raises(termination.Terminated),
        termination.sigterm_raises(),
        termination.ChunkBoundaries() as boundaries,
    ):
        signal.raise_signal(signal.SIGTERM)
        done.append(boundaries.requested)  # the chunk goes on
    assert done == [True]
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
    assert sorted(p.name for p in (stopped / "checkpoints" / "group0").iterdir()) == ["4", "6"]
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
    _flip_64_bytes(_largest_data_file(damaged / "checkpoints" / "group0" / "6"))
    fallback_log: list[str] = []
    fallback = walkforward.run_walkforward(
        None, resume=damaged, progress=False, log=fallback_log.append
    )
    refused = [line for line in fallback_log if line.startswith("jdqn: refused checkpoint")]
    assert len(refused) == 1 and "do not match their SHA-256" in refused[0]
    assert "jdqn: resuming from the previous intact checkpoint, step 4" in fallback_log
    assert "jdqn: resumed group 0 after epoch 1" in fallback_log
    assert fallback.results["folds"] == reference.results["folds"]


def _walkforward_child(out: Path, *extra: str) -> subprocess.Popen[str]:
    args = [*SMOKE, "--no-progress", "--out", str(out), "--name", "r", *extra]
    for item in SMALL:
        args += ["--set", item]
    return subprocess.Popen(
        [sys.executable, "-m", "jdqn", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(condition, proc: subprocess.Popen[str], timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not condition():
        time.sleep(0.02)


@pytest.mark.slow
def test_a_sigterm_to_the_command_before_and_during_training(tmp_path):
    """Before any epoch: exit 143, one line, nothing left. During training: exit 143, the state
    checkpointed at the chunk's end and the resume command printed."""
    out = tmp_path / "early"
    proc = _walkforward_child(out)
    _wait_for(lambda: list(out.glob("*.incomplete")), proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_TERMINATED, err[-2000:]
    assert err.splitlines() == ["jdqn: terminated"]
    assert not list(out.iterdir())

    out = tmp_path / "late"
    proc = _walkforward_child(out)
    metrics = out / "r.incomplete" / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 3, proc)
    proc.send_signal(signal.SIGTERM)
    printed, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_TERMINATED, err[-2000:]
    assert "Traceback" not in err and err.splitlines() == ["jdqn: terminated"]
    resume = f"jdqn: run interrupted; resume with: jdqn walkforward --resume {out / 'r.incomplete'}"
    assert printed.splitlines()[-1] == resume
    steps = list((out / "r.incomplete" / "checkpoints" / "group0").iterdir())
    assert steps and json.loads((out / "r.incomplete" / "config.json").read_text())
