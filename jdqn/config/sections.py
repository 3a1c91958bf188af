"""The configuration sections: frozen dataclasses validated in ``__post_init__``.

An impossible value raises ``ValueError`` naming the field and the fix; cross-section checks live
in :class:`Config`. Derived sizes (``cost_points``, ``delta_z``, ``lookback_bars``) are properties.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
import zoneinfo
from dataclasses import dataclass, field
from typing import Any, Literal


def _require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{field_name}: {message}")


def _require_one_of(value: str, choices: tuple[str, ...], field_name: str) -> None:
    """``value`` is one of ``choices``, else "field: 'a', 'b' or 'c'"."""
    quoted = [f"'{c}'" for c in choices]
    _require(value in choices, field_name, ", ".join(quoted[:-1]) + " or " + quoted[-1])


# The names of jdqn.data.calendars.CALENDARS (a test keeps the two lists equal).
_CALENDAR_NAMES = Literal[
    "cme_equity", "cme_energy", "cme_metals", "cme_rates_fx", "fx_24x5", "crypto_24x7"
]
COLUMN_ROLES = ("timestamp", "time", "date", "open", "high", "low", "close", "volume")


def _check_column_map(items: tuple[str, ...]) -> None:
    roles = []
    for item in items:
        role, sep, column = item.partition(":")
        _require(
            bool(sep) and role.strip() in COLUMN_ROLES and bool(column.strip()),
            "data.columns",
            f"{item!r} is not role:column with a role of {', '.join(COLUMN_ROLES)} "
            "(e.g. data.columns=time:ts,close:last)",
        )
        roles.append(role.strip())
    _require(len(set(roles)) == len(roles), "data.columns", f"a role repeats in {list(items)}")
    _require(
        not ("timestamp" in roles and "time" in roles),
        "data.columns",
        "give the bar time as timestamp or as time, not both",
    )


def duration_seconds(text: str, field_name: str) -> float:
    """Seconds of a duration such as ``90min``, ``23h``, ``1d`` or ``30s``; ValueError naming
    ``field_name`` otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|min|h|d)\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(
            f"{field_name}: {text!r} is not a duration; use a number with s, min, h or d, "
            "e.g. 23h or 90min"
        )
    return float(match.group(1)) * {"s": 1, "min": 60, "h": 3600, "d": 86400}[match.group(2)]


def _check_timezone(name: str | None, field_name: str) -> None:
    if name is None:
        return
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"{field_name}: unknown time zone {name!r}; use an IANA name such as UTC, "
            "America/Chicago or Europe/London"
        ) from None


@dataclass(frozen=True)
class DataConfig:
    """Where bars come from and which features are computed from them."""

    path: str | None = None  # CSV/Parquet bar file; None = built-in synthetic ES bars
    synthetic_bars: int = 60_000  # bars of the built-in synthetic ES series (when path is None)
    synthetic_seed: int = 0  # seed of the synthetic bar generator
    signal_strength: float = 0.0  # planted predictable drift, in units of bar volatility
    # shape of the planted drift (jdqn.data.synth): momentum, reversion (moves fade) or
    # rth_momentum (momentum inside regular trading hours only)
    signal_kind: Literal["momentum", "reversion", "rth_momentum"] = "momentum"
    signal_lookback: int = 15  # bars of past return the planted drift follows
    return_horizons: tuple[int, ...] = (1, 5, 15, 60)  # log-return lookbacks, in bars
    # also each return over realized_vol * sqrt(h): the move in units of its expected spread
    scaled_returns: bool = False
    volume_window: int = 60  # bars in the trailing volume z-score window
    feature_clip: float = 5.0  # normalised features are clipped to +-feature_clip
    # role:column pairs for headers the built-in names miss, e.g. time:ts,close:last (roles:
    # timestamp or time, date, open, high, low, close, volume; date plus time = split columns)
    columns: tuple[str, ...] = ()
    timezone: str | None = None  # IANA zone of naive file timestamps; None = exchange time
    # strftime codes of the file's timestamps, e.g. "%d|%m|%y %H:%M"; None = the known forms
    timestamp_format: str | None = None
    # trading calendar (jdqn.data.calendars): the bars' clock, trading days, calendar features
    calendar: _CALENDAR_NAMES = "cme_equity"

    def __post_init__(self) -> None:
        _check_column_map(self.columns)
        _check_timezone(self.timezone, "data.timezone")
        _require(
            self.timestamp_format is None or "%" in self.timestamp_format,
            "data.timestamp_format",
            "give strftime codes, e.g. %Y-%m-%d %I-%p (or leave it unset)",
        )
        _require_one_of(self.calendar, typing.get_args(_CALENDAR_NAMES), "data.calendar")
        _require(self.synthetic_bars >= 1_000, "data.synthetic_bars", "use at least 1000 bars")
        _require(
            len(self.return_horizons) > 0 and all(h >= 1 for h in self.return_horizons),
            "data.return_horizons",
            "give one or more positive lookbacks, e.g. [1, 5, 15, 60]",
        )
        _require(self.volume_window >= 2, "data.volume_window", "use a window of at least 2 bars")
        _require(self.feature_clip > 0, "data.feature_clip", "must be > 0")
        _require(self.signal_strength >= 0, "data.signal_strength", "must be >= 0")
        _require_one_of(
            self.signal_kind, ("momentum", "reversion", "rth_momentum"), "data.signal_kind"
        )
        _require(self.signal_lookback >= 1, "data.signal_lookback", "use at least 1 bar, e.g. 15")

    @property
    def column_map(self) -> dict[str, str]:
        """``columns`` as role -> column name."""
        pairs = (item.split(":", 1) for item in self.columns)
        return {role.strip(): column.strip() for role, column in pairs}

    @property
    def lookback_bars(self) -> int:
        """Bars of history a feature at t needs (purge gaps must be at least this)."""
        return max(max(self.return_horizons), self.volume_window)


