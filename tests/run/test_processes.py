"""Runs of several processes (jdqn.run.processes): the shares, the flags, the refusals, and a
two-process ``jax.distributed`` run on localhost against the one-process run."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from es_sample import ES_SAMPLE
from smoke import SMOKE
from tiny_learner import TINY

from jdqn.cli import EXIT_USER_ERROR, main
from jdqn.run import processes as processes_module
from jdqn.run import rundir
from jdqn.run.checkpoint import META
from jdqn.run.processes import ProcessError, Processes, launched_by, start


def test_each_process_takes_a_contiguous_share_padded_with_the_last_run():
    runs = ["a", "b", "c"]
    assert Processes(2, 0).share(runs) == ["a", "b"]
    assert Processes(2, 1).share(runs) == ["c", "c"]  # the copy's results are dropped
    assert [Processes(3, i).share(list(range(7))) for i in range(3)] == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 6, 6],
    ]
    assert Processes().share(runs) == runs
    tree = {"x": np.arange(3)}
    assert Processes().gather(tree, 3) is tree  # one process: no collective


def test_only_a_launch_of_several_processes_counts_as_a_cluster():
    assert launched_by({"SLURM_NTASKS": "4"}) == "SLURM"
    assert launched_by({"OMPI_COMM_WORLD_SIZE": "2"}) == "Open MPI"
    assert launched_by({"SLURM_NTASKS": "1", "OMPI_COMM_WORLD_SIZE": "1"}) is None
    assert launched_by({}) is None


def test_without_flags_or_a_cluster_this_process_is_the_only_one(monkeypatch):
    for variable in processes_module.CLUSTER_SIZES.values():
        monkeypatch.delenv(variable, raising=False)
    lines: list[str] = []
    assert start(None, None, None, lines.append) == Processes()
    assert start("127.0.0.1:1", 1, 0, lines.append) == Processes()  # one process: no service
    assert lines == []
    with pytest.raises(ProcessError, match="fix: pass all three"):
        start("127.0.0.1:1", None, 0, lines.append)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--coordinator", "127.0.0.1:1"],
            "--coordinator without --num-processes, --process-id; fix: pass all three",
        ),
        (
            ["--num-processes", "2", "--process-id", "0"],
            "--num-processes, --process-id without --coordinator; fix: pass all three",
        ),
        (
            ["--coordinator", "127.0.0.1:1", "--num-processes", "2", "--process-id", "2"],
            "--num-processes 2 --process-id 2: fix: pass N >= 1 and I from 0 to N - 1",
        ),
        (
            ["--coordinator", "localhost", "--num-processes", "2", "--process-id", "0"],
            "--coordinator localhost: fix: pass HOST:PORT",
        ),
    ],
)
def test_incomplete_or_impossible_process_flags_are_a_one_line_error(
    tmp_path, capsys, flags, message
):
    code = main([*SMOKE, "--out", str(tmp_path), *flags])
    assert code == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith(f"jdqn: error: {message}") and err.count("\n") == 1
    assert not list(tmp_path.iterdir())  # nothing written, nothing started


def test_resuming_with_another_process_count_is_a_one_line_error(tmp_path, capsys):
    run = tmp_path / "run.incomplete"
    run.mkdir()
    Processes(2, 0).record(run)
    assert main(["walkforward", "--resume", str(run)]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err == (
        f"jdqn: error: --resume {run}: the run was started by 2 process(es) and this launch "
        "has 1; fix: resume with --num-processes 2\n"
    )
    assert {p.name for p in run.iterdir()} == {".lock", "processes.json"}  # nothing more


# The command in a child process. With --process-id it is stopped (as by a Ctrl-C) once the
# first epoch's checkpoint is written, on every process, and resumed in the same processes (one
# start-up each, jax.distributed initialised once).
_CHILD = """
import sys
from jdqn.run import checkpoint, walkforward
from jdqn.cli import main

argv = sys.argv[1:]
if "--process-id" in argv:
    save = checkpoint.GroupCheckpoints.save

    def save_then_stop(self, *args, **kwargs):
        save(self, *args, **kwargs)
        self.close()
        raise KeyboardInterrupt

    checkpoint.GroupCheckpoints.save = save_then_stop
    assert main(argv) == 130
    checkpoint.GroupCheckpoints.save = save
    stopped = argv[argv.index("--out") + 1] + "/two.incomplete"
    walkforward.run_walkforward(None, resume=stopped, progress=False, log=print)
    sys.exit(0)
