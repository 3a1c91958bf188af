"""jdqn.agent.train: which iterations train the learner (docs/design.md §7: one learner step per
iteration once the buffer holds a batch, every ``train.train_every`` iterations)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_learner import N_FEATURES, TINY

from jdqn.agent.state import hyper_of
from jdqn.agent.train import FoldData, first_training_iteration, learner_schedule, make_train
from jdqn.config import SMOKETEST, apply_overrides


def _two_vmapped_runs(cfg):
    """The training program of ``cfg`` over 64 made-up bars, two runs' initial states and the
    jitted chunk vmapped over them, as in a walk-forward group (where the replay size is a
    batched value)."""
    program = make_train(cfg, N_FEATURES, 64, (0,))
    folds = FoldData(
        features=jax.random.normal(jax.random.PRNGKey(1), (2, 64, N_FEATURES)),
        close=jnp.cumsum(jnp.ones((2, 64)), axis=1) + 100.0,
    )
    state = jax.vmap(program.init)(jax.random.split(jax.random.PRNGKey(0), 2), folds)
    return program, folds, state, jax.jit(jax.vmap(program.run_chunk, (0, 0, None, None)))


@pytest.mark.slow
def test_learners_of_one_program_carry_their_own_settings():
    """Two learners of one program, each carrying a config's learning rate, gamma, end of
    exploration, alpha schedule, label smoothing, hold penalty, acting risk, target sync period
    and training cost scale as values (``jdqn.agent.state.Hyper``), train as that config's own
    program does, to the bit (n-step returns, targets, Adam, epsilon, the epoch's C51 blend, the
    rewards and donors' rewards, post-trade values' costs, acting, a* and the target net's syncs
    all read them). The program's
    act_risk is base's 0.25: a learner carrying 0 acts by the mean exactly as a program of
    act_risk 0, which skips the std."""
    base = apply_overrides(
        SMOKETEST,
        [*TINY, "train.chunk_iterations=8", "train.n_slices=8", "train.batch_size=8"]
        + ["loss.n_step=3", "train.epsilon_decay_fraction=0.05", "train.epochs=3"]
        + ["train.act_risk=0.25", "optim.target_every=3"]  # syncs after steps 3 and 6 of 8
        + ["network.post_trade_values=true"],  # whose trade costs carry the cost scale
    )
    other = apply_overrides(
        base,
        ["optim.learning_rate=3e-2", "loss.gamma=0.5", "train.epsilon_end=0.9"]
        + ["loss.alpha_schedule=[0.0, 0.5, 0.7, 0.9]"]  # longer than the epochs: cut to them
        + ["loss.label_smoothing=0.2", "env.hold_penalty=0.3", "train.act_risk=0"]
        + ["optim.target_every=5", "env.train_cost_scale=1.5"],  # syncs after step 5
    )
    np.testing.assert_array_equal(hyper_of(base).alpha_schedule, np.float32([0.0, 0.2, 0.2]))
    program, folds, _, chunk = _two_vmapped_runs(base)
    hypers = jax.tree.map(lambda *x: np.stack(x), hyper_of(base), hyper_of(other))
    keys = jax.random.split(jax.random.PRNGKey(0), 2)  # _two_vmapped_runs' keys
    epoch = jnp.int32(2)  # base's schedule padded with its last value, other's 0.7
    mixed, metrics = chunk(jax.vmap(program.init)(keys, folds, hypers), folds, epoch, 0)
    assert not np.array_equal(*np.asarray(metrics.epsilon)[:, -1])
    trained = np.asarray(metrics.trained)
    assert trained.any()
    for run, alpha in enumerate((0.2, 0.7)):
        np.testing.assert_array_equal(
            np.asarray(metrics.learner.alpha)[run][trained[run]], np.float32(alpha)
        )
    owns = []
    for run, cfg in enumerate((base, other)):
        _, _, own, own_chunk = _two_vmapped_runs(cfg)
        owns.append(own_chunk(own, folds, epoch, jnp.int32(0))[0])
        for got, want in zip(jax.tree.leaves(mixed), jax.tree.leaves(owns[run]), strict=True):
            np.testing.assert_array_equal(np.asarray(got)[run], np.asarray(want)[run])
    # The values matter: run 1 under base's settings learned otherwise.
    under_base, under_other = (jax.tree.leaves(s.learner.params)[0][1] for s in (owns[0], mixed))
    assert not np.array_equal(under_base, under_other)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "trained"),
    [
        # The first insert fills a batch and every iteration is due: trains from the start
        # (the step is then built without a cond).
        (["train.n_slices=8", "train.batch_size=8"], [True, True, True, True]),
        # The first insert (4 transitions) does not fill a batch of 8.
        (["train.n_slices=4", "train.batch_size=8"], [False, True, True, True]),
        (["train.n_slices=8", "train.batch_size=8", "train.train_every=2"], [True, False] * 2),
        # Two learner steps per training iteration (a scan of steps).
        (["train.n_slices=8", "train.batch_size=8", "train.updates_per_iteration=2"], [True] * 4),
    ],
)
def test_the_learner_trains_once_a_batch_is_stored_on_due_iterations(overrides, trained):
    cfg = apply_overrides(SMOKETEST, [*TINY, "train.chunk_iterations=4", *overrides])
    _, folds, state, chunk = _two_vmapped_runs(cfg)
    state, metrics = chunk(state, folds, jnp.int32(0), jnp.int32(0))
    assert np.asarray(metrics.active).all()
    np.testing.assert_array_equal(np.asarray(metrics.trained), [trained, trained])
    steps = sum(trained) * cfg.train.updates_per_iteration
    np.testing.assert_array_equal(np.asarray(state.learner.step), [steps] * 2)
    losses = np.asarray(metrics.learner.loss_mse)
    assert np.all((losses > 0) == np.asarray(trained))  # untrained iterations report zeros


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        # Statically ready: every iteration trains, two learner steps each.
        ["train.n_slices=8", "train.batch_size=8", "train.updates_per_iteration=2"],
        # Trains every iteration once the third insert fills a batch (a select, no cond).
        ["train.n_slices=3", "train.batch_size=8"],
        # Trains every other iteration once the third insert fills a batch (a cond).
        [
            "train.n_slices=3",
            "train.batch_size=8",
            "train.train_every=2",
            "train.updates_per_iteration=2",
        ],
    ],
    ids=["every_iteration", "every_iteration_once_filled", "every_other_once_filled"],
)
def test_the_causal_term_is_due_on_the_learners_own_step_count(overrides):
    """Across chunks and into the second epoch, the causal term is due exactly on the learner
    steps that are multiples of ``loss.causal_every``: the clock the trainer gives the learner
    (from its loop counters) is the learner's own step counter."""
    cfg = apply_overrides(
        SMOKETEST, [*TINY, "train.chunk_iterations=4", "loss.causal_every=3", *overrides]
    )
    program, folds, state, chunk = _two_vmapped_runs(cfg)
    schedule = [(0, c) for c in range(program.chunks_per_epoch)] + [(1, 0)]
    updates = cfg.train.updates_per_iteration
    checked = 0
    for epoch, c in schedule:
        steps_before = int(np.asarray(state.learner.step)[0])
        state, metrics = chunk(state, folds, jnp.int32(epoch), jnp.int32(c))
        used = np.asarray(metrics.trained)[0] & np.asarray(metrics.active)[0]
        # The record of an iteration is its last update's: its step counts the updates so far.
        last_steps = steps_before + np.cumsum(used * updates) - 1
        due = np.asarray(metrics.learner.causal_applied)  # [runs, iterations]
        kl = np.asarray(metrics.learner.loss_causal)
        for run in range(2):
            want = (last_steps % 3 == 0) & used
            np.testing.assert_array_equal(due[run] == 1.0, want)
            assert np.all(kl[run][want] > 0) and np.all(kl[run][~want] == 0)
        checked += int(used.sum())
    assert checked >= 6 and int(np.asarray(state.learner.step)[0]) > 3 * updates