@dataclass(frozen=True)
class EnvConfig:
    """Trading environment: position grid, costs, reward scale (docs/design.md §3). Prices are
    in the instrument's quote unit, "points" (ES: index points; BTCUSD: dollars per bitcoin)."""

    instrument: str = "ES"  # the traded instrument (jdqn.evaluation.instruments; else a label)
    positions: tuple[float, ...] = (-1.0, 0.0, 1.0)  # action i -> target position (contracts)
    tick_size: float = 0.25  # price points per tick (ES: 0.25 index points)
    point_value_usd: float = 50.0  # dollars per price point per position unit (ES: $50)
    slippage_ticks: float = 1.0  # per side, in ticks (the spread crossed)
    # The cost per unit per side is the sum of the next three and slippage (cost_points).
    commission_ticks: float = 0.2  # per side, in ticks (0.2 = $2.50 on ES)
    commission_usd: float = 0.0  # per side, dollars per contract or lot (futures, FX)
    commission_fraction: float = 0.0  # per side, a fraction of notional (crypto: 0.001 = 0.1 %)
    # Price (points) at which commission_fraction is charged; 0: the first fold's train window's
    # last close, set by the walk-forward (config.json records it).
    cost_reference_price: float = 0.0
    reward_scale: float = 1.0  # reward = points x reward_scale
    # "train_volatility": rewards in units of the per-bar price-change RMS of the first fold's
    # train window (the walk-forward resolves reward_scale = reward_scale / RMS before training),
    # so that a support like +-10 resolves the return distribution whatever the price level.
    reward_unit: Literal["points", "train_volatility"] = "points"
    # Training rewards only, never the judged PnL: hold_penalty x |position| reward units charged
    # per bar held, a mean-variance utility's variance term (Moody & Saffell 2001) when rewards
    # are in train_volatility units and positions in {-1, 0, 1} (a learner's value: one sweep
    # program).
    hold_penalty: float = 0.0
    # Training rewards only, never the judged PnL: the cost they charge is train_cost_scale x
    # the real one (cost_points), e.g. above 1 to train against overtrading (a learner's value:
    # one sweep program)
    train_cost_scale: float = 1.0

    def __post_init__(self) -> None:
        _require(bool(self.instrument.strip()), "env.instrument", "give a name, e.g. ES")
        _require(len(self.positions) >= 2, "env.positions", "give at least two positions")
        _require(
            len(set(self.positions)) == len(self.positions), "env.positions", "positions repeat"
        )
        _require(self.tick_size > 0, "env.tick_size", "must be > 0 (ES: 0.25)")
        _require(self.point_value_usd > 0, "env.point_value_usd", "must be > 0 (ES: 50)")
        _require(self.slippage_ticks >= 0, "env.slippage_ticks", "must be >= 0")
        _require(self.commission_ticks >= 0, "env.commission_ticks", "must be >= 0")
        _require(self.commission_usd >= 0, "env.commission_usd", "must be >= 0 (ES: 2.5)")
        _require(
            0 <= self.commission_fraction < 0.1,
            "env.commission_fraction",
            "must be in [0, 0.1): a fraction, not a percentage (0.1 % taker fee: 0.001)",
        )
        _require(self.cost_reference_price >= 0, "env.cost_reference_price", "must be >= 0")
        _require(self.reward_scale > 0, "env.reward_scale", "must be > 0")
        _require_one_of(self.reward_unit, ("points", "train_volatility"), "env.reward_unit")
        _require(
            0 <= self.hold_penalty < float("inf"),
            "env.hold_penalty",
            "must be >= 0 and finite (0 = no charge)",
        )
        _require(
            0 <= self.train_cost_scale < float("inf"),
            "env.train_cost_scale",
            "must be >= 0 and finite (1 = the real costs)",
        )

    @property
    def n_actions(self) -> int:
        return len(self.positions)

    @property
    def cost_points(self) -> float:
        """Cost per unit traded (per side), in price points: slippage and commission in ticks,
        the dollar commission, and the notional fraction at ``cost_reference_price``."""
        return (
            (self.slippage_ticks + self.commission_ticks) * self.tick_size
            + self.commission_usd / self.point_value_usd
            + self.commission_fraction * self.cost_reference_price
        )


