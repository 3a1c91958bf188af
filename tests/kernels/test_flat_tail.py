"""The flat tail kernels (pallas_kernels.flat_tail) against float64 numpy written here.

On CPU (CI) the kernels run in interpret mode and are lowered for CUDA against an abstract H200
(a construct the Triton lowering rejects fails here); on a GPU backend the same cases also run
the real kernels, e.g. ``JAX_PLATFORMS=cuda python -m pytest tests/kernels/test_flat_tail.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from cuda_lowering import TRITON_DEPRECATION, lower_for_h200

from pallas_kernels import flat_tail

ON_GPU = jax.default_backend() == "gpu"
KERNELS = ("interpret",) + (("pallas",) if ON_GPU else ())
IMPLS = ("reference",) + KERNELS
HYPER = flat_tail.AdamHyper(b1=0.9, b2=0.999, eps=1e-8, tau=0.0)
LR = 1e-3  # the learning rate, a per-learner value (TailScalars.lr)
# Sizes around the kernels' chunk: one partial chunk, exact chunks, a partial last chunk.
SIZES = (1, 37, flat_tail.BLOCK, flat_tail.BLOCK + 1, 3 * flat_tail.BLOCK - 5)


def gram_np(grads):
    g = np.asarray(grads, np.float64)
    row_max = np.max(np.abs(g), axis=1)
    scaled = g / np.where(row_max > 0, row_max, 1.0)[:, None]
    return row_max, scaled @ scaled.T


def adam_np(
    grads, weights, params, masks, target, mu, nu, count, pre_ok, sync, b1, b2, eps, lr, tau
):
    """Adam (Kingma & Ba 2015, Algorithm 1 with optax's eps placement) in float64, then the
    masks, the target sync and the guard's keep-or-reject, written out by hand."""
    f64 = [np.asarray(x, np.float64) for x in (grads, weights, params, masks, target, mu, nu)]
    grads, weights, params, masks, target, mu, nu = f64
    g = weights @ grads
    new_mu = b1 * mu + (1 - b1) * g
    new_nu = b2 * nu + (1 - b2) * g**2
    step = (new_mu / (1 - b1**count)) / (np.sqrt(new_nu / (1 - b2**count)) + eps)
    new_params = (params * masks - lr * step) * masks
    new_target = (
        (1 - tau) * target + tau * new_params if tau > 0 else (new_params if sync else target)
    )
    with np.errstate(over="ignore", invalid="ignore"):
        ok = pre_ok and np.all(np.isfinite(g)) and np.isfinite(np.sum(new_params**2))
    pick = (lambda new, old: new) if ok else (lambda new, old: old)
    return (
        pick(new_params, params),
        pick(new_target, target),
        pick(new_mu, mu),
        pick(new_nu, nu),
        bool(ok),
    )


def _grads(rng, parts, n, scales=(1.0, 1e-3, 30.0, 0.5, 2.0)):
    return (rng.normal(size=(parts, n)) * np.asarray(scales[:parts])[:, None]).astype(np.float32)


def _adam_inputs(rng, parts, n, count=3):
    vec = lambda scale: (scale * rng.normal(size=n)).astype(np.float32)  # noqa: E731
    masks = (rng.uniform(size=n) > 0.2).astype(np.float32)
    return dict(
        grads=_grads(rng, parts, n),
        weights=np.asarray([0.7, 1.9, 1.0, 1.0, 1.0][:parts], np.float32),
        params=vec(0.3),
        masks=masks,
        target=vec(0.3),
        mu=vec(1e-2),
        nu=np.abs(vec(1e-3)),
        count=count,
    )


def _vectors(inputs):
    return flat_tail.TailVectors(*(inputs[k] for k in flat_tail.TailVectors._fields))


def _hyper(hyper):
    """The test's settings (AdamHyper's fields and ``lr``) -> (AdamHyper, lr)."""
    lr = hyper.pop("lr", LR)
    return HYPER._replace(**hyper), lr


def _adam(impl, inputs, pre_ok=True, sync=False, **hyper):
    hyper, lr = _hyper(hyper)
    count = inputs["count"]
    scalars = flat_tail.TailScalars(1 - hyper.b1**count, 1 - hyper.b2**count, pre_ok, sync, lr)
    return flat_tail.adam_select(
        inputs["grads"], inputs["weights"], _vectors(inputs), scalars, hyper, impl=impl
    )


def _adam_expected(inputs, pre_ok=True, sync=False, **hyper):
    hyper, lr = _hyper(hyper)
    keys = ("grads", "weights", "params", "masks", "target", "mu", "nu", "count")
    return adam_np(*(inputs[k] for k in keys), pre_ok, sync, *hyper[:3], lr, hyper.tau)


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("n", SIZES)
def test_gram_matches_numpy(impl, parts, n):
    grads = _grads(np.random.default_rng(n + parts), parts, n)
    row_max, gram = flat_tail.gram(jnp.asarray(grads), impl=impl)
    want_max, want_gram = gram_np(grads)
    np.testing.assert_allclose(np.asarray(row_max), want_max, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gram), want_gram, rtol=2e-5, atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
def test_gram_hand_case_zero_row_and_non_finite_rows(impl):
    grads = np.zeros((3, 5), np.float32)
    grads[0] = [3.0, -4.0, 0.0, 0.0, 0.0]  # max 4, rescaled norm^2 = (9 + 16) / 16
    row_max, gram = flat_tail.gram(jnp.asarray(grads), impl=impl)
    np.testing.assert_allclose(np.asarray(row_max), [4.0, 0.0, 0.0])
    np.testing.assert_allclose(np.asarray(gram), np.diag([25 / 16, 0.0, 0.0]), rtol=1e-6)
    grads[1, 3] = np.inf
    grads[2, 0] = np.nan
    row_max, _ = flat_tail.gram(jnp.asarray(grads), impl=impl)
    assert np.isfinite(row_max[0]) and np.isnan(row_max[1]) and np.isnan(row_max[2])


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("sync", [False, True])
def test_adam_select_matches_numpy(impl, parts, n, sync):
    inputs = _adam_inputs(np.random.default_rng(n), parts, n)
    out = _adam(impl, inputs, sync=sync)
    want = _adam_expected(inputs, sync=sync)
    for got, expected in zip((out.params, out.target, out.mu, out.nu), want[:4], strict=True):
        np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-5, atol=1e-7)
    assert bool(out.applied) and bool(out.total_finite)
    np.testing.assert_allclose(
        float(out.params_sq_norm), np.sum(np.asarray(want[0], np.float64) ** 2), rtol=1e-5
    )


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
def test_adam_select_polyak_target(impl):
    inputs = _adam_inputs(np.random.default_rng(1), 3, 300)
    out = _adam(impl, inputs, tau=0.05)
    want = _adam_expected(inputs, tau=0.05)
    np.testing.assert_allclose(np.asarray(out.target), want[1], rtol=2e-5, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", ["not_ok_before", "inf_gradient", "nan_gradient", "overflow"])
def test_adam_select_keeps_the_old_state_when_the_guard_fails(impl, case):
    inputs = _adam_inputs(np.random.default_rng(2), 3, 2 * flat_tail.BLOCK + 3)
    hyper = {}
    if case == "inf_gradient":
        inputs["grads"][2, -1] = np.inf
    elif case == "nan_gradient":
        inputs["grads"][0, 5] = np.nan
    elif case == "overflow":
        hyper = dict(lr=1e30)  # finite parameters whose squared norm overflows float32
    out = _adam(impl, inputs, pre_ok=case != "not_ok_before", sync=True, **hyper)
    assert not bool(out.applied)
    assert bool(out.total_finite) == (case in ("not_ok_before", "overflow"))
    for got, old in zip(
        (out.params, out.target, out.mu, out.nu),
        (inputs["params"], inputs["target"], inputs["mu"], inputs["nu"]),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(got), old)


# Column segments as the backward pass writes the per-layer gradients: blocks of their own,
# partial blocks, a segment of one element, one of exactly a block.
SEGMENTS = (37, 1, flat_tail.BLOCK, flat_tail.BLOCK + 1, 5)


def _split(grads, sizes=SEGMENTS):
    return tuple(jnp.asarray(g) for g in np.split(grads, np.cumsum(sizes)[:-1], axis=-1))


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("parts", [2, 3])
def test_gram_of_segments_is_the_gram_of_their_concatenation(impl, parts):
    """The Gram matrix and row maxima of ``[parts, P]`` given as its column segments: each
    segment's blocks are read from its own array, and the rows are what float64 numpy gives for
    the whole matrix; a non-finite entry in one segment still marks its row."""
    grads = _grads(np.random.default_rng(parts), parts, sum(SEGMENTS))
    # The segments' scales differ by 1e6, so a block rescaled to the wrong maximum shows.
    grads[:, :37] *= 1e3
    grads[:, -5:] *= 1e-3
    row_max, gram = flat_tail.gram(_split(grads), impl=impl)
    want_max, want_gram = gram_np(grads)
    np.testing.assert_allclose(np.asarray(row_max), want_max, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gram), want_gram, rtol=2e-5, atol=2e-5)
    grads[1, 37] = np.nan  # the one-element segment
    row_max, _ = flat_tail.gram(_split(grads), impl=impl)
    assert np.isnan(row_max[1]) and np.all(np.isfinite(np.delete(np.asarray(row_max), 1)))