@pytest.mark.slow
def test_the_learner_schedule_from_the_index_is_the_buffers():
    """``learner_schedule`` (which iterations train and the learner steps before each, from the
    iteration's index alone) against a simulation of the buffer's fill, over a grid of
    slices, batch sizes, capacities, training periods and updates per iteration."""
    index = jnp.arange(40, dtype=jnp.int32)
    for n_slices, batch, extra_capacity, every, updates in np.ndindex(5, 9, 3, 3, 2):
        n_slices, batch, every, updates = n_slices + 1, batch + 1, every + 1, updates + 1
        capacity = max(batch, n_slices, 2) + 5 * extra_capacity
        cfg = apply_overrides(
            SMOKETEST,
            [
                f"train.n_slices={n_slices}",
                f"train.batch_size={batch}",
                f"replay.capacity={capacity}",
                f"train.train_every={every}",
                f"train.updates_per_iteration={updates}",
            ],
        )
        size, steps, want_ready, want_steps = 0, 0, [], []
        for i in range(int(index.shape[0])):
            size = min(size + n_slices, capacity)
            ready = size >= batch and i % every == 0
            want_ready.append(ready)
            want_steps.append(steps)
            steps += updates * ready
        # The one-step trainer's first training iteration: every iteration inserts n_slices.
        first = first_training_iteration(cfg.train, 1, int(index.shape[0]))
        ready, steps_before = learner_schedule(index, cfg.train, first)
        case = (n_slices, batch, capacity, every, updates)
        np.testing.assert_array_equal(np.asarray(ready), want_ready, err_msg=str(case))
        np.testing.assert_array_equal(np.asarray(steps_before), want_steps, err_msg=str(case))