@dataclass(frozen=True)
class NetworkConfig:
    """C51 MLP with spectral norm, pruning masks and ensemble heads (docs/design.md §4)."""

    hidden: tuple[int, ...] = (64, 64)  # widths of the MLP torso's hidden layers
    n_atoms: int = 51  # C51 atoms, evenly spaced on [v_min, v_max]
    v_min: float = -240.0  # lower end of the C51 support, in reward units
    v_max: float = 240.0  # upper end of the C51 support, in reward units
    spectral_norm: bool = True  # spectral norm on hidden layers (Miyato et al., 2018)
    spectral_mode: Literal["clip", "divide"] = "clip"  # W/max(sigma,1) or W/sigma
    n_heads: int = 1  # ensemble heads on one torso (acting uses their mean)
    bootstrap_prob: float = 1.0  # P(transition trains head k); 1.0 = no bootstrap
    lambda_div: float = 0.0  # ensemble diversity weight (only when n_heads > 1)
    target_sparsity: float = 0.0  # final fraction of pruned weights
    prune_start: int = 0  # learner steps
    prune_end: int = 1_000  # learner step where pruning reaches target_sparsity
    prune_every: int = 100  # learner steps between mask updates
    # matmul input dtype; losses stay float32
    matmul_dtype: Literal["float32", "bfloat16"] = "float32"
    # append |held position| to the network's input: going flat costs |p| x cost, which the
    # position alone (-1, 0, 1) gives the first layer only as a V shape
    position_magnitude: bool = False
    # the heads learn each action's value after its trade (the post-decision state; Powell,
    # Approximate Dynamic Programming, 2011, ch. 4) and the trade's cost, known exactly, is added
    # to it, so that no fit of the held position can misprice a trade (jdqn.agent.acting)
    post_trade_values: bool = False
    # the logits are symmetric under the mirrored price path (odd features and the held position
    # change sign, each action becomes its opposite; jdqn.agent.networks): every transition also
    # teaches its mirror image, and no drift of the train window becomes a preferred direction
    mirror: bool = False

    def __post_init__(self) -> None:
        _require(
            len(self.hidden) > 0 and all(h > 0 for h in self.hidden),
            "network.hidden",
            "give one or more positive layer widths, e.g. [64, 64]",
        )
        _require(self.n_atoms >= 2, "network.n_atoms", "use at least 2 atoms (C51: 51)")
        _require(self.v_min < self.v_max, "network.v_min", "v_min must be < v_max")
        _require_one_of(self.spectral_mode, ("clip", "divide"), "network.spectral_mode")
        _require(self.n_heads >= 1, "network.n_heads", "must be >= 1")
        _require(0 < self.bootstrap_prob <= 1, "network.bootstrap_prob", "must be in (0, 1]")
        _require(self.lambda_div >= 0, "network.lambda_div", "must be >= 0")
        _require(0 <= self.target_sparsity < 1, "network.target_sparsity", "must be in [0, 1)")
        _require(
            0 <= self.prune_start <= self.prune_end,
            "network.prune_start",
            "need 0 <= prune_start <= prune_end",
        )
        _require(self.prune_every >= 1, "network.prune_every", "must be >= 1")
        _require_one_of(self.matmul_dtype, ("float32", "bfloat16"), "network.matmul_dtype")

    @property
    def delta_z(self) -> float:
        return (self.v_max - self.v_min) / (self.n_atoms - 1)


