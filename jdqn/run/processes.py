"""Several processes (hosts) sharing one walk-forward run through ``jax.distributed``
(docs/design.md §11): each wave is padded to a multiple of the process count and process ``i``
trains the ``i``-th contiguous share; process 0 gathers what judging needs and writes the run
directory, except the checkpoints, which each process writes for its own share.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

# The environment of a launcher that starts one process per task, and its process count
# (the variables jax's own cluster detection reads: jax._src.clusters).
CLUSTER_SIZES = {"SLURM": "SLURM_NTASKS", "Open MPI": "OMPI_COMM_WORLD_SIZE"}
PROCESSES_FILE = "processes.json"  # in the run directory of a run of several processes


class ProcessError(ValueError):
    """Flags or a resume that cannot start the processes (one line naming the fix)."""


@dataclass(frozen=True)
class Processes:
    """This process's place among ``count`` processes; process 0 writes the run directory."""

    count: int = 1
    index: int = 0

    @property
    def writer(self) -> bool:
        return self.index == 0

    def share(self, runs: Sequence[Any]) -> list[Any]:
        """This process's contiguous share of ``runs``, padded first to a multiple of the
        process count with copies of the last run, so that every share has one size."""
        size = math.ceil(len(runs) / self.count)
        padded = list(runs) + [runs[-1]] * (size * self.count - len(runs))
        return padded[self.index * size : (self.index + 1) * size]

    def gather(self, tree: Any, learners: int) -> Any:
        """Every process's share of ``tree`` (host arrays ``[share, ...]``), concatenated in
        process order and cut to the ``learners`` real ones: the one-process ``[learners, ...]``
        on every process. Every process must call it, in the same order."""
        if self.count == 1:
            return tree
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather(tree, tiled=True)
        return jax.tree.map(lambda x: np.asarray(x)[:learners], gathered)

    def broadcast_text(self, text: str) -> str:
        """Process 0's ``text`` on every process (others pass anything)."""
        if self.count == 1:
            return text
        from jax.experimental import multihost_utils

        data = np.frombuffer(text.encode(), np.uint8)
        size = int(multihost_utils.broadcast_one_to_all(np.int32(data.size)))
        padded = np.zeros(size, np.uint8)
        padded[: min(size, data.size)] = data[:size]
        return bytes(np.asarray(multihost_utils.broadcast_one_to_all(padded))).decode()

    def any_of(self, flag: bool) -> bool:
        """Whether any process's ``flag`` is set (every process learns the same)."""
        return bool(self.gather(np.asarray([flag]), self.count).any())

    def smallest(self, values: Sequence[int]) -> list[int]:
        """Each entry's smallest value over the processes (all of them must agree on waves)."""
        if self.count == 1 or not values:
            return list(values)
        gathered = self.gather(np.asarray(values, np.int64)[None], self.count)
        return [int(v) for v in gathered.min(axis=0)]

    def record(self, run_path: Path) -> None:
        """Write the process count into the run directory, so that ``--resume`` can check it."""
        if self.count > 1:
            (run_path / PROCESSES_FILE).write_text(json.dumps({"processes": self.count}) + "\n")

    def check_resume(self, run_path: Path) -> None:
        """Refuse to resume with another process count: each process's checkpoints hold its
        own share of the learners."""
        recorded = 1
        if (run_path / PROCESSES_FILE).exists():
            recorded = int(json.loads((run_path / PROCESSES_FILE).read_text())["processes"])
        if recorded != self.count:
            raise ProcessError(
                f"--resume {run_path}: the run was started by {recorded} process(es) and this "
                f"launch has {self.count}; fix: resume with --num-processes {recorded}"
            )


def start(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    log: Callable[[str], None],
) -> Processes:
    """Join the processes of a run: with all three flags, or under a SLURM or Open MPI launch
    of more than one process (``jax.distributed.initialize`` reads the rest from its
    environment); else this process is the only one. Call before any other JAX backend use."""
    flags = {"--coordinator": coordinator, "--num-processes": num_processes}
    flags["--process-id"] = process_id
    given = [name for name, value in flags.items() if value is not None]
    if given and len(given) < len(flags):
        missing = ", ".join(name for name in flags if name not in given)
        raise ProcessError(
            f"{', '.join(given)} without {missing}; fix: pass all three of --coordinator "
            "HOST:PORT, --num-processes N and --process-id I, or none"
        )
    if given:
        assert num_processes is not None and process_id is not None and coordinator is not None
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise ProcessError(
                f"--num-processes {num_processes} --process-id {process_id}: fix: pass N >= 1 "
                "and I from 0 to N - 1"
            )
        host, _, port = coordinator.rpartition(":")
        if not host or not port.isdigit():
            raise ProcessError(f"--coordinator {coordinator}: fix: pass HOST:PORT")
        if num_processes == 1:
            return Processes()
        jax.distributed.initialize(coordinator, num_processes, process_id)
    else:
        cluster = launched_by()
        if cluster is None:
            return Processes()
        jax.distributed.initialize()
        log(
            f"jdqn: {cluster} launched {jax.process_count()} processes; this is process "
            f"{jax.process_index()}"
        )
    return Processes(count=jax.process_count(), index=jax.process_index())


def launched_by(environ: dict[str, str] | None = None) -> str | None:
    """The launcher (SLURM, Open MPI) whose environment shows more than one process, if any."""
    environ = dict(os.environ) if environ is None else environ
    for cluster, variable in CLUSTER_SIZES.items():
        size = environ.get(variable, "")
        if size.isdigit() and int(size) > 1:
            return cluster
    return None
