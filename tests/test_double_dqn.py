"""The double-DQN pick kernel (pallas_kernels.double_dqn) against float64 numpy written here.

On CPU (CI) the kernel runs in interpret mode and is lowered for CUDA against an abstract H200;
on a GPU backend the same cases also run the real kernel, e.g.
``JAX_PLATFORMS=cuda python -m pytest tests/test_double_dqn.py``.
"""

import jax
import numpy as np
import pytest
from cuda_lowering import TRITON_DEPRECATION, lower_for_h200, pallas_call_sizes

from pallas_kernels import double_dqn

ON_GPU = jax.default_backend() == "gpu"
KERNELS = ("interpret",) + (("pallas",) if ON_GPU else ())
IMPLS = ("reference",) + KERNELS


def pick_np(online, online_bias, target, target_bias, support):
    """van Hasselt et al. (2016) on C51 distributions, in float64 by hand: the online Q of
    every action, a* by numpy's argmax (the first maximum; a NaN first), the target's
    distribution and Q at a*."""
    o, bo, t, bt, z = (
        np.asarray(x, np.float64) for x in (online, online_bias, target, target_bias, support)
    )

    def softmax(x):
        e = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return e / np.sum(e, axis=-1, keepdims=True)

    q_next = softmax(o + bo) @ z  # [M, K, A]
    a_star = np.argmax(q_next, axis=-1)  # [M, K]
    rows, heads = np.indices(a_star.shape)
    probs = softmax((t + bt)[rows, heads, a_star])  # [M, K, N]
    return q_next, probs, probs @ z


def _case(seed, samples, heads, actions, atoms, scale=3.0):
    rng = np.random.default_rng(seed)
    shape = (samples, heads, actions, atoms)
    return (
        (scale * rng.normal(size=shape)).astype(np.float32),
        rng.normal(size=shape[1:]).astype(np.float32),
        (scale * rng.normal(size=shape)).astype(np.float32),
        rng.normal(size=shape[1:]).astype(np.float32),
        np.linspace(-10.0, 10.0, atoms, dtype=np.float32),
    )


def _close(got, want):
    for g, w, name in zip(got, want, ("q_next", "probs_star", "q_star"), strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "samples, heads, actions, atoms",
    # The smoketest's rows, atoms not a power of two, more heads than one, rows that do not
    # fill the last block, two actions, a single row.
    [(80, 1, 3, 51), (37, 2, 3, 11), (100, 3, 2, 64), (1, 1, 3, 51)],
)
def test_the_pick_matches_float64(impl, samples, heads, actions, atoms):
    args = _case(samples + atoms, samples, heads, actions, atoms)
    got = double_dqn.double_dqn_pick(*args, impl=impl)
    assert [x.shape for x in got] == [
        (samples, heads, actions),
        (samples, heads, atoms),
        (samples, heads),
    ]
    _close(got, pick_np(*args))


@pytest.mark.parametrize("impl", IMPLS)
def test_ties_go_to_the_first_action_and_a_nan_q_is_picked(impl):
    online, online_bias, target, target_bias, support = _case(1, 4, 1, 3, 11)
    online_bias[:] = 0.0
    online[0, 0, 2] = online[0, 0, 0]  # actions 0 and 2 tie: their Q are bitwise equal
    online[0, 0, 1] = online[0, 0, 0]
    online[0, 0, 1, -1] -= 5.0  # ... and action 1 below them (less mass on the top atom)
    online[1, 0, 1, 3] = np.nan  # row 1: action 1's Q is NaN, so a* = 1 (as jnp.argmax)
    args = (online, online_bias, target, target_bias, support)
    q_next, probs, q_star = double_dqn.double_dqn_pick(*args, impl=impl)
    want_q, want_probs, want_star = pick_np(*args)
    assert np.argmax(want_q[0, 0]) == 0 and float(q_next[0, 0, 0]) == float(q_next[0, 0, 2])
    assert np.isnan(float(q_next[1, 0, 1]))
    np.testing.assert_allclose(np.asarray(probs), want_probs, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(q_star), want_star, rtol=1e-5, atol=2e-5)
    finite = ~np.isnan(want_q)
    np.testing.assert_allclose(np.asarray(q_next)[finite], want_q[finite], rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("impl", KERNELS)
def test_nested_vmaps_fold_into_one_launch_and_match_each_learner(impl):
    cases = [_case(10 + i, 24, 2, 3, 11) for i in range(6)]
    stacked = [np.stack([c[k] for c in cases]).reshape(2, 3, *cases[0][k].shape) for k in range(4)]
    support = cases[0][4]

    def pick(online, online_bias, target, target_bias):
        return double_dqn.double_dqn_pick(online, online_bias, target, target_bias, support, impl)

    got = jax.jit(jax.vmap(jax.vmap(pick)))(*stacked)
    jaxpr = jax.make_jaxpr(jax.vmap(jax.vmap(pick)))(*stacked)
    assert pallas_call_sizes(jaxpr.jaxpr) == [6 * 24 * 2 * 3 * 11]  # one launch, every learner
    for i, case in enumerate(cases):
        _close([x.reshape(6, *x.shape[2:])[i] for x in got], pick_np(*case))


def test_a_shared_bias_is_broadcast_under_vmap():
    """Learners with their own logits and one bias (unmapped): each learner's pick as alone."""
    online, online_bias, target, target_bias, support = _case(3, 16, 1, 3, 11)
    onlines = np.stack([online, 0.5 * online])
    got = jax.vmap(
        lambda o: double_dqn.double_dqn_pick(
            o, online_bias, target, target_bias, support, "interpret"
        )
    )(onlines)
    for i in range(2):
        want = pick_np(onlines[i], online_bias, target, target_bias, support)
        _close([x[i] for x in got], want)


def test_bad_shapes_impls_and_a_mapped_support_are_refused():
    online, online_bias, target, target_bias, support = _case(4, 8, 1, 3, 11)
    with pytest.raises(ValueError, match="of one shape"):
        double_dqn.double_dqn_pick(online, online_bias, target[:4], target_bias, support)
    with pytest.raises(ValueError, match="biases"):
        double_dqn.double_dqn_pick(online, online_bias[0], target, target_bias, support)
    with pytest.raises(ValueError, match="impl must be one of"):
        double_dqn.double_dqn_pick(online, online_bias, target, target_bias, support, "xla")
    with pytest.raises(ValueError, match="support must be the same"):
        jax.vmap(
            lambda z: double_dqn.double_dqn_pick(
                online, online_bias, target, target_bias, z, "interpret"
            )
        )(np.stack([support, support]))


@pytest.mark.filterwarnings(TRITON_DEPRECATION)
def test_the_kernel_lowers_for_cuda_as_one_launch_under_vmap():
    def pick(online, online_bias, target, target_bias, support):
        return double_dqn.double_dqn_pick(online, online_bias, target, target_bias, support)

    hlo = lower_for_h200(
        jax.vmap(jax.vmap(pick, in_axes=(0, 0, 0, 0, None)), in_axes=(0, 0, 0, 0, None)),
        *[(2, 5, 80, 1, 3, 51), (2, 5, 1, 3, 51)] * 2,
        (51,),
    )
    assert hlo.count("__gpu$xla.gpu.triton") == 1
