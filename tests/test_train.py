"""jdqn.train: which iterations train the learner (DESIGN section 5: one learner step per
iteration once the buffer holds a batch, every ``train.train_every`` iterations)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_learner import N_FEATURES, TINY

from jdqn.config import SMOKETEST, apply_overrides
from jdqn.train import FoldData, make_train


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
    program = make_train(cfg, N_FEATURES, 64, (0,))
    folds = FoldData(
        features=jax.random.normal(jax.random.PRNGKey(1), (2, 64, N_FEATURES)),
        close=jnp.cumsum(jnp.ones((2, 64)), axis=1) + 100.0,
    )
    # Two runs vmapped, as in a walk-forward group: the replay size is a batched value there.
    state = jax.vmap(program.init)(jax.random.split(jax.random.PRNGKey(0), 2), folds)
    chunk = jax.jit(jax.vmap(program.run_chunk, (0, 0, None, None)))
    state, metrics = chunk(state, folds, jnp.int32(0), jnp.int32(0))
    assert np.asarray(metrics.active).all()
    np.testing.assert_array_equal(np.asarray(metrics.trained), [trained, trained])
    steps = sum(trained) * cfg.train.updates_per_iteration
    np.testing.assert_array_equal(np.asarray(state.learner.step), [steps] * 2)
    losses = np.asarray(metrics.learner.loss_mse)
    assert np.all((losses > 0) == np.asarray(trained))  # untrained iterations report zeros
