"""jdqn.background: inline or threaded, the same calls give the same futures."""

from __future__ import annotations

import threading
import time

import pytest

from jdqn import background


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