def _whole(x):
    """A vector the tail returned flat or in segments, flat (numpy)."""
    return np.concatenate([np.asarray(p) for p in x], -1) if isinstance(x, tuple) else x


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("pre_ok", [True, False])
@pytest.mark.parametrize("masks", [True, False], ids=["masks", "no_masks"])
@pytest.mark.parametrize("state", ["flat", "leaves"])
def test_adam_select_of_segments_matches_numpy(impl, parts, pre_ok, masks, state):
    """Adam, masks, the hard sync and the guard on gradients given as column segments: every
    flat vector's element takes the gradient of its own column, as float64 numpy computes it
    on the whole matrix. The parameters and target stay whole ("flat") or come and go in the
    gradient's segments ("leaves"); the other vectors stay whole."""
    inputs = _adam_inputs(np.random.default_rng(7 + parts), parts, sum(SEGMENTS))
    inputs["grads"][:, :37] *= 1e3
    if not masks:
        inputs["masks"] = np.ones(sum(SEGMENTS), np.float32)
    expected = _adam_expected(inputs, pre_ok=pre_ok, sync=True)
    segmented = {**inputs, "grads": _split(inputs["grads"])}
    if state == "leaves":
        segmented.update(params=_split(inputs["params"]), target=_split(inputs["target"]))
    if not masks:
        segmented["masks"] = None
    out = _adam(impl, segmented, pre_ok=pre_ok, sync=True)
    assert bool(out.applied) == expected[4] == pre_ok
    for got in (out.params, out.target):
        assert isinstance(got, tuple) == (state == "leaves")
        if state == "leaves":
            assert [p.shape for p in got] == [(n,) for n in SEGMENTS]
    for got, want in zip((out.params, out.target, out.mu, out.nu), expected[:4], strict=True):
        np.testing.assert_allclose(_whole(got), want, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(
        float(out.params_sq_norm),
        np.sum(_adam_expected(inputs, sync=True)[0].astype(np.float64) ** 2),
        rtol=1e-5,
    )


def _learner_grid(rng, parts):
    """Gradients ``[2, 3, parts, P]`` and the other inputs stacked ``[2, 3, ...]``: learners on
    two vmapped axes, each with its own inputs (P the segments' total)."""
    n = sum(SEGMENTS)
    grads = np.stack([[_grads(rng, parts, n) for _ in range(3)] for _ in range(2)])
    inputs = [[_adam_inputs(rng, parts, n) for _ in range(3)] for _ in range(2)]
    stacked = {
        k: jnp.stack([jnp.stack([jnp.asarray(i[k]) for i in r]) for r in inputs])
        for k in inputs[0][0]
    }
    return grads, stacked


@pytest.mark.slow
@pytest.mark.parametrize("impl", KERNELS)
def test_segments_under_nested_vmap_equal_the_whole_matrix(impl):
    """Two vmapped axes of learners, gradients as segments, one launch per kernel: each
    learner's outputs are the kernels' on its whole ``[parts, P]`` matrix, to float32 rounding
    (the blocks differ, so the partial sums are added in another order)."""
    grads, stacked = _learner_grid(np.random.default_rng(11), 3)

    def one(g, vectors):
        scalars = flat_tail.TailScalars(bias1=0.271, bias2=0.003, pre_ok=True, sync=True, lr=LR)
        row_max, gram = flat_tail.gram(g, impl=impl)
        weights = jnp.asarray([0.7, 1.9, 1.0], jnp.float32)
        out = flat_tail.adam_select(g, weights, vectors, scalars, HYPER, impl=impl)
        return row_max, gram, out

    segments = _split(grads)
    batched = jax.jit(jax.vmap(jax.vmap(one)))(segments, _vectors(stacked))
    for i in range(2):
        for j in range(3):
            vectors = _vectors({k: v[i, j] for k, v in stacked.items()})
            whole = one(jnp.asarray(grads[i, j]), vectors)
            for got, want in zip(jax.tree.leaves(batched), jax.tree.leaves(whole), strict=True):
                want = np.asarray(want)
                scale = float(np.max(np.abs(want), initial=0.0))
                np.testing.assert_allclose(
                    np.asarray(got[i, j]), want, rtol=1e-5, atol=1e-6 * scale
                )


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("sync", [False, True])
def test_adam_select_of_leaf_vectors_with_polyak_and_unsynced_hard_target(impl, sync):
    """Parameters and target in segments under the Polyak average (the old target read and
    written everywhere) and under a hard sync on a step it is not due (neither read nor
    written: the old target comes back): as float64 numpy on the whole vectors."""
    inputs = _adam_inputs(np.random.default_rng(21), 2, sum(SEGMENTS))
    leaves = {
        **inputs,
        "grads": _split(inputs["grads"]),
        "params": _split(inputs["params"]),
        "target": _split(inputs["target"]),
    }
    for tau in (0.05, 0.0):
        out = _adam(impl, leaves, sync=sync, tau=tau)
        expected = _adam_expected(inputs, sync=sync, tau=tau)
        for got, want in zip((out.params, out.target), expected[:2], strict=True):
            np.testing.assert_allclose(_whole(got), want, rtol=2e-5, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("impl", KERNELS)
def test_leaf_vectors_under_nested_vmap_equal_the_flat_vectors(impl):
    """Two vmapped axes of learners, the parameters and target in segments: one launch per
    kernel, and each learner's vectors are what the flat form gives, bit for bit (the same
    blocks, the same arithmetic, other arrays)."""
    grads, stacked = _learner_grid(np.random.default_rng(5), 2)

    def one(g, vectors):
        scalars = flat_tail.TailScalars(bias1=0.271, bias2=0.003, pre_ok=True, sync=True, lr=LR)
        weights = jnp.asarray([0.7, 1.9], jnp.float32)
        return flat_tail.adam_select(g, weights, vectors, scalars, HYPER, impl=impl)

    run = jax.jit(jax.vmap(jax.vmap(one)))
    segments = _split(grads)
    flat = run(segments, _vectors(stacked))
    leaves = {**stacked, "params": _split(stacked["params"]), "target": _split(stacked["target"])}
    split = run(segments, _vectors(leaves))
    assert isinstance(split.params, tuple) and split.params[0].shape == (2, 3, SEGMENTS[0])
    for name in ("params", "target", "mu", "nu"):
        np.testing.assert_array_equal(_whole(getattr(split, name)), getattr(flat, name))
    np.testing.assert_array_equal(split.params_sq_norm, flat.params_sq_norm)


def test_leaf_vectors_of_other_sizes_are_refused():
    inputs = _adam_inputs(np.random.default_rng(2), 2, sum(SEGMENTS))
    leaves = {
        **inputs,
        "grads": _split(inputs["grads"]),
        "params": _split(inputs["params"], (43, sum(SEGMENTS) - 43)),
    }
    with pytest.raises(ValueError, match="params segments"):
        _adam("interpret", leaves)


def test_segments_of_other_shapes_are_refused():
    segments = (jnp.zeros((2, 10)), jnp.zeros((3, 4)))
    with pytest.raises(ValueError, match="segments must be"):
        flat_tail.gram(segments, impl="interpret")


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n", [37, 2 * flat_tail.BLOCK + 3])
@pytest.mark.parametrize("tau", [0.0, 0.05])
def test_adam_select_without_masks_is_all_ones_masks(impl, n, tau):
    """No pruning: the kernels take no masks and give what masks of ones give, to the last bit
    but for where the compiler contracts a multiply-add (``p * 1 + u`` and ``p + u`` may be
    fused differently: at most 1 ulp), and what float64 numpy gives; a rejected step too."""
    inputs = _adam_inputs(np.random.default_rng(n), 3, n)
    inputs["masks"] = np.ones(n, np.float32)
    for pre_ok in (True, False):
        with_ones = _adam(impl, inputs, pre_ok=pre_ok, sync=True, tau=tau)
        without = _adam(impl, {**inputs, "masks": None}, pre_ok=pre_ok, sync=True, tau=tau)
        for name in ("params", "target", "mu", "nu"):
            got, want = np.asarray(getattr(without, name)), np.asarray(getattr(with_ones, name))
            np.testing.assert_array_max_ulp(got, want, maxulp=1)
        assert bool(without.applied) == bool(with_ones.applied)
        assert bool(without.total_finite) == bool(with_ones.total_finite)
        np.testing.assert_allclose(
            float(without.params_sq_norm), float(with_ones.params_sq_norm), rtol=1e-6
        )
        expected = _adam_expected(inputs, pre_ok=pre_ok, sync=True, tau=tau)
        assert bool(without.applied) == expected[4] == pre_ok
        for got, want in zip(
            (without.params, without.target, without.mu, without.nu), expected[:4], strict=True
        ):
            np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=1e-7)


def test_kernels_refuse_fewer_than_two_parts():
    grads = jnp.zeros((1, 10), jnp.float32)
    with pytest.raises(ValueError, match="at least 2 loss parts"):
        flat_tail.gram(grads, impl="interpret")
    inputs = _adam_inputs(np.random.default_rng(5), 3, 10)
    inputs["grads"], inputs["weights"] = grads, np.ones(1, np.float32)
    with pytest.raises(ValueError, match="at least 2 loss parts"):
        _adam("interpret", inputs)


@pytest.mark.slow
@pytest.mark.parametrize("impl", KERNELS)
@pytest.mark.parametrize("parts", [4, 5])
def test_any_number_of_parts_matches_numpy(impl, parts):
    """Each loss term is a gradient row of its own: the kernels take any number of them."""
    rng = np.random.default_rng(parts)
    n = flat_tail.BLOCK + 1
    row_max, gram = flat_tail.gram(jnp.asarray(_grads(rng, parts, n)), impl=impl)
    want_max, want_gram = gram_np(_grads(np.random.default_rng(parts), parts, n))
    np.testing.assert_allclose(np.asarray(row_max), want_max, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gram), want_gram, rtol=2e-5, atol=2e-5)
    inputs = _adam_inputs(rng, parts, n)
    got = _adam(impl, inputs, sync=True)
    expected = _adam_expected(inputs, sync=True)
    assert bool(got.applied) == expected[4]
    for value, want in zip((got.params, got.target, got.mu, got.nu), expected[:4], strict=True):
        np.testing.assert_allclose(np.asarray(value), want, rtol=2e-5, atol=1e-7)