@dataclass(frozen=True)
class LossConfig:
    """Blended MSE/C51 loss and gradient surgery (docs/design.md §5)."""

    gamma: float = 0.9  # discount factor (a learner's value: one sweep program)
    # steps n of the n-step return the target bootstraps after (Sutton & Barto ch. 7; Rainbow
    # uses 3): r_t + ... + gamma^(m-1) r_(t+m-1) + gamma^m Q(s_(t+m)), m = n or fewer at a
    # slice's end; 1 = one-step TD. HER donors stay one-step
    n_step: int = 1
    # C51 weight per epoch; last value repeats (a learner's value: one sweep program)
    alpha_schedule: tuple[float, ...] = (0.0, 0.2)
    # eps of (1 - eps) m + eps / N on the C51 target (a learner's value: one sweep program)
    label_smoothing: float = 0.01
    huber_delta: float | None = None  # None = squared error; else Huber on the scaled error
    # the MSE's error measured in support widths (v_max - v_min; the seed's) or reward units
    mse_unit: Literal["support", "reward"] = "support"
    # hindsight donors: none, best action, all actions
    donor_mode: Literal["none", "best", "all"] = "best"
    donor_fraction: float = 0.25  # donors appended, as a fraction of the batch
    gv_every: int = 10  # learner steps between gradient-vaccine steps
    gv_beta: float = 0.01  # EMA rate of phi_hat
    # global-norm budget shared by the two loss parts: a tripwire against blow-ups, not a
    # regulariser (per-part norms stay below about 0.01 against limits of 2 and more at the
    # profiles' settings, and Adam undoes most of a one-step rescale); lower it to make it bind
    grad_budget: float = 10.0
    # "alpha": the budget splits (1 - alpha, alpha) between MSE and C51, as the loss blends;
    # "fixed": budget_share_mse / 1 - budget_share_mse whenever alpha > 0 (the seed's split)
    budget_split: Literal["alpha", "fixed"] = "alpha"
    budget_share_mse: float = 0.3  # share of the budget for MSE when alpha > 0 (split "fixed")
    causal_every: int = 50  # learner steps between causal interventions
    causal_weight: float = 0.1  # weight of the causal KL term
    non_causal_group: str = "calendar"  # feature group the causal intervention permutes
    q_clip: float = 1e4  # guard: max |Q| allowed
    # guard: mean projected target mass on the two edge atoms above which the fold stops (the
    # support no longer holds the returns); Q within one atom of an edge stops it too
    edge_mass_limit: float = 0.5

    def __post_init__(self) -> None:
        _require(0 <= self.gamma < 1, "loss.gamma", "must be in [0, 1)")
        _require(
            isinstance(self.n_step, int) and not isinstance(self.n_step, bool) and self.n_step >= 1,
            "loss.n_step",
            f"must be an integer >= 1 (1 = one-step TD, 3 as in Rainbow); got {self.n_step!r}",
        )
        _require(len(self.alpha_schedule) > 0, "loss.alpha_schedule", "give one value per epoch")
        _require(
            all(0 <= a <= 1 for a in self.alpha_schedule),
            "loss.alpha_schedule",
            "every alpha must be in [0, 1]",
        )
        _require(0 <= self.label_smoothing < 1, "loss.label_smoothing", "must be in [0, 1)")
        _require(
            self.huber_delta is None or self.huber_delta > 0, "loss.huber_delta", "None or > 0"
        )
        _require_one_of(self.mse_unit, ("support", "reward"), "loss.mse_unit")
        _require_one_of(self.donor_mode, ("none", "best", "all"), "loss.donor_mode")
        _require(0 <= self.donor_fraction <= 4, "loss.donor_fraction", "must be in [0, 4]")
        _require(self.gv_every >= 1, "loss.gv_every", "must be >= 1")
        _require(0 < self.gv_beta <= 1, "loss.gv_beta", "must be in (0, 1]")
        _require(self.grad_budget > 0, "loss.grad_budget", "must be > 0")
        _require(0 < self.budget_share_mse < 1, "loss.budget_share_mse", "must be in (0, 1)")
        _require(self.causal_every >= 1, "loss.causal_every", "must be >= 1")
        _require(self.causal_weight >= 0, "loss.causal_weight", "must be >= 0")
        _require(self.q_clip > 0, "loss.q_clip", "must be > 0")
        _require_one_of(self.budget_split, ("alpha", "fixed"), "loss.budget_split")
        _require(0 < self.edge_mass_limit <= 1, "loss.edge_mass_limit", "must be in (0, 1]")


