"""Saved policies: each trained (fold, seed) of a walk-forward run, kept and loaded again.

A run saves one bundle per (fold, seed) that trained to its end (a halted run saves none) in
``<run>/policies/fold<k>_seed<s>/``, written into a temporary directory and renamed into place:

- ``arrays.npz``: ``params/<layer>/kernel``, ``params/<layer>/bias`` (the network's canonical
  per-layer tree, :mod:`jdqn.networks`: torso kernels [in, out], the head's [out, in]),
  ``masks/<layer>/...`` (the pruning masks, same shapes, {0, 1}), ``sn_u/<layer>`` (each torso
  layer's spectral-norm vector [H_l]), ``normaliser/mean`` and ``normaliser/std`` ([F] float64,
  the fold's train-window feature statistics). float32 unless said.
- ``policy.json``: ``format`` ("jdqn-policy"), ``version``, ``fold``, ``seed``, ``window`` (the
  fold's bar ranges and test-window times), ``config`` (the run's resolved config), ``features``
  (names, groups, lookback and clip), ``instrument`` (tick size, point value, cost, position grid,
  bar interval, median close and volume of the training bars), ``bars_per_year`` and
  ``param_layout`` (:meth:`jdqn.networks.ParamLayout.record`).

:func:`load_policy` returns a :class:`Policy`. Acting is the walk-forward's greedy pass
(``TrainProgram.evaluate``): at each bar the network sees the bar's normalised features and the
position held, takes argmax over the head-mean Q (ties: the lowest action) and holds that target
position over the next bar, so the decision at one bar depends on those before it and runs as one
sequential scan from ``start``, starting flat. The saved run's own test windows give the same
actions (tests/test_policy.py).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from jdqn import env, networks
from jdqn.config import Config
from jdqn.data import (
    BarFileError,
    Bars,
    Normaliser,
    WalkForwardData,
    compute_features,
    load_bars,
    normalise,
)
from jdqn.evaluate import Rollout, greedy_policy, rollout, trim

POLICIES = "policies"
FORMAT = "jdqn-policy"
VERSION = 1
# New bars whose median close is this many times above or below the training bars' are taken for
# another instrument (ES and NQ trade about 3.5x apart); the C51 support, costs and reward scale
# are set in index points of the instrument trained on.
PRICE_RATIO_LIMIT = 3.0
_OFF_TICK_LIMIT = 0.01  # more closes than this fraction off the tick grid: another instrument


class PolicyError(ValueError):
    """A run without the asked-for policy, or bars a policy cannot judge: one line with the fix."""


class Network(NamedTuple):
    """A policy's network as the greedy pass reads it."""

    params: networks.Params  # {layer: {"kernel", "bias"}} float32, the canonical tree
    masks: networks.Params  # same tree, {0, 1} float32
    sn_u: dict[str, jax.Array]  # {torso_l: [H_l] float32}


def head_mean_q(cfg: Config, network: Network, obs: jax.Array) -> jax.Array:
    """Q [B, A] of obs [B, F+1]: masked, spectral-normalised weights (stored ``u``), C51 head
    means over the ensemble; the learner's ``act_q``."""
    masked = jax.tree.map(jnp.multiply, network.params, network.masks)
    eff, _, _ = networks.effective_params(masked, None, network.sn_u, cfg.network, False)
    logits = networks.apply(eff, obs, cfg)  # [B, K, A, N]
    return jnp.mean(networks.q_values(logits, networks.atoms(cfg.network)), axis=-2)


@functools.partial(jax.jit, static_argnums=0)
def _greedy_rollout(cfg: Config, network: Network, params: env.EnvParams) -> Rollout:
    """The walk-forward's greedy pass (``TrainProgram.evaluate``) over ``params``' window."""

    def q_fn(obs: jax.Array) -> jax.Array:
        return head_mean_q(cfg, network, obs[None])[0]

    # The greedy policy and the environment draw nothing: the key only fills the signature.
    return rollout(greedy_policy(q_fn), params, jax.random.PRNGKey(0))


@functools.partial(jax.jit, static_argnums=0)
def _distributions(cfg: Config, network: Network, obs: jax.Array) -> jax.Array:
    """Head-mean C51 probabilities [B, A, N] of obs [B, F+1] (the mixture over the ensemble)."""
    masked = jax.tree.map(jnp.multiply, network.params, network.masks)
    eff, _, _ = networks.effective_params(masked, None, network.sn_u, cfg.network, False)
    return jnp.mean(jax.nn.softmax(networks.apply(eff, obs, cfg), axis=-1), axis=-3)


