"""Where the learners run: the learner axis (folds x seeds) padded to a multiple of the device
count and sharded over a one-axis device mesh, each program the vmapped function inside
``jax.shard_map``; in equal waves when the learners do not fit at once (docs/design.md §11, §17).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jdqn.accel import choose
from jdqn.agent.losses import gradient_rows
from jdqn.config import Config
from jdqn.data import WalkForwardData
from jdqn.run import memory, rundir
from pallas_kernels.flat_tail import BLOCK as FLAT_TAIL_BLOCK

AXIS = "learners"
# Part of a device's free memory the learners may fill: XLA's own buffers, fragmentation and
# what the estimate leaves out need the rest.
MEMORY_FRACTION = 0.8
# The flat tail's int32 offsets: learners x gradient rows x n_params + one block < 2^31
# (pallas_kernels.flat_tail; jdqn.agent.losses.gradient_rows).
INT32_OFFSETS = 2**31


class PlacementError(ValueError):
    """A request no placement can run (one line naming the limit and the fix)."""


@dataclass(frozen=True)
class Placement:
    """``learners`` vmapped runs on ``devices``: the learner axis padded to ``padded`` and
    sharded, ``per_device`` learners on each device."""

    devices: tuple[Any, ...]  # jax.Device, the mesh's one axis
    learners: int  # real learners (folds x seeds of a wave); the padding is never reported

    @property
    def padded(self) -> int:
        return math.ceil(self.learners / len(self.devices)) * len(self.devices)

    @property
    def per_device(self) -> int:
        return self.padded // len(self.devices)

    @property
    def mesh(self) -> Mesh | None:
        """None on one device: the programs stay plain ``jit(vmap(f))``."""
        if len(self.devices) == 1:
            return None
        return Mesh(np.asarray(self.devices), (AXIS,))

    def vmap(
        self,
        fn: Callable[..., Any],
        in_axes: Sequence[int | None],
        donate_argnums: int | tuple[int, ...] = (),
    ) -> Any:
        """``jax.jit(jax.vmap(fn, in_axes))``, with the mapped arguments and every output sharded
        over the learner axis and the others replicated: each device vmaps its own learners."""
        mapped = tuple(a == 0 for a in in_axes)
        return self.local(jax.vmap(fn, tuple(in_axes)), mapped, donate_argnums)

    def local(
        self,
        fn: Callable[..., Any],
        mapped: Sequence[bool],
        donate_argnums: int | tuple[int, ...] = (),
    ) -> Any:
        """``jax.jit(fn)`` where ``fn`` takes and returns a batch of learners (leading axis) in
        the arguments ``mapped`` says and in every output: on several devices each runs ``fn``
        on its own learners (``shard_map``), so what ``fn`` sees is the local batch."""
        mesh = self.mesh
        if mesh is None:
            return jax.jit(fn, donate_argnums=donate_argnums)
        specs = tuple(PartitionSpec(AXIS) if m else PartitionSpec() for m in mapped)
        return jax.jit(
            # check_vma off: the learners use no collectives, and the step's conds mix values
            # that vary over the devices with ones that do not (a fresh slice reset, say).
            jax.shard_map(
                fn, mesh=mesh, in_specs=specs, out_specs=PartitionSpec(AXIS), check_vma=False
            ),
            in_shardings=tuple(NamedSharding(mesh, s) for s in specs),
            out_shardings=NamedSharding(mesh, PartitionSpec(AXIS)),
            donate_argnums=donate_argnums,
        )

    def pad(self, tree: Any) -> Any:
        """Host arrays ``[learners, ...]`` -> ``[padded, ...]``, the last learner repeated."""
        extra = self.padded - self.learners
        if not extra:
            return jax.tree.map(np.asarray, tree)
        return jax.tree.map(
            lambda x: np.concatenate([x, np.repeat(np.asarray(x)[-1:], extra, 0)]), tree
        )

    def learner_arrays(self, tree: Any) -> Any:
        """``[learners, ...]`` arrays padded and placed, each device holding its learners."""
        mesh = self.mesh
        if mesh is None:
            return jax.tree.map(jnp.asarray, tree)
        return jax.device_put(self.pad(tree), NamedSharding(mesh, PartitionSpec(AXIS)))

    def padded_type(self, tree: Any) -> Any:
        """The types (``jax.ShapeDtypeStruct``) of ``[learners, ...]`` arrays once padded."""
        return jax.tree.map(
            lambda t: jax.ShapeDtypeStruct((self.padded, *t.shape[1:]), t.dtype), tree
        )

    def shared(self, tree: Any) -> Any:
        """Arrays every learner reads (the folds' data), on every device."""
        mesh = self.mesh
        if mesh is None:
            return tree
        return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))

    def real(self, tree: Any) -> Any:
        """The real learners of ``[padded, ...]`` arrays (on the host when sharded, which is also
        the form a checkpoint stores: it restores onto any device count)."""
        if len(self.devices) == 1:
            return tree
        return jax.tree.map(lambda x: np.asarray(x)[: self.learners], tree)


