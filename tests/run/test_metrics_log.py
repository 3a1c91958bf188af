"""jdqn.run.metrics_log: a missing tensorboardX turns its logs off with one line, not a
traceback; a resume rewrites the log whole or not at all."""

import json

import numpy as np
import pytest
from child import run_child

from jdqn.config import SMOKETEST, apply_overrides
from jdqn.run import metrics_log, rundir


def test_missing_tensorboard_turns_its_logs_off_with_one_notice(monkeypatch):
    notices: list[str] = []
    monkeypatch.setattr(metrics_log, "TENSORBOARD", "no_such_module_jdqn_test")
    cfg = apply_overrides(SMOKETEST, ["output.tensorboard=true"])
    off = metrics_log.without_missing_tensorboard(cfg, notices.append)
    assert not off.output.tensorboard and off.train == cfg.train
    assert len(notices) == 1 and "output.tensorboard=false" in notices[0]
    # Installed, or not asked for: the config as given, nothing said.
    monkeypatch.setattr(metrics_log, "TENSORBOARD", "json")
    assert metrics_log.without_missing_tensorboard(cfg, notices.append) is cfg
    quiet = apply_overrides(SMOKETEST, ["output.tensorboard=false"])
    assert metrics_log.without_missing_tensorboard(quiet, notices.append) is quiet
    assert len(notices) == 1


def _rows(epochs: int, chunks: int) -> str:
    rows = [
        {"group": 0, "run": 0, "fold": 0, "seed": 0, "epoch": e, "chunk": c, "step": 16 * c}
        for e in range(epochs)
        for c in range(chunks)
    ]
    return "".join(json.dumps(row) + "\n" for row in rows)


@pytest.mark.slow
def test_a_storage_failure_as_a_resume_rewrites_the_log_loses_no_row(tmp_path):
    """Case K8: the resume truncated metrics.jsonl before writing the rows it keeps, so a kill
    (here: the file-size limit) at that moment lost every earlier epoch's rows."""
    path = tmp_path / "metrics.jsonl"
    before = _rows(epochs=3, chunks=4) + '{"group": 0, "ru'  # a last row cut short by a kill
    path.write_text(before)
    child = (
        "import resource, signal\n"
        "from pathlib import Path\n"
        "from jdqn.config import SMOKETEST\n"
        "from jdqn.run import rundir\n"
        "from jdqn.run.metrics_log import MetricsLog\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a core dump\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))\n"
        f"run = rundir.RunDir(path=Path({str(tmp_path)!r}), final_path=Path('unused'))\n"
        "MetricsLog(run, SMOKETEST, [(0, 0)], 0, 2, None)\n"
    )
    done = run_child(child)
    assert done.returncode == 1 and "File too large" in done.stderr
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == [path.name]
    # Without the limit: epochs 0 and 1 kept, the rest (and the cut row) dropped.
    run = rundir.RunDir(path=tmp_path, final_path=tmp_path / "unused")
    metrics_log.MetricsLog(run, SMOKETEST, [(0, 0)], 0, 2, None)  # type: ignore[arg-type]
    assert path.read_text() == _rows(epochs=2, chunks=4)


def test_training_curve_points_average_stretches_of_the_trained_iterations():
    """A chunk of 6 iterations, the 4th untrained and the last padding: each of the 4 trained
    ones is a point, at its learner step (2 updates per iteration); 40 make 16 stretches."""
    learner = {
        "loss_c51": np.array([[1.0, 3.0, 5.0, 99.0, 7.0, 99.0]]),
        "loss_causal": np.array([[2.0, 0.0, 4.0, 99.0, 6.0, 99.0]]),
        "causal_applied": np.array([[1, 0, 1, 0, 0, 0]]),
    }
    used = np.array([True, True, True, False, True, False])
    points = metrics_log._plot_points(learner, 0, used, last_step=100, updates=2)
    assert len(points) == 4  # one per trained iteration: fewer than PLOT_POINTS_PER_CHUNK
    assert [p["step"] for p in points] == [94, 96, 98, 100]
    assert [p["loss_c51"] for p in points] == [1.0, 3.0, 5.0, 7.0]
    assert [p["loss_causal"] for p in points] == [2.0, None, 4.0, None]  # only where applied
    many = np.ones(40, bool)
    values = {"loss_c51": np.arange(40.0)[None]}
    points = metrics_log._plot_points(values, 0, many, last_step=40, updates=1)
    assert len(points) == metrics_log.PLOT_POINTS_PER_CHUNK == 16
    assert points[0] == {"step": 3, "loss_c51": 1.0}  # iterations 0-2 (40 = 8 x 3 + 8 x 2)
    assert points[-1] == {"step": 40, "loss_c51": 38.5}  # iterations 38-39
