"""Training program: ``make_train(cfg, ...) -> TrainProgram``; one epoch = scans over iterations.

One iteration (docs/design.md §7): epsilon-greedy action on every slice -> environment step of all
slices in lock-step -> PER insert -> learner step(s). Iterations run inside ``lax.scan`` in chunks
of ``cfg.train.chunk_iterations`` so the host can drive a progress bar and checkpoints between
chunks; epoch, chunk and the alpha schedule (a value each learner carries) are traced, so the
whole run compiles once.
Every function here is pure and vmaps over a leading run axis (folds x seeds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from jdqn.agent import (
    LEARNER_METRICS_RECORD,
    Learner,
    LearnerMetrics,
    LearnerState,
    make_learner,
    nstep,
    pack_metrics,
    unpack_metrics,
)
from jdqn.agent.state import Hyper
from jdqn.agent.transition import Transition, observation
from jdqn.config import Config, TrainConfig
from jdqn.evaluation import env as trading_env
from jdqn.evaluation.rollouts import Rollout, greedy_policy, rollout


class FoldData(NamedTuple):
    """One fold's arrays as the training program sees them."""

    features: jax.Array  # [T, F] float32, normalised with the fold's train statistics
    close: jax.Array  # [T] float32, index points


@flax.struct.dataclass
class TrainState:
    """Everything a run carries between chunks (and into checkpoints)."""

    learner: LearnerState
    env: trading_env.EnvState  # leaves [S], one per slice
    key: jax.Array  # [2] uint32, acting key (the learner has its own)
    iteration: jax.Array  # [] int32, iterations done since the start of training
    # each slice's last n - 1 one-step transitions, leaves [n - 1, S, ...], awaiting their
    # n-step returns (jdqn.agent.nstep); None at loss.n_step=1
    pending: Transition | None = None


class IterationMetrics(NamedTuple):
    """Per-iteration record returned by a chunk (stacked to [L] by the scan)."""

    learner: LearnerMetrics  # zeros when no learner step ran this iteration
    trained: jax.Array  # [] bool, a learner step ran
    active: jax.Array  # [] bool, iteration inside the epoch (padding of the last chunk is not)
    epsilon: jax.Array  # [] float32
    reward_mean: jax.Array  # [] float32, mean reward over slices