def test_unknown_impl_is_refused():
    with pytest.raises(ValueError, match="impl must be one of"):
        flat_tail.gram(jnp.zeros((2, 4)), impl="xla")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="impl must be one of"):
        _adam("auto", _adam_inputs(np.random.default_rng(6), 2, 4))


@pytest.mark.slow
def test_reference_adam_is_optax_adam():
    """The reference's Adam against optax itself (the XLA path of the learner uses optax)."""
    inputs = _adam_inputs(np.random.default_rng(3), 2, 1000, count=0)
    optimizer = optax.adam(LR, b1=HYPER.b1, b2=HYPER.b2, eps=HYPER.eps)
    params = jnp.asarray(inputs["params"]) * inputs["masks"]
    state = optimizer.init(params)
    state = (
        state[0]._replace(mu=jnp.asarray(inputs["mu"]), nu=jnp.asarray(inputs["nu"])),
        state[1],
    )
    total = jnp.asarray(inputs["weights"]) @ jnp.asarray(inputs["grads"])
    updates, new_state = optimizer.update(total, state, params)
    want = optax.apply_updates(params, updates) * inputs["masks"]
    inputs["count"] = 1
    out = _adam("reference", inputs)
    np.testing.assert_allclose(np.asarray(out.params), np.asarray(want), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.asarray(out.mu), np.asarray(new_state[0].mu), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out.nu), np.asarray(new_state[0].nu), rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("impl", KERNELS)