@dataclass(frozen=True)
class ReplayConfig:
    """Proportional prioritized replay (Schaul et al., 2016)."""

    capacity: int = 256  # replay buffer size, transitions
    alpha: float = 0.6  # priority exponent
    beta_start: float = 0.4  # IS exponent, annealed linearly to 1 over the run
    priority_eps: float = 1e-3  # added to |TD error| so no priority is 0
    priority_max: float = 1e3  # priorities are clipped to this

    def __post_init__(self) -> None:
        _require(self.capacity >= 2, "replay.capacity", "must be >= 2")
        _require(0 <= self.alpha <= 1, "replay.alpha", "must be in [0, 1]")
        _require(0 <= self.beta_start <= 1, "replay.beta_start", "must be in [0, 1]")
        _require(self.priority_eps > 0, "replay.priority_eps", "must be > 0")
        _require(
            self.priority_max > self.priority_eps, "replay.priority_max", "must be > priority_eps"
        )


@dataclass(frozen=True)
class OptimConfig:
    """Adam (Kingma & Ba, 2015) through optax."""

    learning_rate: float = 1e-3  # Adam step size (a learner's value: one sweep program)
    adam_eps: float = 1e-8  # Adam epsilon
    # hard target sync period in learner steps (when tau == 0; a learner's value: one sweep
    # program)
    target_every: int = 100
    tau: float = 0.0  # Polyak rate; 0 = hard sync every target_every steps

    def __post_init__(self) -> None:
        _require(self.learning_rate > 0, "optim.learning_rate", "must be > 0")
        _require(self.adam_eps > 0, "optim.adam_eps", "must be > 0")
        _require(self.target_every >= 1, "optim.target_every", "must be >= 1")
        _require(0 <= self.tau <= 1, "optim.tau", "must be in [0, 1]")


