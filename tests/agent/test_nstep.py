"""n-step returns (jdqn.agent.nstep, docs/design.md §5 step 4): the stored transitions and the
learner's
targets against an independent float64 numpy loop; n = 1 keeps the one-step form."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_learner import N_FEATURES, TINY

from jdqn.agent import LEARNER_METRICS_RECORD, make_learner, nstep
from jdqn.agent import step as step_module
from jdqn.agent.batch import sample_batch
from jdqn.agent.train import FoldData, first_training_iteration, make_train
from jdqn.agent.transition import NStepReturn, Transition
from jdqn.config import SMOKETEST, apply_overrides

GAMMA = 0.9
POSITIONS = np.array([-1.0, 0.0, 1.0])
HOLD_PENALTY = 0.3  # reward units per bar held: n-step sums carry the hold charge too


def reference_slice(close, features, actions, cost, scale, hold, gamma, n, bootstrap_end):
    """Float64 loop over one slice of ``len(actions)`` steps from bar 0 (``close`` and
    ``features`` from the slice's first bar): per step t, the n-step return of the behaviour's
    rewards (each less ``hold`` per unit held), the next observation at bar t+m (features,
    position held then), done and the discount gamma^m (1 - done), with m = min(n, steps left).
    The slice's end is a time limit that bootstraps when ``bootstrap_end``, else a terminal."""
    steps = len(actions)
    rewards, held = [], 0.0
    for t in range(steps):
        new = POSITIONS[actions[t]]
        pnl = new * (float(close[t + 1]) - float(close[t]))
        rewards.append(scale * (pnl - cost * abs(new - held)) - hold * abs(new))
        held = new
    rows = []
    for t in range(steps):
        m = min(n, steps - t)
        done = 0.0 if (t + m < steps or bootstrap_end) else 1.0
        rows.append(
            {
                "reward": sum(gamma**k * rewards[t + k] for k in range(m)),
                "next_features": np.asarray(features[t + m], np.float64),
                "next_position": POSITIONS[actions[t + m - 1]],
                "done": done,
                "steps": m,
                "discount": gamma**m * (1.0 - done),
            }
        )
    return rows


def test_gamma_powers_round_once_and_keep_the_one_step_discount():
    powers = nstep.gamma_powers(GAMMA, 3)
    assert powers.dtype == np.float32 and powers[0] == 1.0 and powers[1] == np.float32(GAMMA)
    np.testing.assert_array_equal(powers, np.float32(GAMMA ** np.arange(4.0)))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_fold_stops_at_a_terminal_and_at_the_windows_end(n):
    """``fold`` over one slice's window: rewards summed with gamma^k up to and including the
    first done, then nothing; the state after the last counted step."""
    rng = np.random.default_rng(n)
    length = 4
    window = Transition(
        features=jnp.asarray(rng.normal(size=(length, 2)), jnp.float32),
        position=jnp.zeros((length,), jnp.float32),
        action=jnp.asarray([2, 0, 1, 2], jnp.int32),
        reward=jnp.asarray(rng.normal(size=length), jnp.float32),
        next_features=jnp.asarray(rng.normal(size=(length, 2)), jnp.float32),
        price_change=jnp.zeros((length,), jnp.float32),
        done=jnp.asarray([0.0, 1.0, 0.0, 0.0], jnp.float32),  # a terminal at step 1
    )
    for start in range(length):
        part = jax.tree.map(lambda leaf, s=start: leaf[s : s + n], window)
        powers = jnp.asarray(nstep.gamma_powers(GAMMA, n))
        got = jax.jit(nstep.fold)(part, jnp.asarray(POSITIONS), powers).n_step
        assert got is not None
        r = np.asarray(part.reward, np.float64)
        d = np.asarray(part.done, np.float64)
        m, total = 0, 0.0
        for k in range(len(r)):  # the loop the docstring describes
            total += GAMMA**k * r[k]
            m += 1
            if d[k]:
                break
        np.testing.assert_allclose(float(got.reward), total, rtol=1e-6, atol=1e-6)
        assert int(got.steps) == m
        assert float(got.done) == d[m - 1]
        np.testing.assert_array_equal(got.next_features, part.next_features[m - 1])
        assert float(got.next_position) == POSITIONS[int(part.action[m - 1])]


@pytest.mark.slow
def test_first_training_iteration_follows_the_buffers_fill():
    """The first iteration whose insert leaves a batch in the buffer, against a simulation of
    the inserts (none while the epoch's first window fills, one per slice per iteration, the
    rest of each slice at the epoch's end), over a grid including slices shorter than n."""
    for n, slices, batch, per_epoch in np.ndindex(4, 3, 12, 6):
        n, slices, batch, per_epoch = n + 1, slices + 1, batch + 1, per_epoch + 1
        train = apply_overrides(
            SMOKETEST,
            [f"train.n_slices={slices}", f"train.batch_size={batch}", "replay.capacity=64"],
        ).train
        stored, index = 0, 0
        while True:
            offset = index % per_epoch
            before = nstep.inserts_in_epoch(offset - 1, n, per_epoch) if offset else 0
            stored += slices * (nstep.inserts_in_epoch(offset, n, per_epoch) - before)
            if stored >= batch:
                break
            index += 1
        assert first_training_iteration(train, n, per_epoch) == index, (n, slices, batch)


BARS = 12  # two slices of 6 bars: 5 steps each, the last one the slice's end


def _counting_step(state, alpha, beta, clock=None):
    """A learner step that only counts: the collection is under test here, and the real step's
    compile would dominate the test's time (the n = 3 step has its own test below)."""
    del alpha, beta, clock
    metrics = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), LEARNER_METRICS_RECORD)
    return state.replace(step=state.step + 1), metrics


