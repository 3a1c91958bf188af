"""Debug mode (docs/design.md §9): runtime value checks at component boundaries, named failures.

:func:`boundaries` gives :class:`Boundaries`, whose methods add ``jax.experimental.checkify``
checks, or :data:`OFF`, whose methods trace nothing, so with debug off the compiled program is the
plain one. :func:`checked` functionalises the checks; the walk-forward vmaps the *checked* chunk
program over runs (one error entry per run) and fetches the error with the chunk's metrics, so no
step waits for the host. :func:`raise_if_failed` names component, tensor, fold, seed, epoch and
step, records ``debug_failure.json`` and raises :class:`DebugCheckFailed`.

checkify directly, not ``chex.chexify(jit(vmap(...)))``: chexify must wrap the outermost
transformation and would reduce the batched error to one entry, losing which run failed. One
payload shape for every check: checkify keeps the first failure *per payload shape*, so with one
shape it keeps the first in time, the boundary where the non-finite value entered.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from jdqn.run import rundir

FAILURE_FILE = "debug_failure.json"

# Every check formats the same three scalars (one payload shape: see the module docstring).
_PREFIX = "jdqn-debug"
_MESSAGE = re.compile(
    r"(?:at mapped index (?P<run>\d+): )?"
    + _PREFIX
    + r"\|(?P<component>[^|]*)\|(?P<tensor>[^|]*)\|(?P<problem>[^|]*)"
    r"\|step=(?P<step>-?\d+)\|count=(?P<count>-?\d+)\|value=(?P<value>\S+)"
)


def _escape(text: str) -> str:
    """Literal text inside a checkify format string."""
    return text.replace("{", "{{").replace("}", "}}").replace("|", "/")


class Boundaries:
    """Value checks at the component boundaries of one learner step (debug on): each names its
    component and tensor, and reports the ``step``, the offending entries' count and one value."""

    def __init__(self, step: jax.Array) -> None:
        self._step = jnp.asarray(step, jnp.int32)  # [] int32

    def _check(
        self, ok: jax.Array, component: str, tensor: str, problem: str, count: Any, value: Any
    ) -> None:
        checkify.check(
            ok,
            f"{_PREFIX}|{_escape(component)}|{_escape(tensor)}|{_escape(problem)}"
            "|step={step}|count={count}|value={value}",
            step=self._step,
            count=jnp.asarray(count, jnp.int32),
            value=jnp.asarray(value, jnp.float32),
        )

    def finite(self, component: str, tensor: str, tree: Any) -> None:
        """Every entry of every leaf is finite (one check per leaf, named by its tree path)."""
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            x = jnp.ravel(jnp.asarray(leaf, jnp.float32))
            bad = ~jnp.isfinite(x)
            first = x[jnp.argmax(bad)] if x.size else jnp.float32(0)
            name = tensor + jax.tree_util.keystr(path)
            self._check(~jnp.any(bad), component, name, "non-finite", jnp.sum(bad), first)

    def finite_norm(self, component: str, tensor: str, tree: Any) -> None:
        """Finite entries whose squared norm also stays finite in float32 (what the guard's
        parameter check overflows on: entries near 1e19 and beyond)."""
        self.finite(component, tensor, tree)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            squared = jnp.sum(jnp.square(jnp.asarray(leaf, jnp.float32)))
            name, problem = tensor + jax.tree_util.keystr(path), "squared norm overflows float32"
            count, largest = jnp.sum(~jnp.isfinite(jnp.square(leaf))), jnp.max(jnp.abs(leaf))
            self._check(jnp.isfinite(squared), component, name, problem, count, largest)

    def within(self, component: str, tensor: str, x: jax.Array, low: float, high: float) -> None:
        """Finite and inside ``[low, high]``."""
        self.finite(component, tensor, x)
        x = jnp.asarray(x, jnp.float32)
        outside = (x < low) | (x > high)
        worst = jnp.ravel(x)[jnp.argmax(jnp.ravel(jnp.maximum(low - x, x - high)))]  # > 0 outside
        problem = f"outside [{low:.6g}, {high:.6g}]"
        self._check(~jnp.any(outside), component, tensor, problem, jnp.sum(outside), worst)

    def distribution(self, component: str, tensor: str, probs: jax.Array, atol: float) -> None:
        """Probabilities over the last axis: finite, in ``[0, 1]`` and rows summing to 1, both
        within ``atol`` (float32 sums of a kernel's partial masses land on 1 + 1e-7)."""
        self.within(component, tensor, probs, -atol, 1.0 + atol)
        sums = jnp.sum(jnp.asarray(probs, jnp.float32), axis=-1)
        error = jnp.abs(sums - 1.0)
        off, worst = error > atol, jnp.ravel(sums)[jnp.argmax(jnp.ravel(error))]
        problem = f"row sums differ from 1 by more than {atol:g}"
        self._check(~jnp.any(off), component, tensor, problem, jnp.sum(off), worst)