@dataclass(frozen=True)
class TrainConfig:
    """Lock-step slices, epochs, exploration (docs/design.md §3, §7)."""

    n_slices: int = 64  # train-window slices stepped in lock-step
    batch_size: int = 64  # transitions sampled per learner step (before donors)
    epochs: int = 2  # passes over each fold's train window
    train_every: int = 1  # iterations between learner updates
    updates_per_iteration: int = 1  # learner steps per iteration
    epsilon_start: float = 1.0  # exploration rate at the start
    # exploration rate after the linear decay (a learner's value: one sweep program)
    epsilon_end: float = 0.05
    epsilon_decay_fraction: float = 0.5  # of all iterations
    # A slice's end is a time limit, not a terminal state (the position and the market go on):
    # True bootstraps from the next bar's value there (Pardo et al., 2018), False discounts by 0.
    bootstrap_slice_ends: bool = False
    # acting (training and test) and the target's a*: argmax of the mean minus act_risk x the
    # standard deviation of the C51 return distribution (Dabney et al., 2018); 0 = the mean (a
    # learner's value: one sweep program)
    act_risk: float = 0.0
    # no-trade band: another action must beat the held position's value by this many round-trip
    # costs (2 x env.cost_points, in reward units) to be taken; 0 = none
    act_band_costs: float = 0.0
    # acting (training and test) subtracts this many standard deviations, over the ensemble
    # heads, of each action's value gain over the flattest position: the heads' disagreement,
    # what the data have not decided (bootstrapped heads, Osband et al., 2016), where act_risk
    # charges the return's own spread; 0 = none; needs network.n_heads > 1
    act_disagreement: float = 0.0
    seeds: int = 1  # seeds per fold (one vmapped program)
    seed: int = 0  # base seed of every PRNG key
    chunk_iterations: int = 256  # iterations per compiled chunk (progress bar granularity)

    def __post_init__(self) -> None:
        _require(self.n_slices >= 1, "train.n_slices", "must be >= 1")
        _require(self.batch_size >= 1, "train.batch_size", "must be >= 1")
        _require(self.epochs >= 1, "train.epochs", "must be >= 1")
        _require(self.train_every >= 1, "train.train_every", "must be >= 1")
        _require(self.updates_per_iteration >= 1, "train.updates_per_iteration", "must be >= 1")
        _require(0 <= self.epsilon_end <= 1, "train.epsilon_end", "must be in [0, 1]")
        _require(
            self.epsilon_end <= self.epsilon_start <= 1,
            "train.epsilon_start",
            "need epsilon_end <= epsilon_start <= 1",
        )
        _require(
            0 < self.epsilon_decay_fraction <= 1,
            "train.epsilon_decay_fraction",
            "must be in (0, 1]",
        )
        _require(self.act_risk >= 0, "train.act_risk", "must be >= 0 (0 = the mean)")
        _require(self.act_band_costs >= 0, "train.act_band_costs", "must be >= 0 (0 = none)")
        _require(self.act_disagreement >= 0, "train.act_disagreement", "must be >= 0 (0 = none)")
        _require(self.seeds >= 1, "train.seeds", "must be >= 1")
        _require(self.chunk_iterations >= 1, "train.chunk_iterations", "must be >= 1")


@dataclass(frozen=True)
class WalkForwardConfig:
    """Fold layout over the bar series (docs/design.md §3, §7). Sizes in bars."""

    n_folds: int = 3  # walk-forward folds
    # rolling: equal windows, vmapped; expanding: in sequence
    mode: Literal["rolling", "expanding"] = "rolling"
    train_bars: int = 20_000  # bars per train window (the first one when expanding)
    test_bars: int = 12_000  # bars per test window
    # One Globex trading day of 1-minute bars; at another interval this default follows the
    # data (23 h of its bars); must cover the feature lookback
    purge_bars: int = 1_380
    # the purge as a time, e.g. 23h, 90min, 2d: purge_bars from the data's interval (wins)
    purge_time: str | None = None

    def __post_init__(self) -> None:
        _require(self.n_folds >= 1, "walkforward.n_folds", "must be >= 1")
        _require_one_of(self.mode, ("rolling", "expanding"), "walkforward.mode")
        _require(self.train_bars >= 2, "walkforward.train_bars", "must be >= 2")
        _require(self.test_bars >= 2, "walkforward.test_bars", "must be >= 2")
        _require(self.purge_bars >= 0, "walkforward.purge_bars", "must be >= 0")
        if self.purge_time is not None:
            duration_seconds(self.purge_time, "walkforward.purge_time")

    def bars_needed(self) -> int:
        """Bars a series must have for this layout (first fold starts at bar 0)."""
        return self.train_bars + self.purge_bars + self.n_folds * self.test_bars


@dataclass(frozen=True)
class OutputConfig:
    """What a run writes."""

    out_dir: str = "runs"  # parent directory of run directories
    checkpoints: bool = True  # checkpoints each epoch (for --resume)
    tensorboard: bool = True  # TensorBoard event files
    plots: bool = True  # PNG plots
    policies: bool = True  # each run's policy bundle (a sweep's selection runs save none)
    # the random baseline in plots and console tables too (results.json and CSVs always hold it)
    show_random: bool = False
    compilation_cache: bool = True  # persist XLA executables across runs
    # settings compared to choose this one (a sweep's count): the deflated Sharpe counts them
    settings_tried: int = 1

    def __post_init__(self) -> None:
        _require(bool(self.out_dir), "output.out_dir", "give a directory")
        _require(self.settings_tried >= 1, "output.settings_tried", "count at least 1 setting")