sys.exit(main(argv))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(argv: list[str], processes: int) -> list[subprocess.CompletedProcess]:
    """The command in ``processes`` child processes on localhost; waits for all of them."""
    flags: list[list[str]] = [[]]
    if processes > 1:
        coordinator = f"127.0.0.1:{_free_port()}"
        flags = [
            [
                "--coordinator",
                coordinator,
                "--num-processes",
                str(processes),
                "--process-id",
                str(i),
            ]
            for i in range(processes)
        ]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, *argv, *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for extra in flags
    ]
    done = []
    for child in children:
        out, err = child.communicate(timeout=600)
        done.append(subprocess.CompletedProcess(child.args, child.returncode, out, err))
    return done


def _share(directory: Path) -> dict[str, np.ndarray]:
    """The latest checkpoint in ``directory`` (a one-process run's group, or one process's share
    of it), by leaf name."""
    latest = max(directory.glob("*.npz"), key=lambda path: int(path.stem))
    return {name: x for name, x in rundir.read_arrays(latest).items() if name != META}


@pytest.mark.slow
def test_two_processes_stopped_and_resumed_equal_the_one_process_run(tmp_path):
    """1 fold x 3 seeds: process 0 trains seeds 0 and 1, process 1 seed 2 and a padding copy.
    Stopped after the first epoch's checkpoint and resumed by the two processes, the run equals
    the one-process run bit for bit on CPU: results.json's folds and summary, metrics.jsonl and
    the checkpointed states (each learner's computation is the same; only the vmap's width
    differs). Each process checkpoints its own share in its own folder."""
    argv = [*SMOKE, "--data", str(ES_SAMPLE), "--out", str(tmp_path), "-q"]
    argv += ["--folds", "1", "--seeds", "3", "--epochs", "2"]
    for item in (
        *TINY,
        "walkforward.train_bars=400",
        "walkforward.test_bars=200",
        "output.plots=false",
        "output.tensorboard=false",
    ):
        argv += ["--set", item]
    (one,) = _launch([*argv, "--name", "one"], processes=1)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _launch([*argv, "--name", "two"], processes=2)
    assert [c.returncode for c in two] == [0, 0], two[0].stderr[-3000:] + two[1].stderr[-3000:]
    assert "jdqn: resumed group 0 after epoch 1\n" in two[0].stdout  # process 0 logs
    assert "jdqn:" not in two[1].stdout  # the others do not
    results = [json.loads((tmp_path / n / "results.json").read_text()) for n in ("one", "two")]
    assert len(results[0]["folds"]) == 3
    assert [r["seed"] for r in results[1]["folds"]] == [0, 1, 2]
    assert results[1]["folds"] == results[0]["folds"]
    assert results[1]["summary"] == results[0]["summary"]
    metrics = [(tmp_path / n / "metrics.jsonl").read_text() for n in ("one", "two")]
    assert metrics[1] == metrics[0]
    # Each process wrote its own share (2 learners: seeds 0 and 1; seed 2 and its copy) in its
    # own folder, nothing gathered; the shares together are the one-process run's state.
    group = tmp_path / "two" / "checkpoints" / "group0"
    assert sorted(p.name for p in group.iterdir()) == ["process-0", "process-1"]
    one = _share(tmp_path / "one" / "checkpoints" / "group0")
    shares = [_share(group / f"process-{i}") for i in range(2)]
    assert set(shares[0]) == set(shares[1]) == set(one) and len(one) > 10
    for name, whole in one.items():
        assert whole.shape[0] == 3
        assert shares[0][name].shape == shares[1][name].shape == (2, *whole.shape[1:])
        np.testing.assert_array_equal(np.concatenate([s[name] for s in shares])[:3], whole)
    # Process 0 wrote the run directory: the one-process run's files and the process count.
    files = [
        {str(p.relative_to(tmp_path / n)) for p in (tmp_path / n).rglob("*") if p.is_file()}
        for n in ("one", "two")
    ]
    outside = {f for f in files[0] ^ files[1] if not f.startswith("checkpoints/")}
    assert outside == {"processes.json"}
    assert json.loads((tmp_path / "two" / "processes.json").read_text()) == {"processes": 2}
