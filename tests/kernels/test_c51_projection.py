"""C51 projection (pallas_kernels.c51_projection) against an independent float64 numpy reference.

On CPU (CI) the Pallas kernel runs in interpret mode and is lowered for CUDA against an abstract
H200, so a shape the GPU backend rejects fails here. On a GPU backend the same cases also run
the real kernel (impl="pallas"), e.g. ``JAX_PLATFORMS=cuda python -m pytest tests/...``.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cuda_lowering import TRITON_DEPRECATION, lower_for_h200

from benchmarks.projection import project_scatter
from pallas_kernels import c51_project, c51_project_reference
from pallas_kernels.c51_projection import c51_project_pallas, resolve_impl

ON_GPU = jax.default_backend() == "gpu"
XLA_IMPLS = ("reference", "xla_scatter", "auto")
FAST_IMPLS = XLA_IMPLS + (("pallas",) if ON_GPU else ())
PALLAS_IMPLS = ("interpret",) + (("pallas",) if ON_GPU else ())
# Float32 positions of atoms near index 200 carry ~1.5e-5 of rounding (the reference's own error
# against float64 is of that size); mass conservation is held to 1e-5 separately.
ATOL = 2e-5


def project_np(probs, rewards, discounts, v_min, v_max):
    """float64 floor/fraction projection (an atom hit exactly keeps all of its mass)."""
    probs = np.asarray(probs, np.float64)
    batch, n_atoms = probs.shape
    dz = (v_max - v_min) / (n_atoms - 1)
    atoms = v_min + dz * np.arange(n_atoms)
    tz = np.clip(
        np.asarray(rewards, np.float64)[:, None]
        + np.asarray(discounts, np.float64)[:, None] * atoms,
        v_min,
        v_max,
    )
    pos = (tz - v_min) / dz
    low = np.clip(np.floor(pos).astype(np.int64), 0, n_atoms - 1)
    frac = pos - low
    high = np.minimum(low + 1, n_atoms - 1)
    flat_row = np.repeat(np.arange(batch) * n_atoms, n_atoms)
    out = np.bincount(flat_row + low.ravel(), (probs * (1 - frac)).ravel(), batch * n_atoms)
    out += np.bincount(flat_row + high.ravel(), (probs * frac).ravel(), batch * n_atoms)
    return out.reshape(batch, n_atoms)


def hat_np(probs, rewards, discounts, v_min, v_max):
    """float64 hat-kernel form, straight from docs/design.md §6 (small inputs only)."""
    probs = np.asarray(probs, np.float64)
    n_atoms = probs.shape[1]
    atoms = np.linspace(v_min, v_max, n_atoms)
    dz = atoms[1] - atoms[0]
    tz = np.clip(
        np.asarray(rewards)[:, None] + np.asarray(discounts)[:, None] * atoms, v_min, v_max
    )
    hat = np.clip(1 - np.abs(tz[:, :, None] - atoms[None, None, :]) / dz, 0, 1)  # [B, j, i]
    return np.einsum("bj,bji->bi", probs, hat)


def make_case(seed, batch, n_atoms, v_min, v_max, discount_values=(0.0, 0.99, 1.0)):
    """Random rows plus rewards far outside the support and exact atom landings."""
    rng = np.random.default_rng(seed)
    weights = rng.random((batch, n_atoms)) ** 4  # uneven rows, many near-empty atoms
    probs = (weights / weights.sum(1, keepdims=True)).astype(np.float32)
    span = v_max - v_min
    dz = span / (n_atoms - 1)
    rewards = rng.normal(0.0, span / 4, batch)
    discounts = np.resize(np.asarray(discount_values, np.float64), batch)
    kind = rng.integers(0, 5, batch)
    rewards = np.where(kind == 1, rng.choice([-1e4, 1e4, -3 * span, 3 * span], batch), rewards)
    landing = kind == 2  # Tz lands exactly on atoms (g = 1, r = k*dz; exact for dyadic dz)
    rewards = np.where(landing, rng.integers(-n_atoms, n_atoms, batch) * dz, rewards)
    discounts = np.where(landing, 1.0, discounts)
    rng.shuffle(discounts)
    return probs, rewards.astype(np.float32), discounts.astype(np.float32)


def check_projection(out, probs, rewards, discounts, v_min, v_max):
    out = np.asarray(out)
    assert out.shape == probs.shape and out.dtype == np.float32
    assert np.isfinite(out).all(), "unwritten or non-finite element"
    assert (out >= 0).all()
    np.testing.assert_allclose(out.sum(1), probs.astype(np.float64).sum(1), rtol=0, atol=1e-5)
    expected = project_np(probs, rewards, discounts, v_min, v_max)
    np.testing.assert_allclose(out, expected, rtol=0, atol=ATOL)


def project(impl, probs, rewards, discounts, v_min, v_max):
    """``c51_project``'s ``impl``, or benchmarks' scatter form (``"xla_scatter"``)."""
    args = jnp.asarray(probs), jnp.asarray(rewards), jnp.asarray(discounts), v_min, v_max
    if impl == "xla_scatter":
        return project_scatter(*args)
    return c51_project(*args, impl=impl)


# --------------------------------------------------------------------------------------------
# The numpy references agree with each other and with hand-computed values.
# --------------------------------------------------------------------------------------------


def test_numpy_references_agree():
    args = make_case(0, 64, 51, -10.0, 10.0, (0.0, 0.3, 0.99, 1.0, -0.7, 1.5))
    np.testing.assert_allclose(
        project_np(*args, -10.0, 10.0), hat_np(*args, -10.0, 10.0), atol=1e-12
    )


# z = [-2, -1, 0, 1, 2], dz = 1.
HAND_PROBS = np.array([0.1, 0.2, 0.3, 0.25, 0.15], np.float32)
HAND_CASES = [
    # (reward, discount, expected)
    (0.3, 0.0, [0.0, 0.0, 0.7, 0.3, 0.0]),  # terminal: all mass at clip(r), split 0.7 / 0.3
    (-1.0, 0.0, [0.0, 1.0, 0.0, 0.0, 0.0]),  # terminal, r on an atom: all mass there
    (50.0, 0.99, [0.0, 0.0, 0.0, 0.0, 1.0]),  # r beyond the support: all mass on the top atom
    (-50.0, 1.0, [1.0, 0.0, 0.0, 0.0, 0.0]),  # ... and on the bottom atom
    (1.0, 1.0, [0.0, 0.1, 0.2, 0.3, 0.4]),  # shift by one atom, overflow piles on the edge
    (0.0, 0.5, [0.0, 0.2, 0.525, 0.275, 0.0]),  # Tz = [-1, -.5, 0, .5, 1]: halves split
    (0.0, -1.0, [0.15, 0.25, 0.3, 0.2, 0.1]),  # a negative discount mirrors the distribution
]


@pytest.mark.slow
@pytest.mark.parametrize("impl", FAST_IMPLS + PALLAS_IMPLS[:1])
def test_hand_cases(impl):
    rewards = np.array([case[0] for case in HAND_CASES], np.float32)
    discounts = np.array([case[1] for case in HAND_CASES], np.float32)
    expected = np.array([case[2] for case in HAND_CASES])
    probs = np.tile(HAND_PROBS, (len(HAND_CASES), 1))
    np.testing.assert_allclose(hat_np(probs, rewards, discounts, -2.0, 2.0), expected, atol=1e-12)
    out = project(impl, probs, rewards, discounts, -2.0, 2.0)
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-6)


# --------------------------------------------------------------------------------------------
# Random cases against float64 numpy.
# --------------------------------------------------------------------------------------------

# Dyadic supports (dz = 1, 0.5, 0.25) make g = 1, r = k*dz land on atoms exactly in float32;
# the DEFAULT profile's +-240 support is checked too.
SUPPORTS = {51: (-25.0, 25.0), 101: (-25.0, 25.0), 201: (-25.0, 25.0)}


@pytest.mark.slow
@pytest.mark.parametrize("impl", FAST_IMPLS)
@pytest.mark.parametrize("n_atoms", [51, 101, 201])
@pytest.mark.parametrize("batch", [1, 37, 64, 4096])
def test_matches_numpy(impl, batch, n_atoms):
    v_min, v_max = SUPPORTS[n_atoms]
    args = make_case(batch * 1000 + n_atoms, batch, n_atoms, v_min, v_max)
    check_projection(project(impl, *args, v_min, v_max), *args, v_min, v_max)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("impl", "n_atoms"),
    [("xla_scatter", 51), ("reference", 51)]
    + ([(impl, n) for impl in ("pallas", "xla_scatter") for n in (51, 101, 201)] if ON_GPU else []),
)
def test_matches_numpy_large_batch(impl, n_atoms):
    args = make_case(n_atoms, 65537, n_atoms, -240.0, 240.0)
    check_projection(project(impl, *args, -240.0, 240.0), *args, -240.0, 240.0)


# Interpret mode is slow on CPU: a spread of shapes rather than the full grid.
KERNEL_CASES = [("interpret", batch, n) for batch, n in [(1, 51), (37, 101), (64, 51), (300, 201)]]
if ON_GPU:
    KERNEL_CASES += [
        ("pallas", batch, n) for batch in (1, 37, 64, 4096, 65537) for n in (51, 101, 201)
    ]


@pytest.mark.slow
@pytest.mark.parametrize(("impl", "batch", "n_atoms"), KERNEL_CASES)
def test_kernel_matches_numpy_and_writes_every_element(impl, batch, n_atoms):
    """The Pallas kernel with its output buffer poisoned (NaN, aliased in) before it runs."""
    v_min, v_max = SUPPORTS[n_atoms]
    args = make_case(batch + n_atoms, batch, n_atoms, v_min, v_max)
    poison = jnp.full((batch, n_atoms), jnp.nan, jnp.float32)
    out = c51_project_pallas(
        *map(jnp.asarray, args), v_min, v_max, interpret=impl == "interpret", out_init=poison
    )
    check_projection(out, *args, v_min, v_max)


@pytest.mark.slow
@pytest.mark.parametrize("impl", FAST_IMPLS + PALLAS_IMPLS[:1])
def test_default_support_and_any_discount(impl):
    """The DEFAULT +-240 support, and discounts outside [0, 1] (negative reverses the order)."""
    discounts = (0.0, 0.99, 1.0, 0.5, 0.01, 1e-7, -0.5, -1.0, 1.3)
    args = make_case(7, 64, 51, -240.0, 240.0, discounts)
    check_projection(project(impl, *args, -240.0, 240.0), *args, -240.0, 240.0)


@pytest.mark.slow
def test_mean_is_preserved_inside_the_support():
    """Hat interpolation keeps the first moment when nothing is clipped: E[m] = r + g E[p]."""
    rng = np.random.default_rng(3)
    probs = make_case(3, 64, 51, -25.0, 25.0)[0]
    rewards = rng.uniform(-2.0, 2.0, 64).astype(np.float32)
    discounts = rng.uniform(0.5, 0.9, 64).astype(np.float32)  # |Tz| <= 24.5: never clipped
    atoms = np.linspace(-25.0, 25.0, 51)
    for impl in ("reference", "xla_scatter", "interpret"):
        out = np.asarray(project(impl, probs, rewards, discounts, -25.0, 25.0), np.float64)
        np.testing.assert_allclose(out @ atoms, rewards + discounts * (probs @ atoms), atol=2e-4)


@pytest.mark.slow
@pytest.mark.parametrize("impl", FAST_IMPLS + PALLAS_IMPLS[:1])
def test_non_finite_inputs_give_nan_rows_not_garbage(impl):
    """A NaN in probs, reward or discount makes that row NaN (for the guard); others are intact."""
    probs, rewards, discounts = make_case(9, 8, 51, -25.0, 25.0)
    probs[1, 7] = np.nan
    rewards[3] = np.nan
    discounts[5] = np.nan
    out = np.asarray(project(impl, probs, rewards, discounts, -25.0, 25.0))
    assert np.isnan(out[[1, 3, 5]]).any(axis=1).all()
    ok = [0, 2, 4, 6, 7]
    expected = project_np(probs[ok], rewards[ok], discounts[ok], -25.0, 25.0)
    np.testing.assert_allclose(out[ok], expected, atol=ATOL)


# --------------------------------------------------------------------------------------------
# Transformations: vmap, jit, no recompile.
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("impl", FAST_IMPLS + PALLAS_IMPLS[:1])
def test_vmap_over_leading_axes(impl):
    """The learner vmaps over folds x seeds: nested vmap, with an unmapped argument."""
    folds, seeds, batch, n_atoms = 2, 3, 5, 51
    probs, rewards, discounts = make_case(11, folds * seeds * batch, n_atoms, -25.0, 25.0)
    probs = probs.reshape(folds, seeds, batch, n_atoms)
    rewards = rewards.reshape(folds, seeds, batch)
    discounts = discounts[:batch]  # shared by all folds and seeds

    def one(p, r, g):
        return project(impl, p, r, g, -25.0, 25.0)

    batched = jax.jit(jax.vmap(jax.vmap(one, in_axes=(0, 0, None)), in_axes=(0, 0, None)))
    out = np.asarray(batched(probs, rewards, discounts))
    for f in range(folds):
        for s in range(seeds):
            expected = project_np(probs[f, s], rewards[f, s], discounts, -25.0, 25.0)
            np.testing.assert_allclose(out[f, s], expected, atol=ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["reference", "interpret"])
def test_jit_matches_eager_and_does_not_recompile(impl):
    args = [jnp.asarray(a) for a in make_case(5, 37, 51, -25.0, 25.0)]
    fn = jax.jit(lambda p, r, g: c51_project(p, r, g, -25.0, 25.0, impl=impl))
    np.testing.assert_array_equal(
        np.asarray(fn(*args)), np.asarray(project(impl, *args, -25.0, 25.0))
    )
    fresh = [jnp.asarray(a) for a in make_case(6, 37, 51, -25.0, 25.0)]
    fn(*fresh)
    assert fn._cache_size() == 1


@pytest.mark.slow
def test_no_gradient_flows():
    """Targets are constants: the projection is stop-gradient on all inputs."""
    args = [jnp.asarray(a) for a in make_case(8, 4, 51, -25.0, 25.0)]
    grad = jax.grad(lambda p: jnp.sum(c51_project(p, args[1], args[2], -25.0, 25.0) ** 2))(args[0])
    assert np.all(np.asarray(grad) == 0)


def test_dispatch_and_validation():
    assert resolve_impl("auto") == ("pallas" if ON_GPU else "reference")
    assert c51_project_reference is not None
    probs = jnp.full((2, 5), 0.2)
    with pytest.raises(ValueError, match="impl must be one of"):
        c51_project(probs, jnp.zeros(2), jnp.ones(2), -1.0, 1.0, impl="cuda")
    with pytest.raises(ValueError, match="rewards"):
        c51_project(probs, jnp.zeros(3), jnp.ones(2), -1.0, 1.0)
    with pytest.raises(ValueError, match="v_min < v_max"):
        c51_project(probs, jnp.zeros(2), jnp.ones(2), 1.0, 1.0)


def test_pallas_refuses_inputs_beyond_int32_offsets():
    """The kernel addresses probs by int32 flat offsets: B*N >= 2**31 is refused at trace time
    with the way out (checked on shapes only, nothing is allocated)."""
    probs = jax.ShapeDtypeStruct((2**25, 64), jnp.float32)
    rows = jax.ShapeDtypeStruct((2**25,), jnp.float32)
    with pytest.raises(ValueError, match="int32 offsets.*chunks"):
        jax.eval_shape(
            lambda p, r, g: c51_project_pallas(p, r, g, -1.0, 1.0, interpret=True),
            probs,
            rows,
            rows,
        )


# --------------------------------------------------------------------------------------------
# CUDA lowering on any machine (an abstract H200): catches shapes the GPU backend rejects.
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.filterwarnings(TRITON_DEPRECATION)
@pytest.mark.parametrize("n_atoms", [2, 51, 64, 101, 201])
@pytest.mark.parametrize("batch", [1, 37, 4096, 65537])
def test_pallas_lowers_for_cuda(batch, n_atoms):
    hlo = lower_for_h200(
        lambda p, r, g: c51_project(p, r, g, -240.0, 240.0, impl="pallas"),
        (batch, n_atoms),
        (batch,),
        (batch,),
    )
    assert hlo.count("__gpu$xla.gpu.triton") == 1


@pytest.mark.filterwarnings(TRITON_DEPRECATION)
def test_pallas_lowers_for_cuda_under_vmap_as_one_launch():
    fn = jax.vmap(jax.vmap(lambda p, r, g: c51_project(p, r, g, -240.0, 240.0, impl="pallas")))
    hlo = lower_for_h200(fn, (3, 4, 37, 51), (3, 4, 37), (3, 4, 37))
    assert hlo.count("__gpu$xla.gpu.triton") == 1


@pytest.mark.filterwarnings(TRITON_DEPRECATION)
def test_cuda_lowering_rejects_a_non_power_of_two_block():
    """Control: the lowering above does check shapes (a 51-wide block is refused)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    def call(x):
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=plgpu.CompilerParams(num_warps=4),
        )(x)

    with pytest.raises(Exception, match="power of 2|power of two"):
        lower_for_h200(call, (4, 51))


