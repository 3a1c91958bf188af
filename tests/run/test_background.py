"""jdqn.run.background: inline or threaded, the same calls give the same futures."""

from __future__ import annotations

import threading
import time

import pytest

from jdqn.run import background, termination


@pytest.mark.parametrize("threads", [False, True])
def test_results_and_errors_come_back_through_the_futures(threads):
    with background.Overlap(threads=threads) as pool:
        done = pool.submit(lambda a, b: (a + b, threading.current_thread().name), 2, b=3)
        failed = pool.submit(lambda: 1 / 0)
        value, thread = done.result()
        assert value == 5
        assert (thread == threading.main_thread().name) != threads
        with pytest.raises(ZeroDivisionError):
            failed.result()


def test_inline_tasks_run_when_submitted_in_order():
    seen: list[int] = []
    with background.Overlap(threads=False) as pool:
        futures = [pool.submit(seen.append, i) for i in range(3)]
        assert seen == [0, 1, 2] and all(f.done() for f in futures)


def test_a_ctrl_c_or_sigterm_in_an_inline_task_is_raised_at_once_not_kept_in_its_future():
    """Cases LAT, WRAP-T, WRAP-I: a SIGTERM during the baselines (submitted before training)
    waited in their future until every epoch had trained."""

    def baselines() -> None:
        raise termination.Terminated

    after = []
    with pytest.raises(termination.Terminated), background.Overlap(threads=False) as pool:
        pool.submit(baselines)
        after.append("training")
    assert after == []


def test_leaving_on_an_error_cancels_what_has_not_started():
    release = threading.Event()
    with pytest.raises(KeyError), background.Overlap(threads=True) as pool:
        running = [pool.submit(release.wait, 5) for _ in range(background.WORKERS)]
        queued = pool.submit(time.sleep, 0)
        raise KeyError("the run failed")
    assert queued.cancelled()
    release.set()
    assert all(f.result() for f in running)


def test_threads_only_with_cores_to_spare(monkeypatch):
    monkeypatch.setattr(background, "usable_cores", lambda: background.MIN_CORES - 1)
    assert isinstance(background.Overlap().executor, background.InlineExecutor)
    monkeypatch.setattr(background, "usable_cores", lambda: background.MIN_CORES)
    assert not isinstance(background.Overlap().executor, background.InlineExecutor)


def test_a_container_cpu_quota_caps_the_cores(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs
    assert background.usable_cores(v2) == min(2, background.usable_cores(tmp_path / "none"))
    (v2 / "cpu.max").write_text("max 100000\n")  # no limit
    assert background.usable_cores(v2) == background.usable_cores(tmp_path / "none")
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert background.usable_cores(v1.parent) == 1
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")  # no limit
    assert background.usable_cores(v1.parent) == background.usable_cores(tmp_path / "none")
    (v2 / "cpu.max").write_text("garbled\n")  # unreadable: no cap
    assert background.usable_cores(v2) == background.usable_cores(tmp_path / "none")
