"""What a run's checkpoints belong to: its resolved config, its learners and its data file
(docs/design.md §18). ``binding.json`` holds that record, its SHA-256 and the digests a resume
accepts; every checkpoint's metadata carries the digest, and ``--resume`` refuses a difference in
one line unless ``--resume-changed`` takes a config or data change (never other learners).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from jdqn.config import Config
from jdqn.run import rundir

BINDING_FILE = "binding.json"


class BindingError(ValueError):
    """A resume whose config, learners or data differ from the run's record: one line."""


class Seal(NamedTuple):
    """The digest a run's new checkpoints carry, those a restore accepts (the run's records
    before a --resume-changed included), and the changes the run has taken."""

    sha256: str
    accepted: frozenset[str]
    changes: tuple[str, ...]


def current(cfg: Config, n_folds: int, processes: int, data_sha256: str | None) -> dict[str, Any]:
    """The record of a run about to train: the config without its output section (where and
    how results are written does not change them), the learners and the data file's digest."""
    config = json.loads(cfg.to_json())
    config.pop("output", None)
    learners = {"folds": n_folds, "seeds": cfg.train.seeds, "seed": cfg.train.seed}
    learners["processes"] = processes
    return {"config": config, "learners": learners, "data_sha256": data_sha256}


def digest(record: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def fresh(record: dict[str, Any]) -> Seal:
    """The seal of a new run."""
    return Seal(digest(record), frozenset({digest(record)}), ())


def _flat(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def differences(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What changed, each as ``name old -> new`` (config fields, learners, the data file)."""
    changed = []
    for section in ("learners", "config"):
        old, new = dict(_flat(recorded[section])), dict(_flat(now[section]))
        for key in sorted(old.keys() | new.keys()):
            if old.get(key) != new.get(key):
                name = f"learners.{key}" if section == "learners" else key
                changed.append(f"{name} {old.get(key)!r} -> {new.get(key)!r}")
    if recorded["data_sha256"] != now["data_sha256"]:
        short = [(d or "none")[:12] for d in (recorded["data_sha256"], now["data_sha256"])]
        changed.append(f"the data file's SHA-256 {short[0]} -> {short[1]}")
    return changed


def check_resume(
    run_path: Path, now: dict[str, Any], allow_changes: bool, log: Callable[[str], None]
) -> Seal | None:
    """Refuse (:class:`BindingError`) a resume whose record differs from the run's, unless
    ``allow_changes`` and the learners are the same: then log the change and return the seal
    that records it (:func:`write` writes it). None for a run from before binding.json
    (nothing to compare with; its checkpoints are not checked)."""
    try:
        state = json.loads((run_path / BINDING_FILE).read_text())
        recorded, accepted, changes = state["record"], state["accepted"], state["changes"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise BindingError(
            f"--resume {run_path}: cannot read its {BINDING_FILE} ({error}); fix: start a new run"
        ) from None
    changed = differences(recorded, now)
    if not changed:
        return Seal(digest(now), frozenset(accepted), tuple(changes))
    what = "; ".join(changed[:3]) + (f"; and {len(changed) - 3} more" if len(changed) > 3 else "")
    if now["learners"] != recorded["learners"]:
        raise BindingError(
            f"--resume {run_path}: the learners changed since the run started ({what}); fix: "
            "restore config.json, or start a new run"
        )
    if not allow_changes:
        raise BindingError(
            f"--resume {run_path}: changed since the run started: {what}; fix: restore config.json "
            "and the data file, or pass --resume-changed to continue with the change (recorded "
            "in results.json)"
        )
    log(f"jdqn: resuming with changes (--resume-changed): {what}")
    return Seal(digest(now), frozenset({*accepted, digest(now)}), (*changes, *changed))


def write(run_path: Path, now: dict[str, Any], seal: Seal) -> None:
    """``binding.json`` of a new run, or of a resume (that may have taken changes); process 0."""
    state = {"record": now, "sha256": seal.sha256, "accepted": sorted(seal.accepted)}
    rundir.write_json(run_path / BINDING_FILE, state | {"changes": list(seal.changes)})