@pytest.mark.parametrize("masks", [True, False], ids=["masks", "no_masks"])
def test_nested_vmap_equals_one_learner_at_a_time(impl, masks):
    rng = np.random.default_rng(4)
    n = flat_tail.BLOCK + 9
    grads = jnp.asarray(np.stack([[_grads(rng, 3, n) for _ in range(3)] for _ in range(2)]))
    row_max, gram = jax.vmap(jax.vmap(lambda g: flat_tail.gram(g, impl=impl)))(grads)
    inputs = [_adam_inputs(rng, 3, n) for _ in range(2)]
    stacked = {k: jnp.stack([jnp.asarray(i[k]) for i in inputs]) for k in inputs[0]}
    if not masks:
        stacked["masks"] = None
    pre_ok = jnp.asarray([True, False])

    def one(grads, weights, vectors, ok):
        scalars = flat_tail.TailScalars(bias1=0.271, bias2=0.003, pre_ok=ok, sync=True, lr=LR)
        return flat_tail.adam_select(grads, weights, vectors, scalars, HYPER, impl=impl)

    # Not bit for bit: interpret mode runs the kernels as XLA:CPU code that may contract
    # multiply-adds differently inside a larger program, and the blocks' sums are added up by
    # XLA in an order that can depend on the batch shape (H200: last-bit differences).
    def close(got, want):
        want = np.asarray(want)
        scale = float(np.max(np.abs(want), initial=0.0))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6 * scale)

    batched = jax.vmap(one)(stacked["grads"], stacked["weights"], _vectors(stacked), pre_ok)
    for i in range(2):
        for j in range(3):
            want_max, want_gram = flat_tail.gram(grads[i, j], impl=impl)
            close(row_max[i, j], want_max)
            close(gram[i, j], want_gram)
        single = one(
            stacked["grads"][i],
            stacked["weights"][i],
            _vectors({k: None if v is None else v[i] for k, v in stacked.items()}),
            pre_ok[i],
        )
        for got, want in zip(jax.tree.leaves(batched), jax.tree.leaves(single), strict=True):
            close(got[i], want)