def local_devices(requested: int | None) -> tuple[Any, ...]:
    """The first ``requested`` local devices (default: all of them)."""
    available = jax.local_devices()
    if requested is None:
        return tuple(available)
    if not 1 <= requested <= len(available):
        raise PlacementError(
            f"--devices {requested}: this process sees {len(available)} "
            f"{available[0].platform} device(s); fix: pass --devices 1 to {len(available)}"
        )
    return tuple(available[:requested])


def free_bytes(device: Any) -> int:
    """What ``device`` can still allocate: its allocator's limit less what is in use, or without
    memory stats (CPU) the host's available memory shared by the platform's local devices."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    sharing = sum(1 for d in jax.local_devices() if d.platform == device.platform)
    return memory.host_available_bytes() // max(sharing, 1)


@dataclass(frozen=True)
class WavePlan:
    """How many learners run at once (a multiple of the device count) and the notice to print
    when that is fewer than the group's."""

    wave_size: int  # learners per wave, over all devices
    learner_bytes: int
    per_device_limit: int  # learners one device holds at once
    limit: str  # what sets per_device_limit: "memory" or "the flat tail's int32 offsets"


def plan_waves(
    cfg: Config,
    n_features: int,
    learners: int,
    devices: Sequence[Any],
    shared_bytes: int,
    *,
    debug: bool = False,
    free: Callable[[Any], int] | None = None,
) -> WavePlan:
    """Learners per wave for ``learners`` runs on ``devices`` (each also holding
    ``shared_bytes`` of fold data), or a :class:`PlacementError` when even one cannot run."""
    each = memory.learner_bytes(cfg, n_features)
    budget = min((free or free_bytes)(d) for d in devices)
    room = int(budget * MEMORY_FRACTION) - shared_bytes
    by_memory = max(room, 0) // each
    if by_memory < 1:
        raise PlacementError(
            f"one learner needs about {_gb(each)} of device memory and a "
            f"{devices[0].platform} device has {_gb(max(room, 0))} to spare (after "
            f"{_gb(shared_bytes)} of fold data); fix: lower replay.capacity, train.batch_size "
            "or network.hidden, or use a device with more memory"
        )
    per_device, limit = min(by_memory, math.ceil(learners / len(devices))), "memory"
    pieces = choose(cfg, backend=jax.default_backend(), debug=debug, learners=per_device)
    n_params, rows = memory.param_count(cfg, n_features), gradient_rows(cfg)
    by_offsets = (INT32_OFFSETS - 1 - FLAT_TAIL_BLOCK) // (rows * n_params)
    if pieces.fused_tail and per_device > by_offsets:
        if by_offsets < 1:
            raise PlacementError(
                f"one learner's {n_params:,} parameters x {rows} gradient rows exceed "
                "the flat tail's int32 offsets (2^31); fix: set accel.kernels=off or shrink "
                "network.hidden"
            )
        per_device, limit = by_offsets, "the flat tail's int32 offsets (2^31)"
    n_waves = math.ceil(learners / (per_device * len(devices)))
    # Equal waves (the last one padded at most to a multiple of the devices): one program.
    size = math.ceil(math.ceil(learners / n_waves) / len(devices)) * len(devices)
    if n_waves == 1:
        size = learners
    return WavePlan(wave_size=size, learner_bytes=each, per_device_limit=per_device, limit=limit)


