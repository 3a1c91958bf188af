"""How much memory a run will take, from its config alone, checked before any is taken.

:func:`estimate` counts, part by part, the host and device bytes that grow with the request
(replay buffers, parameters and Adam's moments, fold arrays, bar series, the step's working set),
not compiled programs or the interpreter; :func:`check_fits` compares them with :func:`limits` and
raises :class:`RequestTooLarge` in one line with the fix, so that ``--seeds 100000`` ends at once
instead of dying of an out-of-memory error minutes later.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

F32 = 4  # bytes of a float32 or int32

# Columns of the feature matrix besides one log return per horizon: four range features, the
# volume z-score and six calendar features (jdqn.data.features).
NON_RETURN_FEATURES = 11

# Host bytes per bar while a series is built and featurised: timestamps and OHLCV (48), the
# synthetic generator's float64 draws and intermediates (~12 x 8), and per feature one float64
# column plus its float32 copy (12).
HOST_BYTES_PER_BAR = 144
HOST_BYTES_PER_FEATURE_BAR = 12

# Host bytes per bar and column of a bar file while the loader holds its raw frame and the
# parsed copies (measured on 1M synthetic bars of 6 columns: 491 B/bar in all for CSV, 565 for
# Parquet, against 324 of the series and features above).
LOADER_BYTES_PER_COLUMN_BAR = 40
# Peak RSS of a CPU walk-forward of one small learner: the interpreter, JAX, XLA and its compiled
# programs (measured 470 MiB on the 2-core CPU machine, its programs loaded from the cache).
# With every learner's state and working set and a cold compile (below) counted too, the peaks
# of a small run compiled cold at 1 and 64 learners (941, 1,119 MB) are 0.99 and 0.98x the
# estimate (tests/run/test_memory.py).
CPU_PROCESS_BYTES = 450 * 2**20
# XLA compiling a run's programs on the CPU (a cold start, no stored program): peak RSS of the
# run above with its compilation cache off, 941 and 1,119 MB at 1 and 64 learners, is this much
# above the warm figure.
CPU_COMPILE_BYTES = 450 * 2**20
_SAMPLE_BYTES = 1 << 16  # of a CSV file, to measure its bytes per row

# Fraction of the limit a request may use: the interpreter, XLA's compiled programs and the
# allocator's slack take the rest.
USABLE_FRACTION = 0.8


def n_features(cfg: Any) -> int:
    """Feature columns of ``cfg.data`` (a ``DataConfig``): one return per horizon (two with
    ``scaled_returns``), plus the rest."""
    returns = len(cfg.return_horizons) * (2 if cfg.scaled_returns else 1)
    return returns + NON_RETURN_FEATURES


def param_count(cfg: Any, n_features: int) -> int:
    """Entries of one network's flat parameter vector (the MLP torso and the K-head C51 output
    layer): the observation is the features plus the held position."""
    net = cfg.network
    widths = [n_features + 1, *net.hidden, net.n_heads * cfg.env.n_actions * net.n_atoms]
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=False))


def state_bytes(cfg: Any, n_features: int) -> int:
    """One learner's carried state in bytes (replay buffer, params, target, masks, Adam's
    moments, spectral-norm vectors, slices, scalars), from the config."""
    transition = 2 * n_features + 5  # features, next features and 5 scalars (jdqn.agent.transition)
    if cfg.loss.n_step > 1:
        transition += n_features + 4  # the n-step return's next features and 4 scalars
    replay = cfg.replay.capacity * (transition + 1) * F32 + 16  # a priority per slot; 4 scalars
    vectors = 5 * param_count(cfg, n_features) * F32  # params, target, masks, mu, nu
    torso_u = sum(cfg.network.hidden) * F32
    slices = cfg.train.n_slices * 2 * F32  # each slice's bar and position
    # each slice's pending one-step transitions awaiting their n-step returns (jdqn.agent.nstep)
    slices += (cfg.loss.n_step - 1) * cfg.train.n_slices * (2 * n_features + 5) * F32
    scalars = 4 * 16  # step, keys, guard, phi_hat, Adam's count, tail bounds, iteration
    # the learner's values: lr, gamma's powers, epsilon_end, each epoch's alpha, label
    # smoothing's 2 weights, hold penalty, act_risk, the target sync's period (int32), the
    # training cost's multiplier
    hyper = (cfg.loss.n_step + 9 + cfg.train.epochs) * F32
    return replay + vectors + torso_u + slices + scalars + hyper


def learner_bytes(cfg: Any, n_features: int) -> int:
    """One learner's device memory in bytes: its state (:func:`state_bytes`) plus the working set
    of a learner step and of a chunk's metrics (generous: the batch and donor rows through three
    forward passes and their backward, the [N, N] hat projection per row and head, the loss parts'
    gradients with the surgery's and Adam's temporaries)."""
    from jdqn.agent.state import LearnerMetrics

    net = cfg.network
    rows = math.ceil(cfg.train.batch_size * (1 + cfg.loss.donor_fraction))
    head_out = net.n_heads * cfg.env.n_actions * net.n_atoms
    per_row = 6 * (n_features + 1 + sum(net.hidden) + head_out) + net.n_heads * net.n_atoms**2
    step = (rows * per_row + 12 * param_count(cfg, n_features)) * F32
    metrics = cfg.train.chunk_iterations * (len(LearnerMetrics._fields) + 4) * F32
    return state_bytes(cfg, n_features) + step + metrics


def learners(cfg: Any) -> int:
    """Learners trained as one program: every fold x seed (rolling), or one fold's seeds."""
    folds = cfg.walkforward.n_folds if cfg.walkforward.mode == "rolling" else 1
    return folds * cfg.train.seeds