@pytest.mark.slow
@pytest.mark.filterwarnings(TRITON_DEPRECATION)
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("masks", [True, False], ids=["masks", "no_masks"])
def test_kernels_lower_for_cuda_as_three_launches_under_vmap(parts, masks):
    n = 15_193  # the smoketest network's parameter count

    def tail(g, w, p, m, t, mu, nu, s):
        row_max, gram = flat_tail.gram(g)
        vectors = flat_tail.TailVectors(p, m if masks else None, t, mu, nu)
        out = flat_tail.adam_select(g, w, vectors, flat_tail.TailScalars(*s), HYPER)
        return row_max, gram, out

    hlo = lower_for_h200(
        jax.vmap(jax.vmap(tail)),
        (2, 5, parts, n),
        (2, 5, parts),
        *[(2, 5, n)] * 5,
        (2, 5, 5),
    )
    assert hlo.count("__gpu$xla.gpu.triton") == 3  # gram, Adam's sums, Adam's write


@pytest.mark.slow
@pytest.mark.filterwarnings(TRITON_DEPRECATION)
def test_kernels_of_segments_lower_for_cuda_as_three_launches():
    sizes = (1_024, 64, 4_096, 64, 9_792, 153)  # the smoketest network's layers

    def tail(*args):
        *segments, w, p, t, mu, nu, s = args
        row_max, gram = flat_tail.gram(segments)
        vectors = flat_tail.TailVectors(p, None, t, mu, nu)
        out = flat_tail.adam_select(segments, w, vectors, flat_tail.TailScalars(*s), HYPER)
        return row_max, gram, out

    hlo = lower_for_h200(
        jax.vmap(tail),
        *[(8, 2, size) for size in sizes],
        (8, 2),
        *[(8, sum(sizes))] * 4,
        (8, 5),
    )
    assert hlo.count("__gpu$xla.gpu.triton") == 3


