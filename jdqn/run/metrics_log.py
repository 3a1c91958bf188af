"""Training metrics of a walk-forward group, one row per (run, chunk): JSONL, TensorBoard, plots.

On resume, rows of epochs that the checkpoint already covers are kept and later ones rewritten
(through a temporary file, so a kill at that moment loses nothing), so ``metrics.jsonl`` of a
resumed run matches an uninterrupted one.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jdqn.config import Config, apply_overrides
from jdqn.run import report, rundir

TENSORBOARD = "tensorboardX"  # the module, for callers that import it ahead of use


def without_missing_tensorboard(cfg: Config, log: Callable[[str], None]) -> Config:
    """``cfg``, with ``output.tensorboard`` off and a one-line notice where tensorboardX is not
    installed: its event files are an extra, not a reason to lose a run."""
    if not cfg.output.tensorboard or importlib.util.find_spec(TENSORBOARD) is not None:
        return cfg
    log(
        f"jdqn: no TensorBoard logs: {TENSORBOARD} is not installed (pip install {TENSORBOARD}; "
        "--set output.tensorboard=false silences this)"
    )
    return apply_overrides(cfg, ["output.tensorboard=false"])


# Learner metrics measured only on some steps, with the metric that flags those steps: a
# chunk's row averages them over the flagged steps (None when the chunk has none).
MEASURED_WHEN = {"loss_causal": "causal_applied"}
# Training-curve points per chunk and run: the metrics averaged over this many equal stretches of
# the chunk's trained iterations (a run of few chunks still draws curves, not two or three dots).
PLOT_POINTS_PER_CHUNK = 16


class MetricsLog:
    """Per-chunk training metrics: JSONL, TensorBoard and the training-curve plots."""

    def __init__(
        self,
        run: rundir.RunDir,
        cfg: Config,
        run_ids: list[tuple[int, int]],
        group_index: int,
        start_epoch: int,
        writes: report.BackgroundWrites,
        start_chunk: int = 0,
    ) -> None:
        self._run, self._cfg, self._run_ids, self._writes = run, cfg, run_ids, writes
        self._rows: dict[int, list[dict[str, Any]]] = {r: [] for r in range(len(run_ids))}
        self._path = run.metrics_path
        kept, lines = [], []
        if self._path.exists():  # resume: keep what earlier (checkpointed) chunks wrote
            lines = self._path.read_text().splitlines()
            for line in lines:
                try:
                    row = json.loads(line)
                except ValueError:  # the last line, cut short by a kill or a full disk
                    continue
                earlier = (row["epoch"], row["chunk"]) < (start_epoch, start_chunk)
                if row["group"] != group_index or earlier:
                    kept.append(line)
                if row["group"] == group_index and earlier:
                    self._rows[row["run"]].append(row)
        # The plots' points; a resumed run's earlier chunks give one point each (their row).
        self._points = {r: list(rows) for r, rows in self._rows.items()}
        if kept != lines or not self._path.exists():
            # Whole or not at all (temp file + rename): a kill here loses no earlier rows.
            rundir.write_atomic(self._path, "".join(line + "\n" for line in kept).encode())
        self._group = group_index
        self._writer: Any = None  # made at the first add (below)

    def add(self, epoch: int, chunk: int, learner_steps: Any, chunk_metrics: Any) -> dict[str, str]:
        """Log a chunk's rows: ``learner_steps`` [R] and ``chunk_metrics`` (leaves [R, L]) of
        the runs, on the host or the device."""
        if self._writer is None and self._cfg.output.tensorboard:
            # Here, not in __init__: the first chunk is queued on the device by now, so
            # tensorboardX's import runs while it trains instead of before.
            summary_writer = importlib.import_module(TENSORBOARD).SummaryWriter
            self._writer = summary_writer(str(self._run.tensorboard_dir / f"group{self._group}"))
        host = jax.device_get(chunk_metrics)
        learner_steps = np.asarray(learner_steps)
        active = np.asarray(host.active)  # [R, L]; padding of the epoch's last chunk is False
        used = np.asarray(host.trained) & active
        learner = {name: np.asarray(values) for name, values in host.learner._asdict().items()}
        # Whole-wave arrays, not a loop over runs: a sweep's wave has hundreds of them.
        last_active = active.shape[1] - 1 - np.argmax(active[:, ::-1], axis=1)
        epsilon = np.asarray(host.epsilon)[np.arange(len(active)), last_active]
        columns = {"reward_mean": _masked_means(np.asarray(host.reward_mean), active)}
        measured = {name: _measured(learner, name, used) for name in learner}
        for name, values in learner.items():
            columns[name] = _masked_means(values, measured[name])
        points = None
        if self._cfg.output.plots:  # a sweep's runs draw no training curves
            updates = self._cfg.train.updates_per_iteration
            points = _plot_points(learner, used, learner_steps, updates, measured)
        lines = []
        for r, (fold, seed) in enumerate(self._run_ids):
            row: dict[str, Any] = {
                "group": self._group,
                "run": r,
                "fold": fold,
                "seed": seed,
                "epoch": epoch,
                "chunk": chunk,
                "step": int(learner_steps[r]),
                # The last chunk of an epoch ends in padding iterations (not run): skip them.
                "epsilon": float(epsilon[r]),
            }
            row.update((name, column[r]) for name, column in columns.items())
            lines.append(json.dumps(row, allow_nan=True))
            self._rows[r].append(row)
            if points is not None:
                self._points[r] += points[r]
            if self._writer is not None:
                for name, value in row.items():
                    if isinstance(value, float) and name != "epsilon":
                        self._writer.add_scalar(f"fold{fold}_seed{seed}/{name}", value, row["step"])
        with self._path.open("a") as handle:
            handle.write("".join(line + "\n" for line in lines))
        first = self._rows[0][-1]
        loss = first.get("loss_c51") or first.get("loss_mse")
        return {"loss": _short(loss), "q": _short(first.get("q_mean"))}

    def close(self, write_plots: bool = True) -> None:
        """Flush TensorBoard; queue the training-curve plots (skipped when the run failed)."""
        if self._writer is not None:
            self._writer.close()
        if write_plots and self._cfg.output.plots:
            for r, (fold, seed) in enumerate(self._run_ids):
                self._writes.submit_plot(
                    report.plot_training,
                    self._run.plots_dir / f"fold{fold}_seed{seed}_training.png",
                    list(self._points[r]),  # a copy: the worker reads it later
                    f"fold {fold} seed {seed}: training",
                )


def _measured(learner: dict[str, np.ndarray], name: str, used: np.ndarray) -> np.ndarray:
    """Where metric ``name`` was measured: the trained iterations, and for a metric of
    :data:`MEASURED_WHEN` only those its flag marks."""
    return used & (learner[MEASURED_WHEN[name]] > 0) if name in MEASURED_WHEN else used


def _masked_means(values: np.ndarray, mask: np.ndarray) -> list[float | None]:
    """Each row's mean over its masked entries (None where it has none; a non-finite value
    among them shows as itself)."""
    counts = mask.sum(axis=-1)
    with np.errstate(invalid="ignore"):  # inf and -inf among them: NaN, as np.mean gives
        means = np.where(mask, values, 0.0).sum(axis=-1, dtype=np.float64) / np.maximum(counts, 1)
    return [float(m) if c else None for m, c in zip(means, counts, strict=True)]


def _plot_points(
    learner: dict[str, np.ndarray],
    used: np.ndarray,
    last_steps: np.ndarray,
    updates: int,
    measured: dict[str, np.ndarray] | None = None,
) -> list[list[dict[str, Any]]]:
    """Each run's training-curve points of one chunk: each metric's mean over each of up to
    :data:`PLOT_POINTS_PER_CHUNK` equal stretches of the run's trained iterations (``used``
    [R, L]), at the learner step where the stretch ends (run r's chunk ends at
    ``last_steps[r]``). The runs that trained in the same iterations (as a rule, all of
    them) share one pass over the stretches. ``measured``: :func:`_measured` of each metric, where
    the caller has it already."""
    if measured is None:
        measured = {name: _measured(learner, name, used) for name in learner}
    points: list[list[dict[str, Any]]] = [[] for _ in range(len(used))]
    patterns, which = np.unique(used, axis=0, return_inverse=True)
    for pattern, trained_row in enumerate(patterns):
        runs = np.flatnonzero(which.reshape(-1) == pattern)
        trained = np.flatnonzero(trained_row)
        n = len(trained)
        for part in np.array_split(np.arange(n), min(PLOT_POINTS_PER_CHUNK, n)) if n else []:
            iterations = trained[part]
            back = (n - 1 - int(part[-1])) * updates
            means = {
                name: _masked_means(
                    values[runs][:, iterations], measured[name][runs][:, iterations]
                )
                for name, values in learner.items()
            }
            for i, r in enumerate(runs):
                point: dict[str, Any] = {"step": int(last_steps[r]) - back}
                point.update((name, column[i]) for name, column in means.items())
                points[r].append(point)
    return points


def _short(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