@dataclass(frozen=True)
class AccelConfig:
    """GPU specialisations of the learner step (jdqn.accel; docs/design.md §12).

    They change speed only: the step computes the same numbers (to float32 rounding) either way."""

    # auto = each Pallas kernel where it pays off (the C51 projection on a GPU; the
    # flat tail on a GPU from 16 vmapped learners on); off = plain XLA everywhere
    kernels: Literal["auto", "off"] = "auto"
    # For tests and benchmarks: pieces forced to one implementation, "PIECE=IMPL,..." from
    # PIECES (e.g. "tail=interpret,dense=autodiff"); "" leaves every piece to kernels
    pieces: str = ""

    def __post_init__(self) -> None:
        _require_one_of(self.kernels, ("auto", "off"), "accel.kernels")
        parse_pieces(self.pieces)

    @property
    def forced(self) -> dict[str, str]:
        """The pieces :attr:`pieces` forces, ``{piece: impl}``."""
        return parse_pieces(self.pieces)


# Each speed piece's implementations (jdqn.accel.choose resolves "auto"): the C51 projection
# and the update's flat tail (pallas_kernels), jdqn.agent.dense_stack's backward and
# jdqn.agent.losses' closed-form VJPs, the fusion-steering barriers, stored executables.
PIECES: dict[str, tuple[str, ...]] = {
    "projection": ("auto", "pallas", "interpret", "reference"),
    "tail": ("auto", "pallas", "interpret", "xla"),
    "dense": ("auto", "custom", "autodiff"),
    "vjp": ("auto", "closed", "autodiff"),
    "barriers": ("auto", "on", "off"),
    "executables": ("auto", "on", "off"),
}


def parse_pieces(spec: str) -> dict[str, str]:
    """``"PIECE=IMPL,..."`` as ``{piece: impl}``; a ValueError naming the choices if malformed."""
    forced: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        piece, _, impl = item.partition("=")
        choices = ", ".join(f"{k}={'|'.join(v)}" for k, v in PIECES.items())
        _require(impl in PIECES.get(piece, ()), "accel.pieces", f"{item!r} is not one of {choices}")
        forced[piece] = impl
    return forced


@dataclass(frozen=True)
class Config:
    """The whole run. Cross-section checks live here."""

    data: DataConfig = field(default_factory=DataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    walkforward: WalkForwardConfig = field(default_factory=WalkForwardConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    accel: AccelConfig = field(default_factory=AccelConfig)

    def __post_init__(self) -> None:
        from jdqn.config.limits import check_numbers  # finite, float32 and int32 ranges

        check_numbers(self)
        _require(
            self.walkforward.purge_bars >= self.data.lookback_bars,
            "walkforward.purge_bars",
            f"must be >= the feature lookback ({self.data.lookback_bars} bars) so no test "
            "feature shares a bar with the train window; raise it or shorten data.return_horizons",
        )
        _require(
            self.train.act_disagreement == 0 or self.network.n_heads > 1,
            "train.act_disagreement",
            "needs ensemble heads to disagree: set network.n_heads above 1 (with "
            "network.bootstrap_prob below 1), or act_disagreement 0",
        )
        _require(
            not self.network.mirror
            or sorted(-p for p in self.env.positions) == sorted(self.env.positions),
            "network.mirror",
            f"needs each position's opposite among env.positions {list(self.env.positions)}: "
            "make them symmetric, e.g. [-1, 0, 1], or set network.mirror false",
        )
        _require(
            self.replay.capacity >= self.train.n_slices,
            "replay.capacity",
            f"must be >= train.n_slices ({self.train.n_slices}): every iteration inserts one "
            "transition per slice",
        )
        _require(
            self.replay.capacity >= self.train.batch_size,
            "replay.capacity",
            f"must be >= train.batch_size ({self.train.batch_size})",
        )
        _require(
            self.walkforward.train_bars >= 2 * self.train.n_slices,
            "walkforward.train_bars",
            f"must be >= 2 x train.n_slices ({2 * self.train.n_slices}) so every slice "
            "has at least one transition; lower train.n_slices or raise train_bars",
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Config:
        """Build from a nested dict (e.g. a resolved ``config.json``); unknown keys raise."""
        from jdqn.config.parse import config_from_dict

        return config_from_dict(raw)

    @classmethod
    def from_json(cls, text: str) -> Config:
        return cls.from_dict(json.loads(text))