@dataclass(frozen=True, eq=False)  # eq=False: arrays have no single truth value
class Policy:
    """One trained (fold, seed) of a run: its network, feature normaliser and settings."""

    cfg: Config
    fold: int
    seed: int
    network: Network
    normaliser: Normaliser
    meta: dict[str, Any]  # policy.json

    @property
    def warmup_bars(self) -> int:
        """Bars of history before the first bar a policy acts on by default: the feature
        lookback, so every feature it sees is computed over its full window."""
        return self.cfg.data.lookback_bars

    @property
    def positions(self) -> np.ndarray:
        """[A] float64, action index -> target position (contracts)."""
        return np.asarray(self.cfg.env.positions, np.float64)

    @property
    def atoms(self) -> np.ndarray:
        """[N] float32, the C51 support (index points x reward scale) of :meth:`q`."""
        return np.asarray(networks.atoms(self.cfg.network))

    def bars(self, bars: pd.DataFrame | Bars | str | os.PathLike[str]) -> Bars:
        """Validated bars from a DataFrame (columns or a DatetimeIndex as in a bar file), a file
        path or :class:`jdqn.data.Bars`, checked against the bars the policy trained on."""
        loaded = bars if isinstance(bars, Bars) else _load(bars)
        check_bars(self.meta, loaded)
        return loaded

    def features(self, bars: Bars) -> np.ndarray:
        """[T, F] float32, the past-only features normalised with the fold's train statistics."""
        raw = compute_features(bars, self.cfg.data)
        if list(raw.names) != self.meta["features"]["names"]:
            raise PolicyError(
                f"this jdqn computes features {list(raw.names)}, the policy was trained on "
                f"{self.meta['features']['names']}; fix: use the jdqn version that trained it"
            )
        return normalise(raw.values, self.normaliser, self.cfg.data.feature_clip)

    def act(
        self, bars: pd.DataFrame | Bars | str | os.PathLike[str], start: int | None = None
    ) -> np.ndarray:
        """Target position (contracts) to hold after each bar, [T] float64: flat before bar
        ``start`` (default :attr:`warmup_bars`) the policy acts greedily at bars start..T-1,
        each decision seeing the position the one before chose. Entries before ``start`` are
        NaN. The last entry is the position to take now."""
        return self._act(self.bars(bars), start)[0]

    def q(
        self, bars: pd.DataFrame | Bars | str | os.PathLike[str], start: int | None = None
    ) -> np.ndarray:
        """Return distributions [T, A, N] float32 over :attr:`atoms` at each bar, for the
        position :meth:`act` held before it (head-mean probabilities); NaN before ``start``.
        ``q(bars) @ atoms`` is the expected return of each action."""
        loaded = self.bars(bars)
        positions, features, first = self._act(loaded, start)
        held = np.concatenate([[0.0], positions[first:-1]]).astype(np.float32)
        obs = np.concatenate([features[first:], held[:, None]], axis=1)
        rows = np.zeros((_bucket(len(obs)), obs.shape[1]), np.float32)  # one compile per bucket
        rows[: len(obs)] = obs
        probs = np.asarray(_distributions(self.cfg, self.network, jnp.asarray(rows)))[: len(obs)]
        out = np.full((len(loaded), *probs.shape[1:]), np.nan, np.float32)
        out[first:] = probs
        return out

    def evaluate(self, features: np.ndarray, close: np.ndarray) -> Rollout:
        """The walk-forward's greedy test-window pass over normalised ``features`` [T, F] and
        ``close`` [T], starting flat at row 0 (trimmed numpy record of T-1 actions)."""
        n_bars = len(close)
        # Padded to a bucket length with the window's end as data: windows of nearby lengths
        # (a live feed's growing bars) share one compiled pass. Steps past the end are zeroed
        # and trimmed; the window's steps are computed as without the padding.
        padding = _bucket(n_bars) - n_bars
        features = np.concatenate([features, np.zeros((padding, features.shape[1]), np.float32)])
        close = np.concatenate([close, np.full(padding, close[-1])])
        params = env.make_params(features, close, self.cfg.env, start=0, end=n_bars)
        return trim(_greedy_rollout(self.cfg, self.network, params), params)

    def _act(self, bars: Bars, start: int | None) -> tuple[np.ndarray, np.ndarray, int]:
        first = self.warmup_bars if start is None else int(start)
        if not 0 <= first < len(bars):
            raise PolicyError(
                f"act: start {first} is outside the {len(bars)} bars given; fix: pass at least "
                f"{first + 1} bars (the first {self.warmup_bars} are the features' warm-up) or "
                "a smaller start"
            )
        features = self.features(bars)
        # One more row repeats the last bar, so the pass also decides at the last bar (its
        # reward, from a zero price change, is not used).
        window = np.concatenate([features[first:], features[-1:]])
        close = np.concatenate([bars.close[first:], bars.close[-1:]])
        record = self.evaluate(window, close)
        positions = np.full(len(bars), np.nan)
        positions[first:] = record.positions
        return positions, features, first