def bar_file_shape(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(rows, columns) of a bar file without reading it: a Parquet file's metadata, or a CSV's
    size over the mean row length of its first 64 KiB (a .gz file's scaled by the compression
    of that part); None when it cannot be told (the loader then reports the problem)."""
    import gzip
    import zlib

    from jdqn.data.bars.reading import file_kind

    p = Path(path)
    try:
        if file_kind(p) == "parquet":
            import pyarrow.parquet as pq

            metadata = pq.read_metadata(p)
            return int(metadata.num_rows), int(metadata.num_columns)
        if file_kind(p) != "csv":
            return None
        size = p.stat().st_size
        with open(p, "rb") as handle:
            head = handle.read(_SAMPLE_BYTES)
        if p.name.lower().endswith(".gz"):
            inflate = zlib.decompressobj(wbits=31)  # gzip header
            text = inflate.decompress(head)
            size = size * len(text) // max(len(head) - len(inflate.unconsumed_tail), 1)
            head = text
    except (OSError, ValueError, EOFError, gzip.BadGzipFile, zlib.error, ImportError):
        return None
    lines = head.splitlines()
    if len(lines) < 3:
        return None
    body = lines[1:-1]  # the header, and the last line that the sample may cut
    row_bytes = sum(len(line) + 1 for line in body) / len(body)
    return max(int(size / row_bytes), 1), lines[0].count(b",") + 1


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a run needs, by part (each name says where it lives)."""

    host: dict[str, int] = field(default_factory=dict)
    device: dict[str, int] = field(default_factory=dict)

    @property
    def host_bytes(self) -> int:
        return sum(self.host.values())

    @property
    def device_bytes(self) -> int:
        return sum(self.device.values())


def estimate(
    cfg: Any,
    *,
    n_learners: int,
    n_bars: int | None,
    features: int | None = None,
    cpu: bool = False,
) -> MemoryEstimate:
    """Host and device bytes of a walk-forward of ``cfg`` with ``n_learners`` learners over
    ``n_bars`` bars (``None``: a file not yet read, not counted). A GPU holds one learner at the
    least: the rest run in waves (``jdqn.run.placement.plan_waves``). ``cpu``: the device is the
    host, where every learner's state and step working set are held at once, and the process
    itself (:data:`CPU_PROCESS_BYTES`) counts."""
    f = n_features(cfg.data) if features is None else features
    wf = cfg.walkforward
    state = state_bytes(cfg, f)
    held = n_learners if cpu else 1  # learners whose state and working set are held at once
    if wf.mode == "rolling":
        fold_bars = wf.n_folds * (wf.train_bars + wf.test_bars)
    else:  # one fold at a time; the last has the longest train window
        fold_bars = wf.train_bars + wf.n_folds * wf.test_bars
    device = {
        "learner states (params, Adam, replay buffers)": held * state,
        "learner step working set": held * (learner_bytes(cfg, f) - state),
        "fold arrays": fold_bars * (f + 1) * F32,
    }
    host = {
        "checkpoint copy of the states": n_learners * state if cfg.output.checkpoints else 0,
        "test-window rollouts": n_learners * wf.test_bars * 5 * F32,
    }
    if cpu:
        host["the process (Python, JAX, compiled programs)"] = CPU_PROCESS_BYTES
        host["compiling the programs (a cold start)"] = CPU_COMPILE_BYTES
    if n_bars is not None:
        host["bar series and features"] = n_bars * (
            HOST_BYTES_PER_BAR + HOST_BYTES_PER_FEATURE_BAR * f
        )
    return MemoryEstimate(host=host, device=device)


@dataclass(frozen=True)
class MemoryLimits:
    """What this machine offers: host bytes available now, and device bytes (``None`` when the
    device is the host, as on CPU: then host and device needs add up against the host)."""

    host_bytes: int
    device_bytes: int | None


def limits() -> MemoryLimits:
    """The host's available memory (``MemAvailable``) and the default device's byte limit."""
    import jax

    host = host_available_bytes()
    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    limit = None if not stats else stats.get("bytes_limit")
    return MemoryLimits(host_bytes=host, device_bytes=None if limit is None else int(limit))


def host_available_bytes() -> int:
    """MemAvailable of /proc/meminfo where there is one, else the free physical pages."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


class RequestTooLarge(ValueError):
    """A run that cannot fit this machine's memory (one line: estimate, limit, fix)."""


# The settings that make each part smaller, for the fix.
_FIXES = {
    "learner states (params, Adam, replay buffers)": "fewer --seeds or folds, or a smaller "
    "network.hidden or replay.capacity",
    "learner step working set": "fewer --seeds or folds, or a smaller train.batch_size or network",
    "fold arrays": "shorter walkforward.train_bars / test_bars or fewer folds",
    "checkpoint copy of the states": "fewer --seeds or folds, or a smaller network",
    "test-window rollouts": "fewer --seeds or a shorter walkforward.test_bars",
    "bar series and features": "fewer data.synthetic_bars or a shorter bar file",
    "bar file being read": "a shorter bar file (or fewer columns)",
    "the process (Python, JAX, compiled programs)": "a machine with more memory",
}


# Peak memory of ``jdqn data synth`` per bar (measured: 554 B at 1M bars, writing Parquet).
SYNTH_BYTES_PER_BAR = 600


def check_synth_request(n_bars: int) -> None:
    """Refuse (:class:`RequestTooLarge`) synthetic bars that would not fit the host's memory."""
    need, have = n_bars * SYNTH_BYTES_PER_BAR, host_available_bytes()
    if need > USABLE_FRACTION * have:
        raise RequestTooLarge(
            f"--bars {n_bars:,} needs about {_gib(need)} of memory, more than the "
            f"{_gib(int(USABLE_FRACTION * have))} usable of {_gib(have)}; fix: fewer bars"
        )


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_fits(need: MemoryEstimate, have: MemoryLimits) -> None:
    """Raise :class:`RequestTooLarge` when ``need`` exceeds :data:`USABLE_FRACTION` of ``have``."""
    if have.device_bytes is None:
        checks = [("host (the CPU device's arrays included)", need.host_bytes + need.device_bytes,
                   have.host_bytes, {**need.device, **need.host})]  # fmt: skip
    else:
        checks = [
            ("device", need.device_bytes, have.device_bytes, need.device),
            ("host", need.host_bytes, have.host_bytes, need.host),
        ]
    for where, needed, limit, parts in checks:
        if needed > USABLE_FRACTION * limit:
            largest = max(parts, key=lambda name: parts[name])
            raise RequestTooLarge(
                f"this run needs about {_gib(needed)} of {where} memory ({largest}: "
                f"{_gib(parts[largest])}), more than the {_gib(int(USABLE_FRACTION * limit))} "
                f"usable of {_gib(limit)}; fix: {_FIXES[largest]}"
            )


def check_request(cfg: Any, *, n_bars: int | None, features: int | None = None) -> None:
    """:func:`check_fits` of :func:`request_estimate` on this machine."""
    have = limits()
    check_fits(request_estimate(cfg, n_bars, features, cpu=have.device_bytes is None), have)


def request_estimate(
    cfg: Any, n_bars: int | None, features: int | None, *, cpu: bool
) -> MemoryEstimate:
    """:func:`estimate` of a walk-forward of ``cfg`` as the CLI asks for it; with ``n_bars``
    None and a bar file, its rows and columns as :func:`bar_file_shape` tells them."""
    shape = bar_file_shape(cfg.data.path) if n_bars is None and cfg.data.path else None
    if shape is not None:
        n_bars = shape[0]
    need = estimate(cfg, n_learners=learners(cfg), n_bars=n_bars, features=features, cpu=cpu)
    if shape is not None:
        # what the bar loader holds at its peak beyond the series: raw and parsed columns
        need.host["bar file being read"] = shape[0] * shape[1] * LOADER_BYTES_PER_COLUMN_BAR
    return need