def waves(runs: Sequence[Any], wave_size: int) -> list[list[Any]]:
    """``runs`` in consecutive waves of ``wave_size`` (the last may be smaller)."""
    return [list(runs[i : i + wave_size]) for i in range(0, len(runs), wave_size)]


def _gb(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


WAVES_FILE = "waves.json"  # in the run directory, only when some group runs in waves


@dataclass(frozen=True)
class RunLayout:
    """A walk-forward run's devices and, per group of folds, the learners run at once."""

    devices: tuple[Any, ...]
    wave_sizes: tuple[int, ...]  # per fold group; >= its learners when it runs at once
    seeds: int
    notices: tuple[str, ...]  # one line per group that runs in waves

    def groups(self, fold_groups: Sequence[list[int]]) -> list[tuple[list[int], list[Any]]]:
        """Each fold group's ``(fold_ids, [(fold, seed), ...])``, split into its waves; seed
        numbering is global, so a wave's keys are those of the same run in one program."""
        out = []
        for fold_ids, size in zip(fold_groups, self.wave_sizes, strict=True):
            runs = [(fold, seed) for fold in fold_ids for seed in range(self.seeds)]
            out += [(fold_ids, wave) for wave in waves(runs, size)]
        return out

    def record(self, run: Any) -> None:
        """Write the waves into the run directory, so that ``--resume`` runs the same ones."""
        if self.notices:
            rundir.write_json(run.path / WAVES_FILE, {"wave_sizes": list(self.wave_sizes)})

    def announce(self, log: Callable[[str], None]) -> None:
        for line in self.notices:
            log(line)


def run_layout(
    cfg: Config,
    data: WalkForwardData,
    fold_groups: Sequence[list[int]],
    devices: int | None,
    *,
    debug: bool = False,
    resumed: Any = None,
    processes: int = 1,
) -> RunLayout:
    """The devices (``--devices``, default all local ones) and each group's waves; a resumed run
    (``resumed``: its ``rundir.RunDir``) keeps the waves recorded when it started. With several
    ``processes`` the waves are planned for one process's share (``jdqn.run.processes``)."""
    chosen = local_devices(devices)
    seeds = cfg.train.seeds
    recorded = None
    if resumed is not None and (resumed.path / WAVES_FILE).exists():
        recorded = json.loads((resumed.path / WAVES_FILE).read_text())["wave_sizes"]
    sizes, notices = [], []
    for g, fold_ids in enumerate(fold_groups):
        learners = len(fold_ids) * seeds
        if resumed is not None:  # the recorded waves, or none when it started without
            sizes.append(learners if recorded is None else int(recorded[g]))
            continue
        folds = [a for k in fold_ids for a in (data.train[k], data.test[k])]
        shared = sum(a.features.nbytes + a.close.nbytes for a in folds)
        share = math.ceil(learners / processes)
        plan = plan_waves(cfg, data.n_features, share, chosen, shared, debug=debug)
        if plan.wave_size >= share:
            sizes.append(learners)
            continue
        size = plan.wave_size * processes
        sizes.append(size)
        notices.append(
            f"jdqn: {learners} learners do not fit at once ({_gb(plan.learner_bytes)} each, "
            f"{plan.per_device_limit} per device by {plan.limit}): running "
            f"{math.ceil(learners / size)} waves of {size}"
        )
    return RunLayout(devices=chosen, wave_sizes=tuple(sizes), seeds=seeds, notices=tuple(notices))
