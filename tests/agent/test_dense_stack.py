"""jdqn.agent.dense_stack: the forward and the per-part backward against float64 numpy, the vmap
rule
against autodiff under every batching the learner uses, bfloat16 inputs, and the rows-outermost
layout of the parts' cotangent."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdqn.accel.pieces import Pieces
from jdqn.agent.dense_stack import dense_stack

ROWS, FEATURES, HIDDEN, OUT, PARTS = 9, 5, (6, 4), 7, 3


def _network(seed: int = 0):
    """(torso, head, x, part weights [P, R, O]). Row 0 of x is zero and unit 0 of each torso
    layer has a zero bias, so some pre-activations are exactly 0 (ReLU's derivative there is 0)."""
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 16))
    widths = (FEATURES, *HIDDEN)
    torso = []
    for fan_in, fan_out in zip(widths[:-1], widths[1:], strict=True):
        kernel = jax.random.normal(next(keys), (fan_in, fan_out)) / np.sqrt(fan_in)
        bias = jax.random.normal(next(keys), (fan_out,)).at[0].set(0.0)
        torso.append((kernel, bias))
    head = (jax.random.normal(next(keys), (OUT, widths[-1])), jax.random.normal(next(keys), (OUT,)))
    x = jax.random.normal(next(keys), (ROWS, FEATURES)).at[0].set(0.0)
    weights = jax.random.normal(next(keys), (PARTS, ROWS, OUT))
    return tuple(torso), head, x, weights


def _reference(torso, head, x, weights):
    """Forward [R, O] and each part's gradients of sum(w_p * y^2), by hand in float64."""
    as64 = lambda a: np.asarray(a, np.float64)
    inputs, h = [], as64(x)
    for kernel, bias in torso:
        inputs.append(h)
        h = np.maximum(h @ as64(kernel) + as64(bias), 0.0)
    y = h @ as64(head[0]).T + as64(head[1])
    outputs = [*inputs[1:], h]  # each torso layer's ReLU output
    parts = []
    for w in as64(weights):
        g = 2.0 * w * y  # d sum(w y^2) / dy
        head_grads = (g.T @ h, g.sum(0))
        g = g @ as64(head[0])
        torso_grads = []
        for layer in reversed(range(len(torso))):
            g = np.where(outputs[layer] > 0, g, 0.0)  # ReLU's derivative, 0 at 0
            torso_grads.append((inputs[layer].T @ g, g.sum(0)))
            g = g @ as64(torso[layer][0]).T
        parts.append((tuple(reversed(torso_grads)), head_grads, g))
    return y, parts


def _part_grads(stack, torso, head, x, weights, dtype="float32"):
    """Each part's gradients: one VJP, vmapped over the P one-hot cotangents (the learner's
    pattern), leaves [P, ...]."""

    def parts(torso, head, x):
        y = stack(torso, head, x, dtype)
        return jnp.sum(weights * y[None] ** 2, axis=(1, 2))

    _, vjp = jax.vjp(parts, torso, head, x)
    return jax.vmap(vjp)(jnp.eye(weights.shape[0]))


def _autodiff_stack(torso, head, x, dtype):
    """The same forward, differentiated by JAX's own rules."""
    h = x.astype(jnp.float32)
    for kernel, bias in torso:
        h = jax.nn.relu(
            jnp.dot(h.astype(dtype), kernel.astype(dtype), preferred_element_type=jnp.float32)
            + bias
        )
    product = jnp.dot(h.astype(dtype), head[0].astype(dtype).T, preferred_element_type=jnp.float32)
    return product + head[1]


@pytest.mark.slow
def test_forward_and_each_parts_gradients_match_float64():
    torso, head, x, weights = _network()
    y, reference = _reference(torso, head, x, weights)
    np.testing.assert_allclose(dense_stack(torso, head, x, "float32"), y, rtol=1e-5, atol=1e-5)
    grads = jax.jit(lambda *a: _part_grads(dense_stack, *a))(torso, head, x, weights)
    for p, (torso_ref, head_ref, x_ref) in enumerate(reference):
        got = jax.tree.map(lambda a, p=p: np.asarray(a[p]), grads)
        for (kernel, bias), (kernel_ref, bias_ref) in zip(got[0], torso_ref, strict=True):
            np.testing.assert_allclose(kernel, kernel_ref, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(bias, bias_ref, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[1][0], head_ref[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[1][1], head_ref[1], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[2], x_ref, rtol=1e-4, atol=1e-5)
    # The case reaches ReLU's kink: the zero row's first pre-activation is exactly 0.
    assert float((x[0] @ torso[0][0] + torso[0][1])[0]) == 0.0


def _close_to_autodiff(got, expected, tolerance=2e-6):
    """Every leaf equal up to ``tolerance`` times the leaf's largest entry."""
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        scale = float(jnp.max(jnp.abs(b))) + 1e-12
        np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=tolerance)


# bfloat16: both round their float32 sums to bfloat16, and sums accumulated in another order
# (as a GPU's GEMMs do) may round to the neighbouring value: one bfloat16 step, 2^-7 of the
# largest entry at most. On this CPU they agree to float32's tolerance.
@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 2e-6), ("bfloat16", 2.0**-7)])
def test_the_parts_rule_matches_autodiff(dtype, tolerance):
    torso, head, x, weights = _network(1)
    got = jax.jit(lambda *a: _part_grads(dense_stack, *a, dtype))(torso, head, x, weights)
    expected = jax.jit(lambda *a: _part_grads(_autodiff_stack, *a, dtype))(torso, head, x, weights)
    _close_to_autodiff(got, expected, tolerance)


