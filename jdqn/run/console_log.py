"""Console output of the ``jdqn`` command through :mod:`logging` (logger ``jdqn``).

Records below WARNING go to stdout and the rest to stderr, each as its bare message; ``-q``
keeps the OUTCOME records (where the results went, halted folds, how to resume), warnings and
errors; ``-v`` adds DEBUG records (how the bars were read, the memory plan, compile and chunk
times). Streams are looked up when a record is written, so a replaced ``sys.stdout`` (pytest's
capture, a redirect) receives it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jdqn.config import Config
    from jdqn.data import WalkForwardData
    from jdqn.run.placement import RunLayout

LOGGER_NAME = "jdqn"
OUTCOME = logging.INFO + 5  # what even -q prints: results path, halts, the --resume command
logging.addLevelName(OUTCOME, "OUTCOME")


def outcome(message: str) -> None:
    """``message`` on the ``jdqn`` logger at the OUTCOME level (kept by ``-q``)."""
    logging.getLogger(LOGGER_NAME).log(OUTCOME, message)


class _ConsoleHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stdout if record.levelno < logging.WARNING else sys.stderr
        # A closed or vanished reader, as in `jdqn ... | head`, is not the command's failure.
        with contextlib.suppress(OSError, ValueError):
            print(self.format(record), file=stream)


def configure(verbose: int = 0, quiet: bool = False) -> logging.Logger:
    """The ``jdqn`` logger at INFO (DEBUG with ``verbose``, OUTCOME with ``quiet``), with one
    console handler however often it is called."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(OUTCOME if quiet else logging.DEBUG if verbose else logging.INFO)
    if not any(isinstance(h, _ConsoleHandler) for h in logger.handlers):
        handler = _ConsoleHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    # Not also through the root logger, which libraries (absl, via JAX) give a handler of their
    # own: every line would print twice.
    logger.propagate = False
    return logger


def reading_record(cfg: Config, data: WalkForwardData) -> str:
    """How the bars were read, split and priced, for ``-v``."""
    from jdqn.data import CALENDARS

    d, env = cfg.data, cfg.env
    columns = ",".join(d.columns) if d.columns else "by their headers"
    folds = "; ".join(
        f"fold {f.index} train [{f.train_start}, {f.train_end}) test [{f.test_start}, {f.test_end})"
        for f in data.folds
    )
    return (
        f"jdqn: bars: {data.source}; columns {columns}; naive times read as "
        f"{d.timezone or 'exchange time'}; calendar {d.calendar} "
        f"({CALENDARS[d.calendar].timezone}); {data.n_bars:,} bars, {data.bars_per_year:,.0f} "
        f"per year; {data.n_features} features\njdqn: {folds}\njdqn: env: {env.instrument}, "
        f"cost {env.cost_points:.6g} points (${env.cost_points * env.point_value_usd:,.2f}) per "
        f"unit and side, reward scale {env.reward_scale:.6g}"
    )


def memory_record(cfg: Config, data: WalkForwardData, layout: RunLayout) -> str:
    """The memory plan, for ``-v``: the estimate by part and the waves."""
    from jdqn.run import memory

    need = memory.request_estimate(cfg, data.n_bars, data.n_features, cpu=False)

    def mib(parts: dict[str, int]) -> str:
        return ", ".join(f"{name} {size / 2**20:,.1f} MiB" for name, size in parts.items())

    return (
        f"jdqn: memory plan: on a device, per learner: {mib(need.device)}; on the host: "
        f"{mib(need.host)}; {len(layout.devices)} device(s); learners at once per fold group: "
        f"{list(layout.wave_sizes)}"
    )
