"""How much memory a run will take, from its config alone, checked before any is taken.

:func:`estimate` is pure: the config, the number of learners (folds x seeds trained as one
program) and the number of bars give the host and device bytes, part by part. It counts what
grows with the request (replay buffers, parameters and Adam's moments, the folds' arrays on the
device, the bar series and its features on the host, the step's working set) and leaves out what
does not (compiled programs, the interpreter). :func:`limits` reads what this machine offers;
:func:`check_fits` compares the two and raises :class:`RequestTooLarge` with the estimate, the
limit and the fix in one line, so that ``--seeds 100000`` or ``network.hidden=[100000,100000]``
ends at once and leaves nothing instead of dying of an out-of-memory error minutes later.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
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

# What the learner step holds besides its state, per learner: gradients (two parts, their
# sum, surgery's copies) as ~4 parameter vectors, and per batch row the activations of the
# online and target passes over s and s' and their backward passes, ~6 copies of each layer.
STEP_PARAMETER_COPIES = 4
STEP_ACTIVATION_COPIES = 6
# The metrics a chunk returns: ~32 float32 scalars per iteration.
METRICS_PER_ITERATION = 32

# Fraction of the limit a request may use: the interpreter, XLA's compiled programs and the
# allocator's slack take the rest.
USABLE_FRACTION = 0.8


def n_features(cfg: Any) -> int:
    """Feature columns of ``cfg.data`` (a ``DataConfig``): one return per horizon, plus the rest."""
    return len(cfg.return_horizons) + NON_RETURN_FEATURES


def n_params(cfg: Any, n_inputs: int) -> int:
    """Entries of the flat parameter vector: the MLP torso and the K-head C51 output layer."""
    net = cfg.network
    widths = [n_inputs, *net.hidden, net.n_heads * cfg.env.n_actions * net.n_atoms]
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=False))


def learners(cfg: Any) -> int:
    """Learners trained as one program: every fold x seed (rolling), or one fold's seeds."""
    folds = cfg.walkforward.n_folds if cfg.walkforward.mode == "rolling" else 1
    return folds * cfg.train.seeds


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

    def largest(self) -> str:
        parts = {**self.host, **self.device}
        return max(parts, key=lambda name: parts[name])


def estimate(
    cfg: Any, *, n_learners: int, n_bars: int | None, features: int | None = None
) -> MemoryEstimate:
    """Host and device bytes of a walk-forward run of ``cfg`` (a ``Config``) with ``n_learners``
    learners vmapped in one program over a series of ``n_bars`` bars (``None``: the series is
    not counted, e.g. a file not yet read)."""
    f = n_features(cfg.data) if features is None else features
    train, wf = cfg.train, cfg.walkforward
    params = n_params(cfg, f + 1)
    # Per learner: online and target params, masks, Adam's two moments; u; the replay ring
    # (features and next features, 5 scalars, a priority per slot; at loss.n_step > 1 the
    # n-step return's next features and 4 scalars, and n - 1 pending steps per slice); the
    # slices' positions.
    n_step_row = f + 4 if cfg.loss.n_step > 1 else 0
    state = (
        5 * params
        + sum(cfg.network.hidden)
        + cfg.replay.capacity * (2 * f + 6 + n_step_row)
        + (cfg.loss.n_step - 1) * train.n_slices * (2 * f + 5)
        + 2 * train.n_slices
        + 64  # counters, keys, guard record, scalars
    ) * F32
    rows = int(train.batch_size * (1 + cfg.loss.donor_fraction))
    layer_widths = sum(cfg.network.hidden) + cfg.network.n_heads * cfg.env.n_actions * (
        cfg.network.n_atoms
    )
    working = (
        STEP_PARAMETER_COPIES * params
        + STEP_ACTIVATION_COPIES * rows * (f + 1 + layer_widths)
        + train.chunk_iterations * METRICS_PER_ITERATION
    ) * F32
    if wf.mode == "rolling":
        fold_bars = wf.n_folds * (wf.train_bars + wf.test_bars)
    else:  # one fold at a time; the last has the longest train window
        fold_bars = wf.train_bars + wf.n_folds * wf.test_bars
    device = {
        "learner states (params, Adam, replay buffers)": n_learners * state,
        "learner step working set": n_learners * working,
        "fold arrays": fold_bars * (f + 1) * F32,
    }
    host = {
        # the state's host copy at each checkpoint, and the evaluation's rollouts
        "checkpoint copy of the states": n_learners * state if cfg.output.checkpoints else 0,
        "test-window rollouts": n_learners * wf.test_bars * 5 * F32,
    }
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

    host = _available_host_bytes()
    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    limit = None if not stats else stats.get("bytes_limit")
    return MemoryLimits(host_bytes=host, device_bytes=None if limit is None else int(limit))


def _available_host_bytes() -> int:
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
    "learner states (params, Adam, replay buffers)": (
        "fewer --seeds or folds, a smaller network.hidden or replay.capacity"
    ),
    "learner step working set": "fewer --seeds or folds, a smaller train.batch_size or network",
    "fold arrays": "shorter walkforward.train_bars / test_bars or fewer folds",
    "checkpoint copy of the states": "fewer --seeds or folds, or a smaller network",
    "test-window rollouts": "fewer --seeds or a shorter walkforward.test_bars",
    "bar series and features": "fewer data.synthetic_bars or a shorter bar file",
}


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
    """:func:`check_fits` for a walk-forward of ``cfg`` on this machine (what the CLI runs)."""
    need = estimate(cfg, n_learners=learners(cfg), n_bars=n_bars, features=features)
    check_fits(need, limits())