class _Off:
    """Debug off: the same methods, nothing traced."""

    def _nothing(self, *args: Any) -> None:
        del args

    finite = finite_norm = within = distribution = _nothing


OFF = _Off()


def boundaries(enabled: bool, step: jax.Array) -> Boundaries | _Off:
    """The checks of one learner step at ``step``: real ones when ``enabled``, else :data:`OFF`."""
    return Boundaries(step) if enabled else OFF


def checked(fn: Any) -> Any:
    """``fn`` with its checks functionalised: returns ``(checkify.Error, fn's outputs)``. Vmap the
    result (not the other way round) to keep one error entry per run."""
    return checkify.checkify(fn, errors=checkify.user_checks)


@dataclass(frozen=True)
class CheckFailure:
    """One failed boundary check, located in the walk-forward run."""

    component: str
    tensor: str
    problem: str
    count: int  # offending entries (rows for row sums)
    value: float  # one offending value (NaN, inf, the worst out-of-range entry or row sum)
    step: int  # 0-based learner step, like the guard's record
    fold: int | None = None
    seed: int | None = None
    epoch: int | None = None  # 1-based, like the guard's status
    chunk: int | None = None  # 0-based chunk of the epoch

    @property
    def message(self) -> str:
        labels = {"fold": self.fold, "seed": self.seed, "epoch": self.epoch, "step": self.step}
        where = " ".join(f"{label} {value}" for label, value in labels.items() if value is not None)
        return (
            f"debug check failed in {self.component}: {self.tensor} {self.problem} "
            f"({self.count} entries, e.g. {self.value:.9g}) at {where}"
        )

    def to_json(self) -> dict[str, Any]:
        row = asdict(self)
        row["value"] = self.value if math.isfinite(self.value) else repr(self.value)
        row["message"] = self.message
        return row


class DebugCheckFailed(Exception):
    """A debug check failed; ``failure`` says where. The CLI reports it in one line."""

    def __init__(self, failure: CheckFailure, record: Path | None = None) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.record = record


def failures(error: checkify.Error) -> list[tuple[int | None, CheckFailure]]:
    """Every failure in ``error`` as ``(run index or None when unbatched, failure)``; the
    location fields other than ``step`` are left ``None``."""
    text = error.get()
    if text is None:
        return []
    found = []
    for line in text.splitlines():
        match = _MESSAGE.search(line)
        if match is None:  # a check that is not ours: report it as it is
            raise RuntimeError(f"unexpected checkify failure: {line}")
        failure = CheckFailure(
            match["component"],
            match["tensor"],
            match["problem"],
            count=int(match["count"]),
            value=float(match["value"]),
            step=int(match["step"]),
        )
        found.append((None if match["run"] is None else int(match["run"]), failure))
    return found


def first_failure(
    error: checkify.Error, run_ids: Sequence[tuple[int, int]], epoch: int, chunk: int
) -> tuple[CheckFailure, list[CheckFailure]] | None:
    """The earliest failure of a vmapped chunk (lowest learner step, then run index), located by
    ``run_ids[run] = (fold, seed)``; also the other runs' failures. ``epoch`` is 0-based."""
    located = []
    for run, failure in sorted(failures(error), key=lambda item: (item[1].step, item[0] or 0)):
        fold, seed = run_ids[run or 0]
        located.append(replace(failure, fold=fold, seed=seed, epoch=epoch + 1, chunk=chunk))
    return (located[0], located[1:]) if located else None


def raise_if_failed(
    error: checkify.Error,
    *,
    run_ids: Sequence[tuple[int, int]],
    epoch: int,
    chunk: int,
    run_dir: Path,
) -> None:
    """Fetch a chunk's error value; on failure write ``debug_failure.json`` into ``run_dir`` (the
    ``.incomplete`` directory, left incomplete) and raise :class:`DebugCheckFailed`."""
    found = first_failure(error, run_ids, epoch, chunk)
    if found is None:
        return
    failure, others = found
    record = run_dir / FAILURE_FILE
    others_json = [f.to_json() for f in others]
    rundir.write_json(record, {"failure": failure.to_json(), "other_runs": others_json})
    raise DebugCheckFailed(failure, record)
