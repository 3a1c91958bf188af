"""jdqn.run.metrics_log: a missing tensorboardX turns its logs off with one line, not a
traceback; a resume rewrites the log whole or not at all."""

import json
from typing import Any, NamedTuple

import numpy as np
import pytest
from child import run_child

from jdqn.config import SMOKETEST, apply_overrides
from jdqn.run import metrics_log, rundir


class _Chunk(NamedTuple):
    """The fields of a chunk's metrics that MetricsLog.add reads."""

    active: np.ndarray
    trained: np.ndarray
    epsilon: np.ndarray
    reward_mean: np.ndarray
    learner: Any


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
    used = np.array([[True, True, True, False, True, False]])
    (points,) = metrics_log._plot_points(learner, used, np.array([100]), updates=2)
    assert len(points) == 4  # one per trained iteration: fewer than PLOT_POINTS_PER_CHUNK
    assert [p["step"] for p in points] == [94, 96, 98, 100]
    assert [p["loss_c51"] for p in points] == [1.0, 3.0, 5.0, 7.0]
    assert [p["loss_causal"] for p in points] == [2.0, None, 4.0, None]  # only where applied
    many = np.ones((1, 40), bool)
    values = {"loss_c51": np.arange(40.0)[None]}
    (points,) = metrics_log._plot_points(values, many, np.array([40]), updates=1)
    assert len(points) == metrics_log.PLOT_POINTS_PER_CHUNK == 16
    assert points[0] == {"step": 3, "loss_c51": 1.0}  # iterations 0-2 (40 = 8 x 3 + 8 x 2)
    assert points[-1] == {"step": 40, "loss_c51": 38.5}  # iterations 38-39


def test_a_chunks_rows_and_points_are_each_runs_own_means(tmp_path):
    """The whole-wave computation against a loop over runs with np.mean: a run that halted
    mid-chunk, one that never trained, a causal term never due, a NaN and an inf among the
    values; each row and each curve point is that run's own (None where nothing was
    measured)."""
    from jdqn.agent.state import LearnerMetrics

    runs, length = 6, 48
    rng = np.random.default_rng(0)
    active = np.ones((runs, length), bool)
    active[:, 40:] = False  # the epoch's padding
    trained = np.ones((runs, length), bool)
    trained[:, :2] = False
    trained[1, 20:] = False  # halted mid-chunk
    trained[2] = False  # never trained
    fields = {f: rng.standard_normal((runs, length)) for f in LearnerMetrics._fields}
    fields["causal_applied"] = (rng.random((runs, length)) < 0.3).astype(float)
    fields["causal_applied"][3] = 0.0
    fields["q_mean"][4, 10], fields["q_mean"][5, 11] = np.nan, np.inf
    metrics = _Chunk(
        active,
        trained,
        rng.random((runs, length)),
        rng.standard_normal((runs, length)),
        LearnerMetrics(**fields),
    )
    cfg = apply_overrides(SMOKETEST, ["output.plots=true", "output.tensorboard=false"])
    run = rundir.RunDir(path=tmp_path, final_path=tmp_path / "unused")
    log = metrics_log.MetricsLog(run, cfg, [(r, 0) for r in range(runs)], 0, 0, None)  # type: ignore[arg-type]
    log.add(0, 0, np.arange(runs) + 100, metrics)

    def mean(values, mask):
        return float(np.mean(values[mask])) if mask.any() else None

    for r in range(runs):
        used = trained[r] & active[r]
        row = log._rows[r][-1]
        assert row["epsilon"] == metrics.epsilon[r][active[r]][-1]
        assert row["reward_mean"] == pytest.approx(mean(metrics.reward_mean[r], active[r]))
        for name in LearnerMetrics._fields:
            mask = used & (fields["causal_applied"][r] > 0) if name == "loss_causal" else used
            expected = mean(fields[name][r], mask)
            assert row[name] == pytest.approx(expected, nan_ok=True), (r, name)
        trained_at = np.flatnonzero(used)
        stretches = np.array_split(trained_at, min(16, len(trained_at))) if len(trained_at) else []
        assert len(log._points[r]) == len(stretches)
        for point, stretch in zip(log._points[r], stretches, strict=True):
            assert point["step"] == 100 + r - (trained_at[-1] - stretch[-1])
            assert point["q_mean"] == pytest.approx(mean(fields["q_mean"][r], stretch), nan_ok=True)
    assert log._rows[2][-1]["loss_c51"] is None and log._points[2] == []
    assert log._rows[3][-1]["loss_causal"] is None
    assert np.isnan(log._rows[4][-1]["q_mean"]) and log._rows[5][-1]["q_mean"] == np.inf