@dataclass(frozen=True)
class TrainProgram:
    """Compiled-once training program for folds of ``train_bars`` bars."""

    cfg: Config
    learner: Learner
    iterations_per_epoch: int
    chunk_length: int
    chunks_per_epoch: int
    n_features: int
    first_training: int  # the first iteration whose insert leaves a batch in the buffer

    def init(self, key: jax.Array, fold: FoldData, hyper: Hyper | None = None) -> TrainState:
        """Fresh learner (empty buffer) and slices at their starts; ``hyper``: the learner's
        settings that are values (None: the config's)."""
        learner_key, env_key, act_key = jax.random.split(key, 3)
        params = _slice_params(self.cfg, fold)
        n_step, n_slices = self.cfg.loss.n_step, self.cfg.train.n_slices
        _, env_state = trading_env.reset_slices(env_key, params, n_slices)
        pending = nstep.init_pending(n_step, n_slices, self.n_features) if n_step > 1 else None
        return TrainState(
            learner=self.learner.init(learner_key, hyper),
            env=env_state,
            key=act_key,
            iteration=jnp.zeros((), jnp.int32),
            pending=pending,
        )

    def run_chunk(
        self, state: TrainState, fold: FoldData, epoch: jax.Array, chunk: jax.Array
    ) -> tuple[TrainState, IterationMetrics]:
        """Run ``chunk_length`` iterations of ``epoch`` (traced ints); pure, vmappable."""
        cfg = self.cfg
        # The learner's own hold charge, cost multiplier and alpha schedule (its Hyper).
        hyper = state.learner.hyper
        charges = dict(hold_penalty=hyper.hold_penalty, train_cost_scale=hyper.train_cost_scale)
        params = _slice_params(cfg, fold).replace(**charges)  # type: ignore[attr-defined]  # flax.struct adds .replace
        alpha = hyper.alpha_schedule[jnp.minimum(epoch, cfg.train.epochs - 1)]
        first_in_epoch = chunk * self.chunk_length

        def begin_epoch(state: TrainState) -> TrainState:
            # Each epoch walks every slice once from its start.
            key, reset_key = jax.random.split(state.key)
            _, env_state = trading_env.reset_slices(reset_key, params, cfg.train.n_slices)
            return state.replace(env=env_state, key=key)  # type: ignore[attr-defined]  # flax.struct adds .replace

        state = jax.lax.cond(chunk == 0, begin_epoch, lambda s: s, state)

        record = _iteration_record()

        def iteration(state: TrainState, offset: jax.Array) -> tuple[TrainState, jax.Array]:
            # The last chunk of an epoch may run past the epoch's end: those iterations are
            # skipped. `active` depends only on unbatched scalars, so under vmap this stays a
            # real branch (no select over the replay buffer).
            active = first_in_epoch + offset < self.iterations_per_epoch

            def skip(state: TrainState) -> tuple[TrainState, IterationMetrics]:
                return state, _zeros(record)

            # This iteration's index since the start of training (state.iteration, unbatched).
            index = epoch * self.iterations_per_epoch + first_in_epoch + offset
            new_state, metrics = jax.lax.cond(
                active, lambda s: self._iterate(s, params, alpha, index), skip, state
            )
            return new_state, pack_metrics(metrics._replace(active=active))

        state, packed = jax.lax.scan(iteration, state, jnp.arange(self.chunk_length))
        return state, unpack_metrics(packed, record)

    def _iterate(
        self, state: TrainState, params: trading_env.EnvParams, alpha: jax.Array, index: jax.Array
    ) -> tuple[TrainState, IterationMetrics]:
        """One iteration: act on every slice, insert, train. ``index`` is ``state.iteration``
        as an unbatched int (a function of the chunk's loop counters)."""
        cfg = self.cfg
        n_slices = cfg.train.n_slices
        key, explore_key, pick_key, step_key = jax.random.split(state.key, 4)
        total_iterations = self.iterations_per_epoch * cfg.train.epochs
        progress = state.iteration.astype(jnp.float32) / max(total_iterations, 1)

        decay = jnp.clip(progress / cfg.train.epsilon_decay_fraction, 0.0, 1.0)
        start, end = cfg.train.epsilon_start, state.learner.hyper.epsilon_end
        epsilon = start + (end - start) * decay
        obs = observation(params.features[state.env.t], state.env.position)  # [S, F+1]
        greedy = jnp.argmax(self.learner.act_q(state.learner, obs), axis=-1)
        random_actions = jax.random.randint(pick_key, (n_slices,), 0, cfg.env.n_actions)
        explore = jax.random.uniform(explore_key, (n_slices,)) < epsilon
        actions = jnp.where(explore, random_actions, greedy).astype(jnp.int32)

        _, env_state, reward, _, info = trading_env.step_slices(
            step_key, state.env, actions, params
        )
        transition = info["transition"]
        if cfg.train.bootstrap_slice_ends:
            # The next bar's features are real (t+1 < end), so the bootstrap is well defined.
            transition = transition._replace(done=jnp.zeros_like(transition.done))
        pending = state.pending
        if pending is None:  # loss.n_step == 1
            learner_state = self.learner.insert(state.learner, transition)
        else:
            window = nstep.append(pending, transition)  # [n, S, ...]
            learner_state = self._insert_n_step(state.learner, window, params.positions, index)
            pending = nstep.pending_after(window)

        beta = cfg.replay.beta_start + (1.0 - cfg.replay.beta_start) * progress
        # From the unbatched index, not the (batched) replay size: the learner gets its step
        # counter unbatched, so its own schedules can take real branches under vmap (its
        # `clock`), and so can the choice below whether to train at all.
        ready, steps_before = learner_schedule(index, cfg.train, self.first_training)
        statically_ready = cfg.train.train_every == 1 and self.first_training == 0

        def train(learner_state: LearnerState) -> tuple[LearnerState, LearnerMetrics]:
            def update(carry: LearnerState, u: jax.Array) -> tuple[LearnerState, jax.Array]:
                carry, metrics = self.learner.step(carry, alpha, beta, steps_before + u)
                return carry, pack_metrics(metrics)

            learner_state, packed = jax.lax.scan(
                update, learner_state, jnp.arange(cfg.train.updates_per_iteration)
            )
            return learner_state, unpack_metrics(packed[-1], LEARNER_METRICS_RECORD)

        def skip(learner_state: LearnerState) -> tuple[LearnerState, LearnerMetrics]:
            return learner_state, _zeros(LEARNER_METRICS_RECORD)

        if statically_ready:
            # The first insert fills a batch and every iteration trains: no cond at all.
            learner_state, learner_metrics = train(learner_state)
        elif cfg.train.train_every == 1:
            # All but the first few iterations train: the step runs at each and is kept where
            # due (a select; a cond on a GPU reads its predicate on the host every iteration).
            trained, trained_metrics = train(learner_state)
            learner_state, learner_metrics = jax.tree.map(
                lambda new, old: jnp.where(ready, new, old),
                (trained, trained_metrics),
                skip(learner_state),
            )
        else:
            # Most iterations skip the learner: a real branch (the predicate is unbatched).
            learner_state, learner_metrics = jax.lax.cond(ready, train, skip, learner_state)
        new_state = TrainState(learner_state, env_state, key, state.iteration + 1, pending)
        return new_state, IterationMetrics(
            learner=learner_metrics,
            trained=ready,
            active=jnp.ones((), bool),
            epsilon=epsilon,
            reward_mean=jnp.mean(reward),
        )

    def _insert_n_step(
        self,
        learner_state: LearnerState,
        window: Transition,
        positions: jax.Array,
        index: jax.Array,
    ) -> LearnerState:
        """Insert the n-step transitions that ``window`` (each slice's last n one-step
        transitions) completes at iteration ``index``: none while the epoch's first window fills,
        the oldest step's from then on, and at the epoch's last iteration, where every slice
        ends, each remaining step's with the steps left (docs/design.md §5, step 4)."""
        n, discounts = self.cfg.loss.n_step, learner_state.hyper.discounts
        per_epoch = self.iterations_per_epoch
        offset = index % per_epoch  # unbatched: the switch below stays a real branch

        def nothing(state: LearnerState) -> LearnerState:
            return state

        def oldest(state: LearnerState) -> LearnerState:
            return self.learner.insert(state, nstep.completed(window, positions, discounts))

        def rest_of_slice(state: LearnerState) -> LearnerState:
            tails = nstep.flushed(window, positions, discounts, min(n, per_epoch))
            # n x S rows can exceed the buffer: ring inserts of at most its capacity each
            capacity, rows = self.cfg.replay.capacity, tails.reward.shape[0]
            for start in range(0, rows, capacity):
                part = jax.tree.map(lambda leaf, s=start: leaf[s : s + capacity], tails)
                state = self.learner.insert(state, part)
            return state

        branch = jnp.where(offset == per_epoch - 1, 2, jnp.where(offset >= n - 1, 1, 0))
        return jax.lax.switch(branch, (nothing, oldest, rest_of_slice), learner_state)

    def evaluate(self, state: TrainState, fold: FoldData, key: jax.Array) -> Rollout:
        """Greedy pass of the trained agent over a test window, with costs (docs/design.md §8)."""
        params = _env_params(self.cfg, fold)

        def q_fn(obs: jax.Array) -> jax.Array:
            return self.learner.act_q(state.learner, obs[None])[0]

        return rollout(greedy_policy(q_fn), params, key)

    def train(self, key: jax.Array, fold: FoldData) -> tuple[TrainState, list[IterationMetrics]]:
        """Whole training of one fold (host loop over chunks; for tests and simple use)."""
        state = self.init(key, fold)
        run_chunk = jax.jit(self.run_chunk)
        history = []
        for epoch in range(self.cfg.train.epochs):
            for chunk in range(self.chunks_per_epoch):
                state, metrics = run_chunk(state, fold, jnp.int32(epoch), jnp.int32(chunk))
                history.append(metrics)
        return state, history