# --------------------------------------------------------------------------------------------
# Properties (hypothesis; skipped where hypothesis is not installed, e.g. the GPU machine).
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["interpret", "xla_scatter"] + (["pallas"] if ON_GPU else []))
def test_property_mass_kept_and_non_negative(impl):
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    batch = 16

    @hypothesis.settings(deadline=None, max_examples=20, derandomize=True)
    @hypothesis.given(
        n_atoms=st.sampled_from([2, 5, 51]),
        seed=st.integers(0, 2**31 - 1),
        reward_scale=st.sampled_from([0.1, 1.0, 10.0, 1e4]),
        discount_low=st.floats(-1.5, 1.5),
        grid=st.booleans(),
    )
    def check(n_atoms, seed, reward_scale, discount_low, grid):
        rng = np.random.default_rng(seed)
        logits = rng.normal(0, 3, (batch, n_atoms))
        probs = (np.exp(logits) / np.exp(logits).sum(1, keepdims=True)).astype(np.float32)
        dz = 2.0 / (n_atoms - 1)
        if grid:
            rewards = (rng.integers(-2 * n_atoms, 2 * n_atoms, batch) * dz).astype(np.float32)
        else:
            rewards = (reward_scale * rng.normal(size=batch)).astype(np.float32)
        discounts = rng.uniform(discount_low, min(discount_low + 1.0, 1.5), batch)
        discounts[rng.random(batch) < 0.3] = 0.0
        discounts = discounts.astype(np.float32)
        check_projection(
            project(impl, probs, rewards, discounts, -1.0, 1.0),
            probs,
            rewards,
            discounts,
            -1.0,
            1.0,
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Triton lowering on GPU (above)
        check()
