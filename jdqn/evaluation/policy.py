"""Saved policies: each trained (fold, seed) of a walk-forward run, loaded again to act on bars
(docs/design.md §16). Acting is the walk-forward's greedy pass (``TrainProgram.evaluate``): one
sequential scan from flat, argmax over the head-mean Q (ties: the lowest action), so the run's own
test windows give the same actions (tests/evaluation/test_policy.py).
"""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from jdqn.agent import acting, networks
from jdqn.config import Config, DataConfig
from jdqn.data import BarFileError, Bars, Normaliser, compute_features, normalise, read_bars
from jdqn.evaluation import env
from jdqn.evaluation.policy_bundle import Network, PolicyError, read_bundle, saved_policies
from jdqn.evaluation.rollouts import Rollout, greedy_policy, rollout, trim

__all__ = ["Policy", "PolicyError", "check_bars", "head_mean_q", "load_policy", "saved_policies"]

# New bars whose median close is this many times above or below the training bars' are taken for
# another instrument (ES and NQ trade about 3.5x apart); the C51 support, costs and reward scale
# are set in index points of the instrument trained on.
PRICE_RATIO_LIMIT = 3.0
_OFF_TICK_LIMIT = 0.01  # more closes than this fraction off the tick grid: another instrument


type BarsLike = pd.DataFrame | Bars | str | os.PathLike[str]


def _logits(cfg: Config, network: Network, obs: jax.Array) -> jax.Array:
    """Logits [B, K, A, N] of obs [B, F+1], masked and spectral-normalised (stored ``u``)."""
    eff, _, _ = networks.effective_params(*network, cfg.network, False)
    return networks.apply(eff, obs, cfg)


def head_mean_q(cfg: Config, network: Network, obs: jax.Array) -> jax.Array:
    """Acting scores [B, A] of obs [B, F+1], the learner's ``act_q``: C51 head means over the
    ensemble, with the risk penalty and no-trade band when set (``jdqn.agent.acting``)."""
    return acting.action_scores(_logits(cfg, network, obs), obs[..., -1], cfg)


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
    return jnp.mean(jax.nn.softmax(_logits(cfg, network, obs), axis=-1), axis=-3)


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

    def bars(self, bars: BarsLike) -> Bars:
        """Validated bars from a DataFrame (columns or a DatetimeIndex as in a bar file), a file
        path or :class:`jdqn.data.Bars`, checked against the bars the policy trained on. Files
        and frames are read as the run read its own (``cfg.data``: columns, time zone, timestamp
        format, calendar); for other settings, pass ``jdqn.data.read_bars(settings, path)``."""
        loaded = bars if isinstance(bars, Bars) else _load(bars, self.cfg.data)
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

    def act(self, bars: BarsLike, start: int | None = None) -> np.ndarray:
        """Target position (contracts) to hold after each bar, [T] float64: flat before bar
        ``start`` (default :attr:`warmup_bars`) the policy acts greedily at bars start..T-1,
        each decision seeing the position the one before chose. Entries before ``start`` are
        NaN. The last entry is the position to take now."""
        return self._act(self.bars(bars), start)[0]

    def q(self, bars: BarsLike, start: int | None = None) -> np.ndarray:
        """Return distributions [T, A, N] float32 over :attr:`atoms` at each bar, for the
        position :meth:`act` held before it (head-mean probabilities); NaN before ``start``.
        ``q(bars) @ atoms`` is the expected return of each action (with
        ``network.post_trade_values``: of the position after its trade, less the trade's cost
        from the held position, ``jdqn.agent.acting.trade_costs``)."""
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


def _load(bars: pd.DataFrame | str | os.PathLike[str], settings: DataConfig) -> Bars:
    """A DataFrame goes through the bar-file loader (one set of rules for files and frames)."""
    if not isinstance(bars, pd.DataFrame):
        return read_bars(settings, bars)
    frame = bars
    if isinstance(frame.index, pd.DatetimeIndex) and "timestamp" not in frame.columns:
        frame = frame.rename_axis("timestamp").reset_index()
    with tempfile.TemporaryDirectory(prefix="jdqn-bars-") as tmp:
        path = Path(tmp) / "bars.parquet"
        frame.to_parquet(path, index=False)
        try:
            return read_bars(settings, path)
        except BarFileError as error:
            raise BarFileError(
                "bars DataFrame", error.problem, error.fix, error.row, error.column
            ) from None


def check_bars(meta: dict[str, Any], bars: Bars) -> None:
    """Refuse bars of another instrument or with other features than the policy's (one line):
    another bar interval (median seconds between bars), median close, tick grid or volume."""
    trained = meta["instrument"]
    tick = float(trained["tick_size"])
    steps = np.diff(bars.timestamp.astype("datetime64[ns]").astype(np.int64))
    if steps.size and trained["bar_seconds"] is not None:
        seconds = float(np.median(steps) / 1e9)
        if not np.isclose(seconds, trained["bar_seconds"], rtol=0.01):
            raise PolicyError(
                f"the bars are {seconds:g} s apart, the policy's training bars "
                f"{trained['bar_seconds']:g} s; fix: pass bars of the interval it was trained on"
            )
    median_close = float(np.median(bars.close))
    ratio = median_close / trained["median_close"]
    if not 1.0 / PRICE_RATIO_LIMIT <= ratio <= PRICE_RATIO_LIMIT:
        raise PolicyError(
            f"the bars trade around {median_close:g}, the policy's training bars around "
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
    if bars.has_volume != trained["has_volume"]:
        have = "have" if bars.has_volume else "have no"
        had = "had" if trained["has_volume"] else "had none"
        raise PolicyError(
            f"the bars {have} volume, the policy's training bars {had}, so its volume feature "
            "would differ; fix: pass bars with the same columns as the training file"
        )


def load_policy(run_dir: str | os.PathLike[str], fold: int | None = None, seed: int = 0) -> Policy:
    """The policy of (``fold``, ``seed``) saved by a walk-forward run; ``fold`` None: the last
    fold (trained on the newest bars). Raises :class:`PolicyError` (one line) when it is not
    there."""
    fold, meta, network, normaliser = read_bundle(run_dir, fold, seed)
    cfg = Config.from_dict(meta["config"])
    return Policy(cfg, fold, seed, network, normaliser, meta)
