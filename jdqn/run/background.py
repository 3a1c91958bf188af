"""Work that overlaps the training program's compile (seconds: XLA's fusion passes, autotuning).

The evaluation program and the baselines do not depend on training, so they compile and run on
worker threads meanwhile (JAX releases the GIL while XLA compiles). With no cores to spare (a
2-core CPU box) threads only contend with XLA's own, so the same calls run inline, in order.
Results do not depend on where the work ran: every random draw comes from an explicit key.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Fewer usable cores than this and background work runs inline.
MIN_CORES = 4
WORKERS = 3  # the training and evaluation programs' compiles, the baselines


def usable_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """Cores this process may run on: its affinity mask where there is one, capped by a container's
    CPU quota (cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``), which the mask does not show."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota(cgroup)
    return max(1, min(cores, math.ceil(quota))) if quota is not None else cores


def _cgroup_quota(cgroup: Path) -> float | None:
    """CPUs' worth of time per period the cgroup allows; None without a limit or cgroup files."""
    try:
        fields = (cgroup / "cpu.max").read_text().split()
        return int(fields[0]) / int(fields[1]) if fields and fields[0] != "max" else None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


class InlineExecutor(Executor):
    """An ``Executor`` that runs each task when it is submitted, on the submitting thread; its
    futures are done on return (an error is kept in the future, as a thread pool's is). A Ctrl-C
    or SIGTERM (``KeyboardInterrupt``) is not an error of the task: it propagates at once, as it
    would on the main thread beside a pool, instead of waiting in a future read after training."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as error:  # handed back by .result(), as a pool would
            future.set_exception(error)
        return future


class Overlap:
    """Context manager around the executor for one group's overlapped work. Leaving with an
    exception cancels tasks not yet started and does not wait for running ones (an XLA compile
    cannot be interrupted; the interpreter joins its thread before the process exits)."""

    def __init__(self, threads: bool | None = None, workers: int = WORKERS) -> None:
        threads = usable_cores() >= MIN_CORES if threads is None else threads
        self.executor: Executor = (
            ThreadPoolExecutor(workers, thread_name_prefix="jdqn-overlap")
            if threads
            else InlineExecutor()
        )

    def __enter__(self) -> Executor:
        return self.executor

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.executor.shutdown(wait=exc_type is None, cancel_futures=exc_type is not None)
