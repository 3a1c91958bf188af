"""Numbers every config field must hold, whatever its own section checks: finite floats within
float32's range, ints within int32's, seeds in [0, 2**31), and step counts that fit the program's
int32 counters (it computes in float32 and counts in int32). :func:`check_numbers` runs first in
``Config`` validation, so ``optim.learning_rate=inf`` fails there, naming the field and the fix,
not when ``results.json`` refuses it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from typing import Any

import numpy as np

FLOAT32_MAX = float(np.finfo(np.float32).max)  # ~3.4e38
INT32_MAX = int(np.iinfo(np.int32).max)  # 2,147,483,647
SEED_FIELDS = ("data.synthetic_seed", "train.seed")  # keys and numpy generators: [0, 2**31)


@functools.cache
def field_types(section_cls: type) -> dict[str, Any]:
    """A section's field name -> resolved annotation (the modules use postponed annotations)."""
    return typing.get_type_hints(section_cls)


def _is_float_field(annotation: Any) -> bool:
    """``float``, ``float | None`` or ``tuple[float, ...]``."""
    return annotation is float or any(_is_float_field(a) for a in typing.get_args(annotation))


def _check_value(name: str, value: Any, float_field: bool) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, tuple | list):
        for item in value:
            _check_value(name, item, float_field)
        return
    if isinstance(value, float) or (float_field and isinstance(value, int)):
        try:
            number = float(value)
        except OverflowError:  # an int past float64's range
            number = math.copysign(math.inf, value)
        if math.isnan(number) or (math.isinf(number) and isinstance(value, float)):
            raise ValueError(f"{name}: {value!r} is not a finite number; fix: give a finite value")
        if abs(number) > FLOAT32_MAX:
            raise ValueError(
                f"{name}: {value!r} is beyond float32's range (+-{FLOAT32_MAX:.3g}), in which the "
                "program computes; fix: give a value of sensible size"
            )
        return
    if isinstance(value, int):
        low = 0 if name in SEED_FIELDS else -INT32_MAX
        if not low <= value <= INT32_MAX:
            raise ValueError(
                f"{name}: {value} is outside [{low:,}, {INT32_MAX:,}] (the program counts in "
                "int32); fix: give a smaller value"
            )


def check_section(section: str, section_cls: type, values: dict[str, Any]) -> None:
    """The numbers of one section's field values, before the section's own checks (which would
    otherwise name another field: ``v_max=-inf`` fails ``v_min < v_max``)."""
    types = field_types(section_cls)
    for key, value in values.items():
        _check_value(f"{section}.{key}", value, _is_float_field(types[key]))


def check_numbers(cfg: Any) -> None:
    """Every number of every section of ``cfg`` (a ``Config``), then the derived step counts."""
    for section in dataclasses.fields(cfg):
        values = getattr(cfg, section.name)
        check_section(section.name, type(values), dataclasses.asdict(values))
    train, env = cfg.train, cfg.env
    derived = {
        "env.tick_size": env.cost_points * max(abs(p) for p in env.positions) * 2,
        "network.v_max": cfg.network.v_max - cfg.network.v_min,
    }
    for name, value in derived.items():
        if not abs(value) <= FLOAT32_MAX:
            raise ValueError(
                f"{name}: the costs or value range it gives ({value:.3g}) overflow float32; fix: "
                "give a value of sensible size"
            )
    iterations = (cfg.walkforward.train_bars // train.n_slices) * train.epochs
    learner_steps = iterations * train.updates_per_iteration
    if learner_steps > INT32_MAX:
        raise ValueError(
            f"train.epochs: {train.epochs} epochs make {learner_steps:,} learner steps, more than "
            f"the int32 step counter holds ({INT32_MAX:,}); fix: fewer epochs or updates"
        )
    json.dumps(cfg.to_dict(), allow_nan=False)  # what config.json and results.json will hold
