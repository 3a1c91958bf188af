"""report.BackgroundWrites: writes happen in order, all before the block ends, errors surface."""

import threading

import pytest

from jdqn.report import BackgroundWrites


def test_writes_run_in_order_on_a_worker_and_finish_with_the_block():
    done: list[tuple[int, str]] = []
    with BackgroundWrites() as writes:
        for i in range(20):
            writes.submit(lambda i: done.append((i, threading.current_thread().name)), i)
    assert [i for i, _ in done] == list(range(20))
    assert all(name.startswith("jdqn-writes") for _, name in done)


def test_a_failed_write_is_raised_when_the_block_ends():
    done = []

    def fail():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"), BackgroundWrites() as writes:
        writes.submit(fail)
        writes.submit(done.append, "after")  # later writes still run
    assert done == ["after"]


def test_the_blocks_own_error_wins_and_queued_writes_still_finish():
    done = []
    started = threading.Event()

    def slow():
        started.wait(5)
        done.append("slow")

    def fail():
        raise OSError("not the error the caller sees")

    with pytest.raises(KeyboardInterrupt), BackgroundWrites() as writes:
        writes.submit(slow)
        writes.submit(fail)
        started.set()
        raise KeyboardInterrupt
    assert done == ["slow"]