def _bucket(n: int) -> int:
    """``n`` rounded up to 256 or to a multiple of 1/16-1/8 of it (under 12.5 % padding, a few
    lengths per doubling)."""
    if n <= 256:
        return 256
    step = 1 << (n.bit_length() - 4)
    return -(-n // step) * step


def _load(bars: pd.DataFrame | str | os.PathLike[str]) -> Bars:
    """A DataFrame goes through the bar-file loader (one set of rules for files and frames)."""
    if not isinstance(bars, pd.DataFrame):
        return load_bars(bars)
    frame = bars
    if isinstance(frame.index, pd.DatetimeIndex):
        frame = frame.rename_axis("timestamp").reset_index()
    with tempfile.TemporaryDirectory(prefix="jdqn-bars-") as tmp:
        path = Path(tmp) / "bars.parquet"
        frame.to_parquet(path, index=False)
        try:
            return load_bars(path)
        except BarFileError as error:
            raise BarFileError(
                "bars DataFrame", error.problem, error.fix, error.row, error.column
            ) from None


def bar_profile(bars: Bars) -> dict[str, Any]:
    """What :func:`check_bars` compares: bar interval (median seconds between bars), median
    close and whether the bars have volume."""
    steps = np.diff(bars.timestamp.astype("datetime64[ns]").astype(np.int64))
    return {
        "bar_seconds": float(np.median(steps) / 1e9) if steps.size else None,
        "median_close": float(np.median(bars.close)),
        "has_volume": bool(bars.has_volume),
    }


def check_bars(meta: dict[str, Any], bars: Bars) -> None:
    """Refuse bars of another instrument or with other features than the policy's (one line)."""
    trained = meta["instrument"]
    seen = bar_profile(bars)
    tick = float(trained["tick_size"])
    known = seen["bar_seconds"] is not None and trained["bar_seconds"] is not None
    if known and not np.isclose(seen["bar_seconds"], trained["bar_seconds"], rtol=0.01):
        raise PolicyError(
            f"the bars are {seen['bar_seconds']:g} s apart, the policy's training bars "
            f"{trained['bar_seconds']:g} s; fix: pass bars of the interval it was trained on"
        )
    ratio = seen["median_close"] / trained["median_close"]
    if not 1.0 / PRICE_RATIO_LIMIT <= ratio <= PRICE_RATIO_LIMIT:
        raise PolicyError(
            f"the bars trade around {seen['median_close']:g}, the policy's training bars around "
            f"{trained['median_close']:g}: another instrument?; fix: pass bars of the instrument "
            "the run was trained on"
        )
    ticks = bars.close / tick
    off_grid = np.mean(np.abs(ticks - np.round(ticks)) > 1e-3)
    if off_grid > _OFF_TICK_LIMIT:
        raise PolicyError(
            f"{off_grid:.0%} of the closes are off the policy's tick grid of {tick:g}: another "
            "instrument?; fix: pass bars of the instrument the run was trained on"
        )
    if seen["has_volume"] != trained["has_volume"]:
        have = "have" if seen["has_volume"] else "have no"
        had = "had" if trained["has_volume"] else "had none"
        raise PolicyError(
            f"the bars {have} volume, the policy's training bars {had}, so its volume feature "
            "would differ; fix: pass bars with the same columns as the training file"
        )


# --- saving and loading -------------------------------------------------------------------------


def save_run_policies(
    run_dir: Path,
    cfg: Config,
    data: WalkForwardData,
    layout: networks.ParamLayout,
    learner: Any,
    run_ids: list[tuple[int, int]],
    rows: list[dict[str, Any]],
    submit: Callable[..., None] | None = None,
) -> None:
    """A bundle for each run of a group (learner state leaves [R, ...], run r = ``run_ids[r]``)
    whose row says it trained to its end; each written by ``submit(save_policy, ...)`` (a
    writer thread's queue) or, without it, now."""
    stored = jax.device_get(learner.params)  # [R, n_params], or its leaves' segments [R, n_k]
    flat = np.concatenate(stored, axis=-1) if isinstance(stored, tuple) else np.asarray(stored)
    masks = np.asarray(jax.device_get(learner.masks))
    sn_u = {name: np.asarray(u) for name, u in jax.device_get(learner.sn_u).items()}
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
        network = Network(
            params=layout.unravel(flat[r]),
            masks=layout.unravel(masks[r]),
            sn_u={name: u[r] for name, u in sn_u.items()},
        )
        save = functools.partial(
            save_policy,
            run_dir,
            fold=fold,
            seed=seed,
            network=network,
            normaliser=data.normalisers[fold],
            meta={**common, "window": row["window"], "instrument": instrument},
        )
        if submit is None:
            save()
        else:
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
    arrays: dict[str, np.ndarray] = {}
    for prefix, tree in (("params", network.params), ("masks", network.masks)):
        for layer, leaves in tree.items():
            for leaf, value in leaves.items():
                arrays[f"{prefix}/{layer}/{leaf}"] = np.asarray(value, np.float32)
    for layer, u in network.sn_u.items():
        arrays[f"sn_u/{layer}"] = np.asarray(u, np.float32)
    arrays["normaliser/mean"] = np.asarray(normaliser.mean, np.float64)
    arrays["normaliser/std"] = np.asarray(normaliser.std, np.float64)
    record = {"format": FORMAT, "version": VERSION, "fold": fold, "seed": seed, **meta}
    final = bundle_dir(run_dir, fold, seed)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        np.savez(staging / "arrays.npz", **arrays)  # type: ignore[arg-type]  # keyword arrays
        text = json.dumps(record, indent=2, sort_keys=True, allow_nan=False) + "\n"
        (staging / "policy.json").write_text(text)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def saved_policies(run_dir: str | os.PathLike[str]) -> list[tuple[int, int]]:
    """(fold, seed) of every bundle in a run directory, sorted."""
    found = []
    for path in (Path(run_dir) / POLICIES).glob("fold*_seed*"):
        fold, _, seed = path.name.removeprefix("fold").partition("_seed")
        if fold.isdigit() and seed.isdigit() and (path / "policy.json").is_file():
            found.append((int(fold), int(seed)))
    return sorted(found)


def load_policy(run_dir: str | os.PathLike[str], fold: int | None = None, seed: int = 0) -> Policy:
    """The policy of (``fold``, ``seed``) saved by a walk-forward run; ``fold`` None: the last
    fold (trained on the newest bars). Raises :class:`PolicyError` (one line) when it is not
    there."""
    run = Path(run_dir)
    if not run.is_dir():
        raise PolicyError(f"{run}: no such run directory; fix: pass a walk-forward run directory")
    saved = saved_policies(run)
    if not saved:
        raise PolicyError(
            f"{run}: no saved policies (the run saved none: it predates saved policies or every "
            "run of it halted); fix: train it again with this jdqn"
        )
    folds = sorted({f for f, _ in saved})
    fold = folds[-1] if fold is None else int(fold)
    if (fold, seed) not in saved:
        listed = ", ".join(f"fold {f} seed {s}" for f, s in saved)
        raise PolicyError(
            f"{run}: no policy for fold {fold} seed {seed} (halted runs save none); "
            f"fix: pick one of: {listed}"
        )
    path = bundle_dir(run, fold, seed)
    meta = json.loads((path / "policy.json").read_text())
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise PolicyError(
            f"{path}: a policy of format {meta.get('format')!r} version {meta.get('version')!r}, "
            f"this jdqn reads {FORMAT!r} version {VERSION}; fix: use the jdqn that wrote it"
        )
    with np.load(path / "arrays.npz") as stored:
        arrays = {name: stored[name] for name in stored.files}
    tree: dict[str, dict[str, dict[str, np.ndarray]]] = {"params": {}, "masks": {}}
    sn_u: dict[str, jax.Array] = {}
    for name, value in arrays.items():
        parts = name.split("/")
        if parts[0] in tree:
            tree[parts[0]].setdefault(parts[1], {})[parts[2]] = value
        elif parts[0] == "sn_u":
            sn_u[parts[1]] = jnp.asarray(value)
    as_jax = lambda t: jax.tree.map(jnp.asarray, t)
    return Policy(
        cfg=Config.from_dict(meta["config"]),
        fold=fold,
        seed=seed,
        network=Network(as_jax(tree["params"]), as_jax(tree["masks"]), sn_u),
        normaliser=Normaliser(mean=arrays["normaliser/mean"], std=arrays["normaliser/std"]),
        meta=meta,
    )
