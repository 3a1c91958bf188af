"""jdqn.run.metrics_log: a missing tensorboardX turns its logs off with one line, not a
traceback."""

from jdqn.config import SMOKETEST, apply_overrides
from jdqn.run import metrics_log


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
