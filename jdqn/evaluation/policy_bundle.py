"""Policy bundles: the files a walk-forward run keeps of each trained (fold, seed).

A run saves one bundle per (fold, seed) that trained to its end (a halted run saves none) in
``<run>/policies/fold<k>_seed<s>/``, written into a temporary directory and renamed into place:

- ``arrays.npz``: ``params/<layer>/kernel``, ``params/<layer>/bias`` (the network's canonical
  per-layer tree, :mod:`jdqn.agent.networks`: torso kernels [in, out], the head's [out, in]),
  ``masks/<layer>/...`` (the pruning masks, same shapes, {0, 1}), ``sn_u/<layer>`` (each torso
  layer's spectral-norm vector [H_l]), ``normaliser/mean`` and ``normaliser/std`` ([F] float64,
  the fold's train-window feature statistics). float32 unless said.
- ``policy.json``: ``format`` ("jdqn-policy"), ``version``, ``fold``, ``seed``, ``window`` (the
  fold's bar ranges and test-window times), ``config`` (the run's resolved config), ``source``,
  ``features`` (names, groups, lookback and clip), ``instrument`` (tick size, point value, cost,
  position grid, bar interval, median close and volume of the training bars), ``bars_per_year``
  and ``param_layout`` (:meth:`jdqn.agent.networks.ParamLayout.record`).
- ``manifest.json``: ``fold``, ``seed``, ``param_layout`` and the SHA-256 of ``arrays.npz`` and
  ``policy.json``; reading a bundle verifies it, so a damaged file, a file or directory swapped
  between folds, or a network that is not the config's is refused in one line, as are NaN
  parameters and a normaliser std that is not positive.

:func:`jdqn.evaluation.policy.load_policy` reads one back as a
:class:`jdqn.evaluation.policy.Policy`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jdqn.agent import networks
from jdqn.config import Config
from jdqn.data import Normaliser, WalkForwardData
from jdqn.run import rundir

POLICIES = "policies"
FORMAT = "jdqn-policy"
VERSION = 2  # 2: manifest.json
MANIFEST = "manifest.json"


class PolicyError(ValueError):
    """A run without the asked-for policy, or bars a policy cannot judge: one line with the fix."""


class Network(NamedTuple):
    """A policy's network as the greedy pass reads it."""

    params: networks.Params  # {layer: {"kernel", "bias"}} float32, the canonical tree
    masks: networks.Params  # same tree, {0, 1} float32
    sn_u: dict[str, jax.Array]  # {torso_l: [H_l] float32}


def save_run_policies(
    run_dir: Path,
    cfg: Config,
    data: WalkForwardData,
    layout: networks.ParamLayout,
    network: Network,
    run_ids: list[tuple[int, int]],
    rows: list[dict[str, Any]],
    submit: Callable[..., None],
) -> None:
    """A bundle for each run of a group (``network``'s leaves [R, ...], run r = ``run_ids[r]``)
    whose row says it trained to its end, each written by ``submit(save)`` (a writer's queue)."""
    stacked = jax.tree.map(np.asarray, jax.device_get(network))  # leaves [R, ...]
    common = {
        "config": json.loads(cfg.to_json()),
        "source": data.source,
        "bars_per_year": data.bars_per_year,
        "features": {
            "names": list(data.feature_names),
            "groups": {name: list(ids) for name, ids in data.feature_groups.items()},
            "lookback_bars": cfg.data.lookback_bars,
            "clip": cfg.data.feature_clip,
        },
        "param_layout": layout.record(),
    }
    stamps = [np.asarray(t, "datetime64[ns]").astype(np.int64) for t in data.test_timestamps]
    bar_seconds = float(np.median(np.concatenate([np.diff(t) for t in stamps])) / 1e9)
    for r, ((fold, seed), row) in enumerate(zip(run_ids, rows, strict=True)):
        if row["status"] != "ok":
            continue
        instrument = {
            "tick_size": cfg.env.tick_size,
            "point_value_usd": cfg.env.point_value_usd,
            "cost_points": cfg.env.cost_points,
            "positions": list(cfg.env.positions),
            "bar_seconds": bar_seconds,
            "median_close": float(np.median(data.train[fold].close)),
            "has_volume": data.has_volume,
        }
        save = functools.partial(
            save_policy,
            run_dir,
            fold=fold,
            seed=seed,
            network=jax.tree.map(lambda x, r=r: x[r], stacked),
            normaliser=data.normalisers[fold],
            meta={**common, "window": row["window"], "instrument": instrument},
        )
        submit(save)


