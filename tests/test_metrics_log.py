"""jdqn.run.metrics_log: a missing tensorboardX turns its logs off with one line, not a
traceback; a resume rewrites the log whole or not at all."""

import json

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