@functools.cache
def _trained(n, bootstrap_end, capacity=32):
    """Two epochs of the training program over made-up bars (trains from the first epoch's
    end), with a counting learner step; its config, fold and final state."""
    cfg = apply_overrides(
        SMOKETEST,
        [
            *TINY,
            "train.n_slices=2",
            "train.epochs=2",
            f"replay.capacity={capacity}",  # 32 holds both epochs' 20 transitions
            "train.chunk_iterations=3",
            f"train.bootstrap_slice_ends={bootstrap_end}",
            f"loss.n_step={n}",
            f"loss.gamma={GAMMA}",
            f"env.hold_penalty={HOLD_PENALTY}",
        ],
    )
    program = make_train(cfg, N_FEATURES, BARS, (0,))
    program = dataclasses.replace(program, learner=program.learner._replace(step=_counting_step))
    rng = np.random.default_rng(7)
    fold = FoldData(
        features=jnp.asarray(rng.normal(size=(BARS, N_FEATURES)), jnp.float32),
        close=jnp.asarray(100.0 + np.cumsum(rng.normal(size=BARS)), jnp.float32),
    )
    state, history = program.train(jax.random.PRNGKey(3), fold)
    return cfg, program, fold, state, history


@pytest.mark.slow
@pytest.mark.parametrize(
    ("n", "bootstrap_end"),
    # (7, False): slices of 5 steps, shorter than n, are inserted whole at their end
    [(1, True), (2, False), (3, True), (3, False), (7, False)],
)
def test_stored_transitions_and_batch_targets_match_a_float64_loop(n, bootstrap_end):
    """Every stored transition of two epochs (rows by bar, then slice: the epoch's inserts come
    in bar order) and the targets ``sample_batch`` builds from them equal the reference's
    n-step returns, next observations (the behaviour's position at bar t+m) and discounts
    gamma^m (1 - done), with the slice's end a terminal or a bootstrapped time limit."""
    cfg, program, fold, state, history = _trained(n, bootstrap_end)
    replay = state.learner.replay
    slices, steps = cfg.train.n_slices, program.iterations_per_epoch
    assert int(replay.size) == cfg.train.epochs * steps * slices
    stored = jax.tree.map(np.asarray, replay.transitions)
    close, features = np.asarray(fold.close, np.float64), np.asarray(fold.features)
    starts = BARS - (BARS // slices) * slices + (BARS // slices) * np.arange(slices)
    want = {}  # slot -> reference row
    for epoch in range(cfg.train.epochs):
        slots = epoch * steps * slices + np.arange(steps * slices).reshape(steps, slices)
        for s, start in enumerate(starts):
            # the one-step fields say where each row acts: bar start + t, held position
            np.testing.assert_array_equal(
                stored.features[slots[:, s]], features[start : start + steps]
            )
            actions = stored.action[slots[:, s]]
            reference = functools.partial(
                reference_slice,
                close[start:],
                features[start:],
                actions,
                cfg.env.cost_points,
                cfg.env.reward_scale,
                cfg.env.hold_penalty,
                GAMMA,
            )
            for t, row in enumerate(reference(n, bootstrap_end)):
                want[int(slots[t, s])] = row
            one_step = [row["reward"] for row in reference(1, bootstrap_end)]
            np.testing.assert_allclose(stored.reward[slots[:, s]], one_step, rtol=1e-5, atol=1e-5)
    slots = np.array(sorted(want))
    if n == 1:
        assert stored.n_step is None  # the stored form is the one-step one
        got = {"reward": stored.reward, "next_features": stored.next_features, "done": stored.done}
    else:
        got = stored.n_step._asdict()
        np.testing.assert_array_equal(got["steps"][slots], [want[i]["steps"] for i in slots])
        np.testing.assert_array_equal(
            got["next_position"][slots], [want[i]["next_position"] for i in slots]
        )
    np.testing.assert_allclose(
        got["reward"][slots], [want[i]["reward"] for i in slots], rtol=1e-5, atol=1e-5
    )
    np.testing.assert_array_equal(
        got["next_features"][slots], [want[i]["next_features"] for i in slots]
    )
    np.testing.assert_array_equal(got["done"][slots], [want[i]["done"] for i in slots])

    # The learner's rows: sample_batch's reward, next observation and discount per sampled slot.
    keys = tuple(jax.random.split(jax.random.PRNGKey(5), 3))
    discounts = jnp.asarray(nstep.gamma_powers(cfg.loss.gamma, cfg.loss.n_step))
    batch = jax.jit(sample_batch, static_argnums=(5, 6))(
        replay, keys, jax.random.PRNGKey(6), 0.5, discounts, cfg, 0
    )
    indices = np.asarray(batch.indices)
    np.testing.assert_allclose(
        batch.discount, [want[i]["discount"] for i in indices], rtol=1e-6, atol=0
    )
    np.testing.assert_allclose(
        batch.reward, [want[i]["reward"] for i in indices], rtol=1e-5, atol=1e-5
    )
    next_obs = [[*want[i]["next_features"], want[i]["next_position"]] for i in indices]
    np.testing.assert_array_equal(batch.next_obs, np.asarray(next_obs, np.float32))

    # The learner trained from the iteration whose insert first filled a batch.
    trained = np.concatenate([np.asarray(h.trained)[np.asarray(h.active)] for h in history])
    first = first_training_iteration(cfg.train, n, steps)
    np.testing.assert_array_equal(trained, np.arange(trained.size) >= first)
    assert int(state.learner.step) == trained.sum() > 0


@pytest.mark.slow
def test_a_slice_end_beyond_the_buffers_capacity_is_inserted_in_ring_order():
    """n = 7 over slices of 5 steps inserts 10 rows at each slice end into a buffer of 8 (in
    chunks of at most its capacity): the newest 8 rows, bars 1-4 of the second epoch, stay."""
    cfg, program, _, state, _ = _trained(7, False, capacity=8)
    replay = state.learner.replay
    assert int(replay.inserted) == 20 and int(replay.size) == 8
    slots = np.arange(12, 20) % 8  # insertion order of the newest 8
    bars = (np.arange(12, 20) - 10) // cfg.train.n_slices  # bar of each in its slice
    steps_left = program.iterations_per_epoch - bars
    np.testing.assert_array_equal(np.asarray(replay.transitions.n_step.steps)[slots], steps_left)
    np.testing.assert_array_equal(np.asarray(replay.transitions.n_step.done)[slots], 1.0)


@pytest.mark.slow
def test_a_learner_step_at_n3_bootstraps_with_gamma_to_the_m(monkeypatch):
    """One learner step at n = 3: ``td_target`` gets the stored n-step return and
    gamma^m (1 - done) for sampled rows, and the one-step reward and gamma for donors."""
    captured = {}
    real = step_module.losses.td_target

    def spy(online_next, target_next, reward, discount, *rest):
        jax.debug.callback(lambda r, d: captured.update(reward=r, discount=d), reward, discount)
        return real(online_next, target_next, reward, discount, *rest)

    monkeypatch.setattr(step_module.losses, "td_target", spy)
    cfg = apply_overrides(
        SMOKETEST,
        [
            *TINY,
            "loss.n_step=3",
            f"loss.gamma={GAMMA}",
            "loss.donor_mode=best",
            "loss.donor_fraction=0.5",
        ],
    )
    learner = make_learner(cfg, N_FEATURES, (0,))
    rows = 16
    rng = np.random.default_rng(0)
    steps = np.arange(rows) % 3 + 1  # m in {1, 2, 3}
    done = (np.arange(rows) % 4 == 0).astype(np.float32)
    n_step_reward = np.arange(rows, dtype=np.float32) + 0.25  # tells the rows apart
    one_step = Transition(
        features=jnp.asarray(rng.normal(size=(rows, N_FEATURES)), jnp.float32),
        position=jnp.zeros((rows,), jnp.float32),
        action=jnp.asarray(np.arange(rows) % 3, jnp.int32),
        reward=jnp.full((rows,), -0.5, jnp.float32),
        next_features=jnp.asarray(rng.normal(size=(rows, N_FEATURES)), jnp.float32),
        price_change=jnp.full((rows,), 0.125, jnp.float32),
        done=jnp.zeros((rows,), jnp.float32),
    )
    transitions = one_step._replace(
        n_step=NStepReturn(
            reward=jnp.asarray(n_step_reward),
            next_features=jnp.asarray(rng.normal(size=(rows, N_FEATURES)), jnp.float32),
            next_position=jnp.asarray(POSITIONS[np.arange(rows) % 3], jnp.float32),
            done=jnp.asarray(done),
            steps=jnp.asarray(steps, jnp.int32),
        )
    )
    state = learner.insert(learner.init(jax.random.PRNGKey(0)), transitions)
    jax.jit(learner.step)(state, jnp.float32(0.5), jnp.float32(0.5))
    jax.effects_barrier()
    batch_size = cfg.train.batch_size
    reward, discount = np.asarray(captured["reward"]), np.asarray(captured["discount"])
    assert reward.shape == discount.shape == (batch_size + 4,)  # 4 donors
    sampled = np.searchsorted(n_step_reward, reward[:batch_size])
    np.testing.assert_array_equal(reward[:batch_size], n_step_reward[sampled])
    np.testing.assert_allclose(
        discount[:batch_size], GAMMA ** steps[sampled] * (1 - done[sampled]), rtol=1e-6
    )
    assert len(set(steps[sampled])) > 1  # the sample mixes m
    np.testing.assert_array_equal(discount[batch_size:], np.float32(GAMMA))
    # donors act from a flat position: reward_scale (a * 0.125 - cost |a|) for their action a
    donor_rewards = cfg.env.reward_scale * (
        POSITIONS * 0.125 - cfg.env.cost_points * abs(POSITIONS)
    )
    nearest = np.min(np.abs(reward[batch_size:, None] - donor_rewards[None, :]), axis=1)
    np.testing.assert_array_less(nearest, 1e-6)


@pytest.mark.parametrize("value", [0, -2])
def test_n_step_below_one_is_refused_with_the_field_and_the_fix(value):
    with pytest.raises(ValueError, match=r"loss\.n_step: must be an integer >= 1"):
        apply_overrides(SMOKETEST, [f"loss.n_step={value}"])
    with pytest.raises(ValueError, match=r"loss\.n_step"):
        apply_overrides(SMOKETEST, ["loss.n_step=2.5"])