@pytest.mark.slow
def test_learners_outside_the_parts_and_a_single_cotangent_match_autodiff():
    torso, head, x, weights = _network(2)
    learners = jax.tree.map(lambda a: jnp.stack([a, -0.5 * a, 2.0 * a]), (torso, head))

    def per_learner(stack):
        run = lambda net, x: _part_grads(stack, net[0], net[1], x, weights)
        return jax.jit(jax.vmap(run, in_axes=(0, None)))(learners, x)

    _close_to_autodiff(per_learner(dense_stack), per_learner(_autodiff_stack))

    def single(stack):
        return jax.grad(lambda t, h: jnp.sum(weights[0] * stack(t, h, x, "float32") ** 2), (0, 1))

    _close_to_autodiff(single(dense_stack)(torso, head), single(_autodiff_stack)(torso, head))


@pytest.mark.slow
def test_under_the_parts_vmap_the_cotangent_is_carried_rows_outermost():
    """The rule runs once for all parts on ``[R, P, out]`` (one layout for both GEMMs of a
    layer); autodiff's backward carries ``[P, R, out]`` only."""
    torso, head, x, weights = _network()

    def jaxpr(stack):
        _, vjp = jax.vjp(lambda t, h: stack(t, h, x, "float32"), torso, head)
        return str(jax.make_jaxpr(jax.vmap(vjp))(weights))

    rows_outermost = f"f32[{ROWS},{PARTS},{OUT}]"
    assert f"f32[{PARTS},{ROWS},{OUT}]" in jaxpr(_autodiff_stack)  # the check reads shapes
    assert rows_outermost not in jaxpr(_autodiff_stack)
    assert rows_outermost in jaxpr(dense_stack)
    # The head's kernel gradient and bias sum read its cotangent through one barrier with its
    # input gradient (that GEMM first in layout assignment's order; the sum a pass of its own),
    # and only the head's: one optimization_barrier on [R, P, out] and [R, P, in].
    barriers = [line for line in jaxpr(dense_stack).splitlines() if "optimization_barrier" in line]
    assert len(barriers) == 1 and rows_outermost in barriers[0]
    assert f"f32[{ROWS},{PARTS},{HIDDEN[-1]}]" in barriers[0]


@pytest.mark.slow
@pytest.mark.parametrize("plain", ["dense=autodiff", "barriers=off"])
def test_the_plain_forms_pieces_ask_for_give_the_same_gradients(plain):
    """``Pieces`` (jdqn.accel.pieces) switches the hand-written backward for JAX's autodiff, or
    drops its barrier: the same gradients under the parts' vmap, only the program differs."""
    torso, head, x, weights = _network(3)

    def traced(pieces):
        stack = functools.partial(dense_stack, pieces=pieces)
        grads = jax.jit(lambda *a: _part_grads(stack, *a))(torso, head, x, weights)
        forward = str(jax.make_jaxpr(lambda *a: stack(*a, "float32"))(torso, head, x))
        _, vjp = jax.vjp(lambda t, h: stack(t, h, x, "float32"), torso, head)
        return grads, forward, str(jax.make_jaxpr(jax.vmap(vjp))(weights))

    want, want_forward, want_backward = traced(Pieces())
    forced = Pieces(dense="autodiff") if plain == "dense=autodiff" else Pieces(barriers=False)
    got, forward, backward = traced(forced)
    _close_to_autodiff(got, want)
    assert "custom_vjp_call" in want_forward and "optimization_barrier" in want_backward
    assert "optimization_barrier" not in backward
    rows_outermost = f"f32[{ROWS},{PARTS},{OUT}]"
    if plain == "dense=autodiff":  # autodiff's layout, no custom_vjp
        assert "custom_vjp_call" not in forward and rows_outermost not in backward
    else:  # the custom backward, its layout kept
        assert "custom_vjp_call" in forward and rows_outermost in backward