def first_training_iteration(train: TrainConfig, n_step: int, iterations_per_epoch: int) -> int:
    """The first iteration (0-based, since the start of training) after whose insert the buffer
    holds ``batch_size`` transitions. At ``n_step`` 1 every iteration inserts ``n_slices``; at
    n > 1 an epoch's inserts per slice follow ``nstep.inserts_in_epoch``, still
    ``iterations_per_epoch`` in all. The buffer never shrinks below ``batch_size`` again (the
    config requires ``replay.capacity >= train.batch_size``)."""
    per_epoch = iterations_per_epoch * train.n_slices
    epochs_before = (train.batch_size - 1) // per_epoch
    left = train.batch_size - epochs_before * per_epoch  # in [1, per_epoch]
    per_slice = -(-left // train.n_slices)
    offset = min(n_step - 2 + per_slice, iterations_per_epoch - 1)
    return epochs_before * iterations_per_epoch + offset


def learner_schedule(
    index: jax.Array, train: TrainConfig, first: int
) -> tuple[jax.Array, jax.Array]:
    """Whether iteration ``index`` (0-based, since the start of training) trains the learner,
    and how many learner steps ran before it, from the index alone: from iteration ``first``
    (:func:`first_training_iteration`) every ``train_every``-th one trains,
    ``updates_per_iteration`` learner steps each (docs/design.md §7)."""
    every = train.train_every

    def multiples_below(m: Any) -> Any:  # multiples of `every` in [0, m), m >= 0
        return (m + every - 1) // every

    ready = (index >= first) & (index % every == 0)
    due_before = jnp.maximum(multiples_below(index) - multiples_below(first), 0)
    return ready, due_before * train.updates_per_iteration


def _iteration_record() -> IterationMetrics:
    """Shapes and dtypes of one iteration's record, known without tracing the step again."""
    scalar: Any = jax.ShapeDtypeStruct((), jnp.float32)
    flag: Any = jax.ShapeDtypeStruct((), jnp.bool_)
    return IterationMetrics(LEARNER_METRICS_RECORD, flag, flag, epsilon=scalar, reward_mean=scalar)


def _zeros(record: Any) -> Any:
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), record)