def bundle_dir(run_dir: str | os.PathLike[str], fold: int, seed: int) -> Path:
    return Path(run_dir) / POLICIES / f"fold{fold}_seed{seed}"


def save_policy(
    run_dir: Path,
    *,
    fold: int,
    seed: int,
    network: Network,
    normaliser: Normaliser,
    meta: dict[str, Any],
) -> Path:
    """Write one bundle (module docstring) atomically: a temporary directory renamed into place,
    replacing a bundle of the same name (a resumed run judges its folds again)."""
    float32 = jax.tree.map(lambda leaf: np.asarray(leaf, np.float32), network._asdict())
    statistics = {"mean": normaliser.mean, "std": normaliser.std}
    float64 = jax.tree.map(lambda leaf: np.asarray(leaf, np.float64), statistics)
    # params/<layer>/<leaf>, masks/<layer>/<leaf>, sn_u/<layer>, normaliser/mean and std
    arrays = rundir.named_arrays({**float32, "normaliser": float64})
    record = {"format": FORMAT, "version": VERSION, "fold": fold, "seed": seed, **meta}
    final = bundle_dir(run_dir, fold, seed)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = rundir.make_staging_dir(final)
    try:
        rundir.write_arrays(staging / "arrays.npz", arrays)
        text = json.dumps(record, indent=2, sort_keys=True, allow_nan=False) + "\n"
        (staging / "policy.json").write_text(text)
        digests = {name: _sha256(staging / name) for name in ("arrays.npz", "policy.json")}
        manifest = {"fold": fold, "seed": seed, "param_layout": meta.get("param_layout")}
        (staging / MANIFEST).write_text(json.dumps({**manifest, "sha256": digests}, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def saved_policies(run_dir: str | os.PathLike[str]) -> list[tuple[int, int]]:
    """(fold, seed) of every bundle directory in a run directory, sorted."""
    found = []
    for path in (Path(run_dir) / POLICIES).glob("fold*_seed*"):
        fold, _, seed = path.name.removeprefix("fold").partition("_seed")
        if fold.isdigit() and seed.isdigit():  # a damaged bundle is refused when read
            found.append((int(fold), int(seed)))
    return sorted(found)


def read_bundle(
    run_dir: str | os.PathLike[str], fold: int | None = None, seed: int = 0
) -> tuple[int, dict[str, Any], Network, Normaliser]:
    """(fold, policy.json, network, normaliser) of the bundle of (``fold``, ``seed``); ``fold``
    None: the run's last. Raises :class:`PolicyError` (one line) when it is not there."""
    run = Path(run_dir)
    if not run.is_dir():
        raise PolicyError(f"{run}: no such run directory; fix: pass a walk-forward run directory")
    saved = saved_policies(run)
    if not saved:
        raise PolicyError(
            f"{run}: no saved policies (the run saved none: it predates saved policies or every "
            "run of it halted); fix: train it again with this jdqn"
        )
    fold = _last_fold(run, saved) if fold is None else int(fold)
    if (fold, seed) not in saved:
        listed = ", ".join(f"fold {f} seed {s}" for f, s in saved)
        raise PolicyError(
            f"{run}: no policy for fold {fold} seed {seed} (halted runs save none); "
            f"fix: pick one of: {listed}"
        )
    path = bundle_dir(run, fold, seed)
    meta, arrays = _verified(path, fold, seed)
    tree: dict[str, dict[str, Any]] = {"params": {}, "masks": {}, "sn_u": {}}
    for name, value in arrays.items():
        kind, *layers, leaf = name.split("/")  # sn_u/<layer>, params/<layer>/<leaf>, ...
        if kind in tree:
            node = tree[kind]
            for layer in layers:
                node = node.setdefault(layer, {})
            node[leaf] = value
    _check_network(path, meta, tree)
    network = Network(**jax.tree.map(jnp.asarray, tree))
    normaliser = Normaliser(mean=arrays["normaliser/mean"], std=arrays["normaliser/std"])
    return fold, meta, network, normaliser


def _last_fold(run: Path, saved: list[tuple[int, int]]) -> int:
    """The run's last fold: of its results when it has them (a missing bundle is then refused,
    never replaced by an earlier fold's), else of its bundle directories."""
    folds = {f for f, _ in saved}
    # No results (a directory of bundles, or an unfinished run): the bundles say.
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        rows = json.loads((run / "results.json").read_text())["folds"]
        folds |= {int(row["fold"]) for row in rows}
    return max(folds)


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _verified(path: Path, fold: int, seed: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """policy.json and the arrays of the bundle at ``path``, checked against its manifest (the
    files' SHA-256, the fold and seed) and for finite values (:class:`PolicyError`, one line)."""
    again = "fix: train the run again (or restore the bundle from a copy)"
    try:
        meta = json.loads((path / "policy.json").read_text())
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise PolicyError(
                f"{path}: a policy of format {meta.get('format')!r} version "
                f"{meta.get('version')!r}, this jdqn reads {FORMAT!r} version {VERSION}; fix: use "
                "the jdqn that wrote it"
            )
        manifest = json.loads((path / MANIFEST).read_text())
        if set(manifest["sha256"]) != {"arrays.npz", "policy.json"}:
            raise PolicyError(
                f"{path / MANIFEST} does not list arrays.npz and policy.json; {again}"
            )
        for name, digest in manifest["sha256"].items():
            if _sha256(path / name) != digest:
                damaged = f"{path / name} does not match its SHA-256 in {MANIFEST}"
                raise PolicyError(f"{damaged}; {again}")
        owners = {(manifest["fold"], manifest["seed"]), (meta["fold"], meta["seed"])}
        if owners != {(fold, seed)}:
            held = ", ".join(f"fold {f} seed {s}" for f, s in sorted(owners))
            raise PolicyError(f"{path} holds the policy of {held} (moved or copied?); {again}")
        arrays = rundir.read_arrays(path / "arrays.npz")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile) as error:
        if isinstance(error, PolicyError):
            raise
        reason = (isinstance(error, OSError) and error.strerror) or type(error).__name__
        raise PolicyError(f"{path}: not a readable policy bundle ({reason}); {again}") from None
    for name, value in arrays.items():
        if not np.isfinite(value).all():
            raise PolicyError(f"{path}: {name} holds NaN or infinite values; {again}")
    if not np.all(arrays.get("normaliser/std", np.zeros(1)) > 0):
        raise PolicyError(f"{path}: normaliser/std is missing or not positive; {again}")
    return meta, arrays


def _check_network(path: Path, meta: dict[str, Any], tree: dict[str, dict[str, Any]]) -> None:
    """Refuse parameters or masks that are not the network of the bundle's config."""
    try:
        cfg = Config.from_dict(meta["config"])
        layout = networks.param_layout(cfg, len(meta["features"]["names"]) + 1)
    except (KeyError, TypeError, ValueError) as error:
        raise PolicyError(
            f"{path}: policy.json holds no valid config and features ({type(error).__name__}); "
            "fix: train the run again"
        ) from None
    expected = [[name, list(shape)] for name, shape in layout.record()]
    for kind in ("params", "masks"):
        leaves = jax.tree_util.tree_flatten_with_path(tree[kind])[0]
        found = [[jax.tree_util.keystr(p), list(np.shape(x))] for p, x in leaves]
        if found != expected or meta.get("param_layout") != expected:
            raise PolicyError(
                f"{path}: its {kind} are not the network its policy.json describes "
                f"({cfg.network.hidden} hidden); fix: train the run again"
            )