# --------------------------------------------------------------------------------------------
# The guard's sums skipped where the candidate is provably finite.
# --------------------------------------------------------------------------------------------


def _bounds_of(inputs):
    """What the write launch returns for these stored vectors: their largest |x|."""
    return flat_tail.TailBounds(
        *(np.float32(np.max(np.abs(inputs[k]))) for k in ("params", "mu", "nu"))
    )


def _shown(inputs, bounds=None, **hyper):
    """provably_finite for these inputs, with their own bounds unless ``bounds`` is given."""
    hyper, lr = _hyper(hyper)
    count = inputs["count"]
    scalars = flat_tail.TailScalars(1 - hyper.b1**count, 1 - hyper.b2**count, True, False, lr)
    row_max, _ = flat_tail.gram_reference(jnp.asarray(inputs["grads"]))
    n = inputs["grads"].shape[1]
    weights = jnp.asarray(inputs["weights"])
    bounds = _bounds_of(inputs) if bounds is None else bounds
    return bool(
        flat_tail.provably_finite(
            flat_tail.candidate_bounds(row_max, weights, bounds, scalars, hyper, n)
        )
    )


@pytest.mark.slow
@pytest.mark.parametrize("impl", KERNELS)
@pytest.mark.parametrize("case", ["shown", "pre_ok_false", "overflow", "nan_gradient"])
def test_adam_select_with_bounds_gives_what_every_check_gives(impl, case):
    """With the previous step's bounds the kernels skip the guard's sums where the candidate is
    provably finite (the learner's usual case) and run them where it is not; either way every
    output is what the kernels give without bounds, bit for bit, and the returned bounds are
    the stored vectors' largest |x|."""
    inputs = _adam_inputs(np.random.default_rng(7), 3, 2 * flat_tail.BLOCK + 3)
    hyper = dict(lr=1e30) if case == "overflow" else {}
    if case == "nan_gradient":
        inputs["grads"][1, 9] = np.nan
    pre_ok = case != "pre_ok_false"
    assert _shown(inputs, **hyper) == (case in ("shown", "pre_ok_false"))
    hyper_, lr = _hyper(dict(hyper))
    count = inputs["count"]
    scalars = flat_tail.TailScalars(1 - hyper_.b1**count, 1 - hyper_.b2**count, pre_ok, True, lr)
    row_max, _ = flat_tail.gram(jnp.asarray(inputs["grads"]), impl=impl)
    args = (inputs["grads"], inputs["weights"], _vectors(inputs), scalars, hyper_)
    with_bounds = flat_tail.adam_select(
        *args, impl=impl, bounds=_bounds_of(inputs), row_max=row_max
    )
    checked = flat_tail.adam_select(*args, impl=impl)
    for got, want in zip(jax.tree.leaves(with_bounds), jax.tree.leaves(checked), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert bool(with_bounds.applied) == (case == "shown")
    for name in ("params", "mu", "nu"):
        # To the last bit or so: in interpret mode XLA:CPU may contract the multiply-adds of
        # the stored value and of the value maxed differently (provably_finite's margin is
        # many orders of magnitude wider).
        stored = np.max(np.abs(np.asarray(getattr(with_bounds, name))))
        np.testing.assert_allclose(float(getattr(with_bounds.bounds, name)), stored, rtol=1e-6)


@pytest.mark.slow
def test_candidate_bounds_bound_the_candidate():
    """Each of candidate_bounds's bounds holds for the values the reference computes (the
    kernels' formulas in float32), up to float32 rounding, over magnitudes from ordinary to
    near float32's limits; and where provably_finite says so, the step passes the guard."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    magnitude = st.sampled_from([0.0, 1e-30, 1e-3, 1.0, 1e3, 1e8, 1e15, 1e17, 1e18, 1e19, 1e30])

    @hypothesis.settings(max_examples=300)
    @hypothesis.given(
        seed=st.integers(0, 2**31 - 1),
        n=st.sampled_from([1, 37, 2000]),
        grad=magnitude,
        params=magnitude,
        mu=magnitude,
        nu=magnitude,
        lr=st.sampled_from([1e-3, 1.0, 1e10, 1e20]),
        eps=st.sampled_from([1e-8, 1e-20, 1.0]),
        count=st.sampled_from([1, 2, 100, 10_000]),
        masked=st.booleans(),
    )
    def check(seed, n, grad, params, mu, nu, lr, eps, count, masked):
        rng = np.random.default_rng(seed)
        vec = lambda scale: (scale * rng.uniform(-1, 1, n)).astype(np.float32)  # noqa: E731
        inputs = dict(
            grads=np.stack([vec(grad), vec(grad * 1e-3), vec(grad)]),
            weights=rng.uniform(-2, 2, 3).astype(np.float32),
            params=vec(params),
            masks=(rng.uniform(size=n) > 0.2).astype(np.float32) if masked else None,
            target=vec(1.0),
            mu=vec(mu),
            nu=np.abs(vec(nu)),
            count=count,
        )
        hyper = HYPER._replace(eps=eps)
        scalars = flat_tail.TailScalars(1 - hyper.b1**count, 1 - hyper.b2**count, True, False, lr)
        row_max, _ = flat_tail.gram_reference(jnp.asarray(inputs["grads"]))
        weights = jnp.asarray(inputs["weights"])
        args = (row_max, weights, _bounds_of(inputs), scalars, hyper, n)
        bound = flat_tail.candidate_bounds(*args)
        with np.errstate(all="ignore"):
            g = np.asarray(weights @ jnp.asarray(inputs["grads"]))
            mu_new = (1 - hyper.b1) * g + hyper.b1 * inputs["mu"]
            nu_new = (1 - hyper.b2) * (g * g) + hyper.b2 * inputs["nu"]
            mu_hat, nu_hat = mu_new / scalars.bias1, nu_new / scalars.bias2
            ratio = mu_hat / (np.sqrt(nu_hat) + np.float32(eps))
            out = _adam("reference", inputs, lr=lr, eps=eps)
        rounding = 1 + 1e-5
        for value, limit in (
            (np.abs(g), bound.grad),
            (np.abs(mu_hat), bound.mu_hat),
            (nu_hat, bound.nu_hat),
            (np.abs(ratio), bound.ratio),
        ):
            finite = np.isfinite(value)
            assert np.all(value[finite] <= float(limit) * rounding)
        if bool(flat_tail.provably_finite(bound)):
            assert bool(out.applied) and bool(out.total_finite)
            assert float(out.params_sq_norm) <= float(bound.sq_norm) * rounding
            assert np.all(np.abs(np.asarray(out.params)) <= float(bound.params) * rounding)
            for name in ("params", "target", "mu", "nu"):
                assert np.all(np.isfinite(np.asarray(getattr(out, name))))

    check()


@pytest.mark.slow
def test_unknown_bounds_show_nothing():
    inputs = _adam_inputs(np.random.default_rng(8), 2, 10, count=1)
    assert not _shown(inputs, flat_tail.unknown_bounds())
    assert _shown(inputs)
