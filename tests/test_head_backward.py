"""The head-backward kernel (pallas_kernels.head_backward) against float64 numpy written here.

On CPU (CI) the kernel runs in interpret mode and is lowered for CUDA against an abstract H200;
on a GPU backend the same cases also run the real kernel, e.g.
``JAX_PLATFORMS=cuda JAX_DEFAULT_MATMUL_PRECISION=highest python -m pytest
tests/test_head_backward.py`` (highest: the kernel's dots in IEEE float32, as the reference).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cuda_lowering import TRITON_DEPRECATION, lower_for_h200, pallas_call_sizes

from pallas_kernels import head_backward as hb

ON_GPU = jax.default_backend() == "gpu"
KERNELS = ("interpret",) + (("pallas",) if ON_GPU else ())
IMPLS = ("reference",) + KERNELS


def backward_np(g, action, x, w, n_actions):
    """By hand in float64: the dense cotangent (the taken action's columns of each head, zero
    elsewhere), then dW = sum_r g_r x_r^T, db = sum_r g_r, dx_r = g_r W."""
    rows, parts, heads, atoms = g.shape
    dense = np.zeros((rows, parts, heads, n_actions, atoms))
    for r in range(rows):
        dense[r, :, :, action[r], :] = g[r]
    dense = dense.reshape(rows, parts, -1)
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    return (
        np.einsum("rpo,ri->poi", dense, x64),
        dense.sum(axis=0),
        np.einsum("rpo,oi->rpi", dense, w64),
    )


def _case(seed, rows, parts, heads, actions, atoms, inputs):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(rows, parts, heads, atoms)).astype(np.float32),
        rng.integers(0, actions, size=rows).astype(np.int32),
        rng.normal(size=(rows, inputs)).astype(np.float32),
        rng.normal(size=(heads * actions * atoms, inputs)).astype(np.float32),
    )


def _close(got, want):
    for g, w, name in zip(got, want, ("kernel", "bias", "x"), strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "rows, parts, heads, actions, atoms, inputs",
    # The smoketest's head (80 rows, 2 parts, 51 atoms, 64 inputs); two heads, three parts and
    # sizes that are no powers of two; a single row.
    [(80, 2, 1, 3, 51, 64), (37, 3, 2, 3, 11, 24), (1, 1, 1, 2, 4, 8)],
)
def test_the_backward_matches_float64(impl, rows, parts, heads, actions, atoms, inputs):
    args = _case(rows + atoms, rows, parts, heads, actions, atoms, inputs)
    got = hb.head_backward(*args, actions, impl)
    out = heads * actions * atoms
    assert [a.shape for a in got] == [(parts, out, inputs), (parts, out), (rows, parts, inputs)]
    _close(got, backward_np(*args, actions))


@pytest.mark.parametrize("impl", KERNELS)
def test_an_action_no_row_takes_gets_exactly_zero(impl):
    g, action, x, w = _case(5, 12, 2, 1, 3, 7, 16)
    action[:] = np.arange(12) % 2  # action 2 is never taken
    grads = hb.head_backward(g, action, x, w, 3, impl)
    assert np.all(np.asarray(grads.kernel)[:, 14:21] == 0.0)
    assert np.all(np.asarray(grads.bias)[:, 14:21] == 0.0)
    _close(grads, backward_np(g, action, x, w, 3))


@pytest.mark.parametrize("impl", KERNELS)
def test_nested_vmaps_fold_into_one_launch_and_match_each_learner(impl):
    cases = [_case(10 + i, 24, 2, 1, 3, 11, 16) for i in range(6)]
    stacked = [np.stack([c[k] for c in cases]).reshape(2, 3, *cases[0][k].shape) for k in range(4)]

    def backward(g, action, x, w):
        return hb.head_backward(g, action, x, w, 3, impl)

    got = jax.jit(jax.vmap(jax.vmap(backward)))(*stacked)
    jaxpr = jax.make_jaxpr(jax.vmap(jax.vmap(backward)))(*stacked)
    assert pallas_call_sizes(jaxpr.jaxpr) == [6 * 24 * 2 * 11]  # one launch, every learner
    for i, case in enumerate(cases):
        _close([a.reshape(6, *a.shape[2:])[i] for a in got], backward_np(*case, 3))


def test_bad_shapes_and_impls_are_refused():
    g, action, x, w = _case(4, 8, 2, 1, 3, 11, 16)
    with pytest.raises(ValueError, match="cotangent"):
        hb.head_backward(g[0], action, x, w, 3)
    with pytest.raises(ValueError, match="want actions"):
        hb.head_backward(g, action[:4], x, w, 3)
    with pytest.raises(ValueError, match="want actions"):
        hb.head_backward(g, action, x, w[:5], 3)
    with pytest.raises(ValueError, match="impl must be one of"):
        hb.head_backward(g, action, x, w, 3, "xla")


@pytest.mark.filterwarnings(TRITON_DEPRECATION)
def test_the_kernel_lowers_for_cuda_as_one_launch_under_vmap():
    def backward(g, action, x, w):
        return hb.head_backward(g, action.astype(jnp.int32), x, w, 3)

    hlo = lower_for_h200(
        jax.vmap(jax.vmap(backward)),
        (2, 5, 80, 2, 1, 51),
        (2, 5, 80),
        (2, 5, 80, 64),
        (2, 5, 153, 64),
    )
    assert hlo.count("__gpu$xla.gpu.triton") == 1