def _env_params(cfg: Config, fold: FoldData) -> trading_env.EnvParams:
    """One episode over the whole window (evaluation)."""
    return trading_env.make_params(fold.features, fold.close, cfg.env)


def _slice_params(cfg: Config, fold: FoldData) -> trading_env.EnvParams:
    """The train window cut into ``n_slices`` lock-step slices."""
    return trading_env.slice_params(_env_params(cfg, fold), cfg.train.n_slices)


def make_train(
    cfg: Config,
    n_features: int,
    train_bars: int,
    non_causal: tuple[int, ...] = (),
    debug: bool = False,
    learners: int = 1,
) -> TrainProgram:
    """Build the training program for folds of ``train_bars`` bars and ``n_features`` features,
    to be vmapped over ``learners`` runs (folds x seeds)."""
    slice_bars = train_bars // cfg.train.n_slices
    if slice_bars < 2:
        raise ValueError(
            f"train.n_slices: {cfg.train.n_slices} slices of a {train_bars}-bar train window "
            "leave fewer than 2 bars per slice; fix: lower train.n_slices"
        )
    iterations = slice_bars - 1  # the last bar of a slice only provides the final close
    chunk_length = min(cfg.train.chunk_iterations, iterations)
    return TrainProgram(
        cfg=cfg,
        learner=make_learner(cfg, n_features, non_causal, debug=debug, learners=learners),
        iterations_per_epoch=iterations,
        chunk_length=chunk_length,
        chunks_per_epoch=math.ceil(iterations / chunk_length),
        n_features=n_features,
        first_training=first_training_iteration(cfg.train, cfg.loss.n_step, iterations),
    )
