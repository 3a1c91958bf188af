"""The learner step: guard, spectral-norm state, pruning, surgery wiring, jit/vmap, old failure.

Most tests use a small network (hidden [16, 16], 11 atoms, batch 16, buffer 32) with every
component on (2 heads with bootstrap and diversity, donors, vaccine, budget, causal term,
pruning), so compiles stay short on a CPU.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdqn.agent import GUARD_REASONS, LearnerMetrics, losses, make_learner, networks
from jdqn.agent.transition import Transition
from jdqn.config import SMOKETEST, apply_overrides
from jdqn.run.checkpoint import Checkpointer

N_FEATURES = 4
NON_CAUSAL = (0, 1)
SMALL = (
    "network.hidden=[16,16]",
    "network.n_atoms=11",
    "network.v_min=-20",
    "network.v_max=20",
    "network.n_heads=2",
    "network.bootstrap_prob=0.7",
    "network.lambda_div=0.1",
    "network.target_sparsity=0.5",
    "network.prune_start=0",
    "network.prune_end=4",
    "network.prune_every=2",
    "train.batch_size=16",
    "train.n_slices=16",
    "replay.capacity=32",
    "loss.gv_every=2",
    "loss.causal_every=2",
    "optim.target_every=3",
    "loss.grad_budget=1e-3",  # small enough to bind (Adam is scale-free, training still moves)
    # one-step transitions, plain values acted on by their mean, as the references here are
    # built (n-step returns: test_nstep; post-trade values and act_risk: test_acting, test_train)
    "loss.n_step=1",
    "network.post_trade_values=false",
    "train.act_risk=0",
)
# Pieces forced through accel.pieces ("kernels:" extras, joined into its one value): the real
# kernels on a GPU, interpret mode on CPU.
_KERNEL = "pallas" if jax.default_backend() == "gpu" else "interpret"
# The step's flat tail as kernels (pallas_kernels.flat_tail); "xla" is the optax/jnp path.
FUSED = f"kernels:tail={_KERNEL}"
XLA_TAIL = "kernels:tail=xla"
TRACES: dict[tuple[str, ...], int] = {}  # traces of the shared jitted step, per config


@functools.cache
def _cfg(*extra: str):
    forced = ",".join(e.removeprefix("kernels:") for e in extra if e.startswith("kernels:"))
    overrides = [e for e in extra if not e.startswith("kernels:")]
    return apply_overrides(SMOKETEST, [*SMALL, *overrides, f"accel.pieces={forced}"])


@functools.cache
def _learner(*extra: str, debug: bool = False):
    return make_learner(_cfg(*extra), N_FEATURES, NON_CAUSAL, debug=debug)


@functools.cache
def _jit_step(*extra: str):
    """One jitted, donated step per config, shared by the tests; counts its traces."""
    step = _learner(*extra).step

    def counted(state, alpha, beta):
        TRACES[extra] = TRACES.get(extra, 0) + 1
        return step(state, alpha, beta)

    return jax.jit(counted, donate_argnums=0)


def _transitions(key, n, reward_scale=1.0, price_scale=2.0):
    """Transitions whose rewards follow the environment's formula (so donors agree)."""
    ks = jax.random.split(key, 5)
    grid = jnp.asarray(SMOKETEST.env.positions)
    position = grid[jax.random.randint(ks[0], (n,), 0, 3)]
    action = jax.random.randint(ks[1], (n,), 0, 3)
    price_change = price_scale * jax.random.normal(ks[2], (n,))
    cost = SMOKETEST.env.cost_points * jnp.abs(grid[action] - position)
    return Transition(
        features=jax.random.normal(ks[3], (n, N_FEATURES)),
        position=position,
        action=action.astype(jnp.int32),
        reward=reward_scale * (grid[action] * price_change - cost),
        next_features=jax.random.normal(ks[4], (n, N_FEATURES)),
        price_change=price_change,
        done=(jnp.arange(n) % 7 == 0).astype(jnp.float32),
    )


def _filled(learner, seed=0):
    state = learner.init(jax.random.PRNGKey(seed))
    return learner.insert(state, _transitions(jax.random.PRNGKey(100 + seed), 32))


def _copy(tree):
    return jax.tree.map(jnp.copy, tree)


def _assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_steps_train_and_report_finite_metrics():
    step = _jit_step()
    learner = _learner()
    state = _filled(learner)
    start = _copy(state.params)
    for i in range(6):
        state, metrics = step(state, jnp.float32(0.2 if i >= 2 else 0.0), jnp.float32(0.4))
        for name, value in metrics._asdict().items():
            assert np.isfinite(value), name
    assert not bool(state.guard.halted) and int(state.step) == 6
    params = state.params
    assert not np.allclose(params["torso_0"]["kernel"], start["torso_0"]["kernel"])
    # Pruning reached its target at prune_end (= 4) and pruned weights are exactly zero.
    assert abs(float(metrics.sparsity) - 0.5) < 0.01
    masks = state.masks
    assert float(jnp.mean(masks["torso_1"]["kernel"])) == pytest.approx(0.5, abs=0.01)
    assert np.all(np.asarray(masks["torso_1"]["bias"]) == 1.0)  # biases are never pruned
    for p, m in zip(jax.tree.leaves(params), jax.tree.leaves(masks), strict=True):
        assert np.all(np.asarray(p)[np.asarray(m) == 0] == 0.0)
    # Hard target sync every 3 steps: after step 6 the target is the online net.
    _assert_trees_equal(state.target_params, state.params)
    assert float(metrics.halted) == 0.0 and float(metrics.sigma_max) > 0.0


@pytest.mark.slow
def test_mse_only_phase_has_no_c51_gradient_and_budget_is_down_only():
    step = _jit_step()
    state = _filled(_learner())
    budget = _cfg().loss.grad_budget
    state, metrics = step(state, jnp.float32(0.0), jnp.float32(0.4))
    assert float(metrics.grad_norm_c51) == 0.0 and float(metrics.grad_norm_c51_after) == 0.0
    assert float(metrics.grad_norm_mse) > budget  # so the budget binds
    np.testing.assert_allclose(float(metrics.grad_norm_mse_after), budget, rtol=1e-4)
    for _ in range(3):
        state, metrics = step(state, jnp.float32(0.2), jnp.float32(0.4))
        # The split follows the blend: MSE 0.8, C51 0.2 of the budget.
        assert float(metrics.grad_norm_mse_after) <= 0.8 * budget * (1 + 1e-4)
        assert float(metrics.grad_norm_c51_after) <= 0.2 * budget * (1 + 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize(("split", "shares"), [("alpha", (0.5, 0.5)), ("fixed", (0.3, 0.7))])
def test_the_budget_binds_and_splits_as_the_loss_blends(split, shares):
    """A budget far below both parts' norms: each part leaves the step at exactly its share of
    the budget, (1 - alpha, alpha) by default, the seed's fixed 0.3 / 0.7 when asked."""
    extra = ("loss.grad_budget=1e-7", "loss.gv_every=1000", f"loss.budget_split={split}")
    state = _filled(_learner(*extra))
    state, metrics = _jit_step(*extra)(state, jnp.float32(0.5), jnp.float32(0.4))
    assert float(metrics.grad_norm_mse) > 1e-6 and float(metrics.grad_norm_c51) > 1e-6
    after = (float(metrics.grad_norm_mse_after), float(metrics.grad_norm_c51_after))
    np.testing.assert_allclose(after, np.array(shares) * 1e-7, rtol=1e-3)


@pytest.mark.slow
def test_the_profiles_budget_is_a_tripwire_that_normal_steps_never_reach():
    """At the profiles' grad_budget (10), on rewards of about one volatility unit, no step's
    loss part comes within 5 % of its limit, so the budget changes nothing (docs/design.md §5,
    step 8); it binds only on a blow-up far above the usual gradient."""
    extra = ("loss.grad_budget=10",)
    state = _learner(*extra).init(jax.random.PRNGKey(0))
    state = _learner(*extra).insert(state, _transitions(jax.random.PRNGKey(3), 32, 1.0, 1.0))
    for i in range(8):
        alpha = 0.5 if i % 2 else 0.0
        state, metrics = _jit_step(*extra)(state, jnp.float32(alpha), jnp.float32(0.4))
        limits = 10.0 * np.array([1 - alpha, alpha])
        norms = np.array([float(metrics.grad_norm_mse), float(metrics.grad_norm_c51)])
        assert np.all(norms <= 0.05 * limits), (i, norms)
        after = [float(metrics.grad_norm_mse_after), float(metrics.grad_norm_c51_after)]
        np.testing.assert_allclose(after, norms, rtol=1e-5)  # scale 1: nothing cut


@pytest.mark.slow
def test_the_guard_stops_a_fold_whose_returns_leave_the_support():
    """Default guard settings: price changes of ~1e4 points put every projected target on the
    edge atoms; the guard halts with "edge_mass" and keeps the parameters."""
    step = _jit_step()
    state = _learner().init(jax.random.PRNGKey(0))
    state = _learner().insert(state, _transitions(jax.random.PRNGKey(3), 32, price_scale=1e4))
    before = _copy(state)
    state, metrics = step(state, jnp.float32(0.2), jnp.float32(0.4))
    assert bool(state.guard.halted) and GUARD_REASONS[int(state.guard.reason)] == "edge_mass"
    assert float(metrics.edge_mass) > _cfg().loss.edge_mass_limit
    _assert_trees_equal(state.params, before.params)


def test_support_collapse_flags_q_at_an_edge_and_edge_mass():
    from jdqn.agent.losses import support_collapse

    target = jnp.zeros((2, 11)).at[:, 5].set(1.0)
    pinned, heavy = support_collapse(jnp.array([0.0, 15.9]), target, -20.0, 20.0, 11, 0.5)
    assert not bool(pinned) and not bool(heavy)  # 15.9 < 20 - 4 (one atom)
    pinned, _ = support_collapse(jnp.array([-16.1, 0.0]), target, -20.0, 20.0, 11, 0.5)
    assert bool(pinned)
    edges = jnp.zeros((2, 11)).at[0, 0].set(1.0).at[1, 10].set(0.2).at[1, 5].set(0.8)
    assert bool(support_collapse(jnp.zeros(2), edges, -20.0, 20.0, 11, 0.5)[1])  # mean 0.6
    assert not bool(support_collapse(jnp.zeros(2), edges, -20.0, 20.0, 11, 0.7)[1])


@pytest.mark.slow
def test_spectral_u_advances_once_per_step_from_online_weights_only():
    learner = _learner()
    state = _filled(learner)
    # A target net far from the online one: if the target pass touched u, u would differ.
    state = state.replace(target_params=jax.tree.map(lambda x: 3.0 * jnp.flip(x), state.params))
    before = _copy(state)
    q_before = learner.act_q(state, jnp.ones((2, N_FEATURES + 1)))
    _assert_trees_equal(state.sn_u, before.sn_u)  # acting does not move u
    new_state, _ = _jit_step()(state, jnp.float32(0.2), jnp.float32(0.4))
    params = before.params
    masks = networks.magnitude_masks(params, networks.prune_sparsity(0, _cfg().network))
    for name in networks.torso_layers(_cfg().network):
        kernel = params[name]["kernel"] * masks[name]["kernel"]
        _, expected_u, _ = networks.spectral_normalise(kernel, before.sn_u[name], "clip")
        np.testing.assert_allclose(new_state.sn_u[name], expected_u, rtol=1e-5, atol=1e-6)
    # act_q = head mean of Q with the stored u.
    eff, _, _ = networks.effective_params(params, before.masks, before.sn_u, _cfg().network, False)
    q = networks.q_values(
        networks.apply(eff, jnp.ones((2, N_FEATURES + 1)), _cfg()), networks.atoms(_cfg().network)
    )
    np.testing.assert_allclose(q_before, q.mean(axis=1), rtol=1e-6)


def test_no_recompilation_on_later_calls():
    step = _jit_step()
    state = _filled(_learner())
    for alpha, beta in ((0.2, 0.5), (0.0, 0.7), (0.2, 0.9)):
        state, _ = step(state, jnp.float32(alpha), jnp.float32(beta))
    assert TRACES[()] == 1  # one trace for every test of this module using this config


@pytest.mark.slow
def test_jitted_and_eager_steps_agree():
    learner = _learner()
    state = _filled(learner)
    eager_state, eager_metrics = learner.step(_copy(state), jnp.float32(0.2), jnp.float32(0.5))
    state, metrics = _jit_step()(state, jnp.float32(0.2), jnp.float32(0.5))
    for name, value in metrics._asdict().items():
        np.testing.assert_allclose(value, getattr(eager_metrics, name), rtol=1e-4, atol=1e-6)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(eager_state), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_vmap_over_two_seeds_equals_separate_runs():
    learner = _learner()
    step = _jit_step()
    vstep = jax.jit(jax.vmap(learner.step, in_axes=(0, None, None)), donate_argnums=0)
    batched = jax.vmap(lambda seed: _filled(learner, seed))(jnp.arange(2))
    singles = [_filled(learner, seed) for seed in range(2)]
    for i in range(3):
        alpha = jnp.float32(0.2 * (i > 0))
        batched, batched_metrics = vstep(batched, alpha, jnp.float32(0.4))
        singles_metrics = []
        for s in range(2):
            singles[s], m = step(singles[s], alpha, jnp.float32(0.4))
            singles_metrics.append(m)
    for s in range(2):
        one = jax.tree.map(lambda leaf, s=s: leaf[s], batched)
        for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(singles[s]), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(
            batched_metrics.loss_c51[s], singles_metrics[s].loss_c51, rtol=1e-4
        )
    heads = batched.params["head"]["kernel"]  # [2, K*A*N, H]
    assert not np.allclose(heads[0], heads[1])


def _poison_and_step(poison, n_healthy=2, *extra):
    step = _jit_step(*extra)
    learner = _learner(*extra)
    state = _filled(learner)
    for _ in range(n_healthy):
        state, _ = step(state, jnp.float32(0.2), jnp.float32(0.4))
    state = learner.insert(state, poison(_transitions(jax.random.PRNGKey(7), 32)))
    before = _copy(state)
    state, metrics = step(state, jnp.float32(0.2), jnp.float32(0.4))
    return before, state, metrics, step


@pytest.mark.slow
@pytest.mark.parametrize(
    "poison",
    [
        lambda t: t._replace(reward=t.reward.at[::2].set(jnp.inf)),
        lambda t: t._replace(features=t.features.at[::2, 1].set(jnp.nan)),
    ],
    ids=["inf_reward", "nan_observation"],
)
@pytest.mark.parametrize("tail", [XLA_TAIL, FUSED])
def test_guard_rejects_a_poisoned_batch(poison, tail):
    before, state, metrics, step = _poison_and_step(poison, 2, tail)
    assert bool(state.guard.halted) and float(metrics.halted) == 1.0
    assert int(state.guard.step) == 2
    assert GUARD_REASONS[int(state.guard.reason)] == "batch"
    assert int(state.step) == 3
    for name in ("params", "target_params", "sn_u", "masks", "opt_state", "phi_hat", "key"):
        _assert_trees_equal(_compared(state, name), _compared(before, name))
    _assert_trees_equal(state.replay, before.replay)
    # Once halted, further steps are no-ops and the record keeps the first failure.
    after, _ = step(_copy(state), jnp.float32(0.2), jnp.float32(0.4))
    _assert_trees_equal(after.params, before.params)
    _assert_trees_equal(after.guard, state.guard)
    # Never NaN in the learner's own state (the poisoned transitions are the caller's data).
    for leaf in jax.tree.leaves(after.replace(replay=after.replay._replace(transitions=None))):
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            assert np.all(np.isfinite(np.asarray(leaf)))


@pytest.mark.slow
@pytest.mark.parametrize("tail", [XLA_TAIL, FUSED])
def test_guard_rejects_learning_rate_1e30(tail):
    extra = ("optim.learning_rate=1e30", tail)
    step = _jit_step(*extra)
    state = _filled(_learner(*extra))
    before = _copy(state)
    state, metrics = step(state, jnp.float32(0.2), jnp.float32(0.4))
    assert bool(state.guard.halted) and int(state.guard.step) == 0
    assert GUARD_REASONS[int(state.guard.reason)] == "params"
    for name in ("params", "target_params", "sn_u", "opt_state", "phi_hat"):
        _assert_trees_equal(_compared(state, name), _compared(before, name))
    assert np.isfinite(float(metrics.loss_c51))  # the loss was fine; the update was not


def _compared(state, name):
    """A state field as compared: the update's state without the flat tail's bounds record,
    which only the kernels write (XLA's update leaves it unknown), kept or rejected: the bounds
    of what they stored."""
    return state.opt_state[:-1] if name == "opt_state" else getattr(state, name)


def _assert_states_close(got_state, want_state, names):
    """The named fields of two learner states equal to float32 rounding, leaf by leaf."""
    for name in names:
        for got, want in zip(
            jax.tree.leaves(_compared(got_state, name)),
            jax.tree.leaves(_compared(want_state, name)),
            strict=True,
        ):
            np.testing.assert_allclose(
                np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-6, err_msg=name
            )


def _six_steps_agree(want: tuple[str, ...], got: tuple[str, ...], names: tuple[str, ...]):
    """Six steps (MSE-only, then blended) from one filled state under the configs ``want`` and
    ``got``: every metric and the ``names`` fields of the states equal to float32 rounding.
    Returns the two final states."""
    runs = []
    for extra in (want, got):
        step, state = _jit_step(*extra), _filled(_learner(*extra))
        metrics = []
        for i in range(6):
            state, m = step(state, jnp.float32(0.2 if i >= 2 else 0.0), jnp.float32(0.4))
            metrics.append(m)
        runs.append((state, metrics))
    (want_state, want_metrics), (got_state, got_metrics) = runs
    assert int(got_state.step) == 6 and not bool(got_state.guard.halted)
    for name in LearnerMetrics._fields:
        expected = np.array([float(getattr(m, name)) for m in want_metrics])
        actual = np.array([float(getattr(m, name)) for m in got_metrics])
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6, err_msg=name)
    _assert_states_close(got_state, want_state, names)
    return want_state, got_state


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [(), ("optim.tau=0.05",), ("network.lambda_div=0",)],
    ids=["hard_sync", "polyak", "no_diversity"],
)
def test_fused_tail_matches_the_xla_tail(extra):
    """Six steps (MSE-only, then blended; pruning, vaccine, budget, causal term, target sync)
    from one filled state: the kernels' update against optax and jnp, to float32 rounding, with
    the state in one form. The kernels read each layer's gradient where the backward pass wrote
    it: no [parts, n_params] matrix is assembled."""
    fused = _learner(*extra, FUSED)
    closed = jax.make_jaxpr(fused.step)(_filled(fused), jnp.float32(0.2), jnp.float32(0.4))
    concatenated = [
        eqn.outvars[0].aval.shape
        for eqn in closed.jaxpr.eqns
        if eqn.primitive.name == "concatenate"
    ]
    assert not [shape for shape in concatenated if shape[1:] == (fused.layout.size,)]
    names = ("params", "target_params", "masks", "opt_state", "phi_hat", "sn_u")
    xla_state, fused_state = _six_steps_agree((*extra, XLA_TAIL), (*extra, FUSED), names)
    assert jax.tree.structure(fused_state) == jax.tree.structure(xla_state)
    for got, want in zip(jax.tree.leaves(fused_state), jax.tree.leaves(xla_state), strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
    # The kernels bound what they wrote; XLA's update knows nothing (float32's largest value).
    assert float(fused_state.opt_state[-1].params) < float(xla_state.opt_state[-1].params)


# All three at once, and one alone (the others then stay in the program); the dense stack's and
# the heads' own tests check each piece's numbers alone.
@pytest.mark.slow
@pytest.mark.parametrize("plain", ["vjp=autodiff", "dense=autodiff,vjp=autodiff,barriers=off"])
def test_each_specialisation_switched_off_gives_the_default_step(plain, monkeypatch):
    """The plain forms ``accel.pieces`` forces (JAX's autodiff for the dense stack and the loss
    heads, no optimization barriers), chosen when the learner is built and in force when its
    step is traced later: six steps equal the default's to float32 rounding, and the program
    has none of what was switched off."""
    names = ("params", "target_params", "masks", "opt_state", "phi_hat", "sn_u")
    _six_steps_agree((), (f"kernels:{plain}",), names)

    closed_calls = []
    closed = losses._c51_head_closed
    monkeypatch.setattr(losses, "_c51_head_closed", lambda *a: closed_calls.append(1) or closed(*a))

    def program(*extra):
        learner = _learner(*extra)
        closed_calls.clear()
        fresh = lambda *args: learner.step(*args)  # noqa: E731 (jax caches traces by function)
        text = str(jax.make_jaxpr(fresh)(_filled(learner), 0.2, 0.4))
        return f"{text} closed_calls={len(closed_calls)}"

    default, switched = program(), program(f"kernels:{plain}")
    for piece, marker in (
        ("dense=autodiff", "custom_vmap_call"),  # the dense stack's backward and its vmap rule
        ("vjp=autodiff", "closed_calls=1"),  # c51_head's closed-form VJP
        ("barriers=off", "optimization_barrier"),
    ):
        assert marker in default
        assert (marker in switched) == (piece not in plain), marker


def _conds_with_a_network_pass(jaxpr) -> int:
    """The ``cond``s of ``jaxpr`` (not nested) with a matmul in a branch: the causal term's do(s)
    pass (pruning's cond sorts, the platform switch's does nothing)."""
    return sum(
        eqn.primitive.name == "cond"
        and any("dot_general" in str(branch) for branch in eqn.params["branches"])
        for eqn in jaxpr.eqns
    )


@pytest.mark.slow
def test_with_a_clock_the_causal_term_runs_only_when_due():
    """Two vmapped learners given their step counter unbatched (``clock``): the kernels' program
    puts the causal term under a ``lax.cond`` that stays a branch under vmap; without the clock
    (or with XLA's update) there is no such cond. Six steps (the term due at steps 0, 2, 4)
    equal XLA's update with the term switched by a 0/1 factor, to float32 rounding; the KL is
    reported on due steps only."""
    extra = ("network.lambda_div=0",)
    fused, xla = _learner(*extra, FUSED), _learner(*extra, XLA_TAIL)
    start = jax.vmap(lambda seed: _filled(fused, seed))(jnp.arange(2))
    vstep = jax.vmap(fused.step, in_axes=(0, None, None, None))
    args = (start, jnp.float32(0.2), jnp.float32(0.4))
    xla_vstep = jax.vmap(xla.step, in_axes=(0, None, None, None))
    xla_args = (jax.vmap(lambda seed: _filled(xla, seed))(jnp.arange(2)), *args[1:])
    for learner_step, learner_args in ((vstep, args), (xla_vstep, xla_args)):
        for clock in (jnp.int32(0), None):
            closed = jax.make_jaxpr(learner_step)(*learner_args, clock)
            expected = int(learner_step is vstep and clock is not None)
            assert _conds_with_a_network_pass(closed.jaxpr) == expected

    runs = []
    for learner, clocked in ((fused, True), (xla, False)):
        step = jax.jit(jax.vmap(learner.step, in_axes=(0, None, None, None)))
        state, metrics = jax.vmap(lambda seed, lr=learner: _filled(lr, seed))(jnp.arange(2)), []
        for i in range(6):
            clock = jnp.int32(i) if clocked else None
            state, m = step(state, jnp.float32(0.2 if i >= 2 else 0.0), jnp.float32(0.4), clock)
            metrics.append(m)
        runs.append((state, metrics))
    (cond_state, cond_metrics), (xla_state, xla_metrics) = runs
    assert np.all(np.asarray(cond_state.step) == 6)
    assert not np.asarray(cond_state.guard.halted).any()
    for name in LearnerMetrics._fields:
        want = np.array([np.asarray(getattr(m, name)) for m in xla_metrics])
        got = np.array([np.asarray(getattr(m, name)) for m in cond_metrics])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=name)
    due = np.array([np.asarray(m.causal_applied) for m in cond_metrics])  # [steps, learners]
    np.testing.assert_array_equal(due, [[1.0, 1.0], [0.0, 0.0]] * 3)
    kl = np.array([np.asarray(m.loss_causal) for m in cond_metrics])
    assert np.all(kl[::2] > 0) and np.all(kl[1::2] == 0)
    names = ("params", "target_params", "opt_state", "phi_hat", "sn_u", "key")
    _assert_states_close(cond_state, xla_state, names)


@pytest.mark.slow
@pytest.mark.parametrize("tail", [XLA_TAIL, FUSED])
def test_each_learner_syncs_its_target_on_its_own_period(tail):
    """Two vmapped learners stepped with a clock, carrying target sync periods 2 and 3
    (``Hyper.target_every``, a value: the config's is 3): after each step a learner's target is
    its new online net exactly where its own period is due, else its old target, in either
    update (the kernels read the sync as each learner's coefficient)."""
    learner = _learner(tail)

    def filled(seed, period):
        state = _filled(learner, seed)
        return state.replace(hyper=state.hyper._replace(target_every=period))

    state = jax.vmap(filled)(jnp.arange(2), jnp.int32([2, 3]))
    step = jax.jit(jax.vmap(learner.step, in_axes=(0, None, None, None)))
    for i in range(4):
        old_target = state.target_params
        state, _ = step(state, jnp.float32(0.2), jnp.float32(0.4), jnp.int32(i))
        for run, period in enumerate((2, 3)):
            want = jax.tree.leaves(state.params if (i + 1) % period == 0 else old_target)
            for got, expected in zip(jax.tree.leaves(state.target_params), want, strict=True):
                np.testing.assert_array_equal(np.asarray(got)[run], np.asarray(expected)[run])
    assert not np.asarray(state.guard.halted).any()  # every step applied


@pytest.mark.slow
@pytest.mark.parametrize("tail", [XLA_TAIL, FUSED])
def test_without_pruning_the_step_equals_masks_of_ones(tail):
    """No pruning: the step skips the masks (never reads them) and gives what masks of ones give:
    pruning switched on but never due keeps its masks at ones through the same six steps. Equal
    to float32 rounding (a multiply-add may be contracted differently without the masks)."""
    never = ("network.prune_start=1000000", "network.prune_end=1000000")
    runs = []
    for extra in (("network.target_sparsity=0", tail), (*never, tail)):
        step, state = _jit_step(*extra), _filled(_learner(*extra))
        for i in range(6):
            state, metrics = step(state, jnp.float32(0.2 if i >= 2 else 0.0), jnp.float32(0.4))
        runs.append((state, metrics))
    (skipped, skipped_metrics), (ones, ones_metrics) = runs
    for masks in (ones.masks, skipped.masks):
        assert all(np.all(np.asarray(m) == 1.0) for m in jax.tree.leaves(masks))
    assert int(skipped.step) == 6 and not bool(skipped.guard.halted)
    for name in ("params", "target_params", "opt_state", "phi_hat", "sn_u"):
        got_leaves = jax.tree.leaves(getattr(skipped, name))
        for got, want in zip(got_leaves, jax.tree.leaves(getattr(ones, name)), strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)
    for name in LearnerMetrics._fields:
        np.testing.assert_allclose(
            float(getattr(skipped_metrics, name)),
            float(getattr(ones_metrics, name)),
            rtol=1e-5,
            atol=1e-7,
            err_msg=name,
        )


@pytest.mark.slow
@pytest.mark.parametrize("tail", [XLA_TAIL, FUSED])
@pytest.mark.parametrize("sparsity", ["0", "0.5"])
def test_the_step_reads_the_masks_only_with_pruning(tail, sparsity):
    """Without pruning the state's masks pass through a step unread (the program's masks inputs
    feed no operation), whichever update runs; pruning reads them."""
    learner = _learner(f"network.target_sparsity={sparsity}", tail)
    state = _filled(learner)
    closed = jax.make_jaxpr(learner.step)(state, jnp.float32(0.2), jnp.float32(0.4))
    mask_leaves = {id(leaf) for leaf in jax.tree.leaves(state.masks)}
    indices = [i for i, leaf in enumerate(jax.tree.leaves(state)) if id(leaf) in mask_leaves]
    assert len(indices) == len(mask_leaves)
    masks = [closed.jaxpr.invars[i] for i in indices]
    read = any(v is m for eqn in closed.jaxpr.eqns for v in eqn.invars for m in masks)
    assert read == (sparsity != "0")


@pytest.mark.slow
def test_debug_checks_absent_from_the_program_when_off():
    """Debug off: no check enters the traced step (jdqn.agent.debug owns the checks themselves)."""
    state = _filled(_learner())
    args = (state, jnp.float32(0.2), jnp.float32(0.4))
    plain = str(jax.make_jaxpr(_learner().step)(*args))
    assert "check" not in plain
    debug_jaxpr = jax.make_jaxpr(_learner(debug=True).step)(*args)
    assert "check" in str(debug_jaxpr)  # the same trace with debug on does carry checks


@pytest.mark.slow
def test_old_failure_mse_phase_then_c51_with_rewards_beyond_support_stays_bounded():
    """The old trainer's -1e30 explosion: MSE-only, then alpha = 0.2, rewards of +-1000 against
    the seed's support of [-240, 240], lr 1e-3, 5,000 steps. Smaller net (hidden [32], batch 32,
    buffer 64); every other component as in the smoketest (SN, donors, vaccine, budget, causal
    term). Everything stays finite and inside the support, and the guard stops the run once the
    returns pile onto the support's edge (edge mass or Q at the edge) instead of training on."""
    cfg = apply_overrides(
        SMOKETEST,
        [
            "network.hidden=[32]",
            "train.batch_size=32",
            "replay.capacity=64",  # 64 slices
            "network.v_min=-240",
            "network.v_max=240",
            # The seed's donors (a quarter of the batch): donors recompute their rewards from the
            # price change, so with the profile's two donors per row the far-out rewards would
            # be a third of the targets.
            "loss.donor_mode=best",
            "loss.donor_fraction=0.25",
            "loss.n_step=1",  # the seed's one-step transitions
            "optim.learning_rate=1e-3",  # the seed's
        ],
    )
    assert cfg.optim.learning_rate == 1e-3 and cfg.network.v_max == 240.0
    learner = make_learner(cfg, N_FEATURES, NON_CAUSAL)
    state = learner.init(jax.random.PRNGKey(0))
    transitions = _transitions(jax.random.PRNGKey(1), 64, price_scale=1.0)
    rewards = 1000.0 * jnp.sign(jax.random.normal(jax.random.PRNGKey(2), (64,)))
    state = learner.insert(state, transitions._replace(reward=rewards))

    @jax.jit
    def run(state):
        def phase(alpha):
            def body(s, _):
                s, m = learner.step(s, alpha, jnp.float32(0.4))
                return s, m

            return body

        state, mse_metrics = jax.lax.scan(phase(jnp.float32(0.0)), state, None, length=2500)
        state, c51_metrics = jax.lax.scan(phase(jnp.float32(0.2)), state, None, length=2500)
        return state, mse_metrics, c51_metrics

    state, mse_metrics, c51_metrics = run(state)
    for metrics in (mse_metrics, c51_metrics):
        for name, values in metrics._asdict().items():
            assert np.all(np.isfinite(np.asarray(values))), name
        # Q = sum_i p_i z_i never leaves the support beyond float32 rounding of the sum.
        assert np.all(np.asarray(metrics.q_max) <= 240.0 * (1 + 1e-5))
    for leaf in jax.tree.leaves(state):
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            assert np.all(np.isfinite(np.asarray(leaf)))
    assert int(state.step) == 5000
    assert bool(state.guard.halted)
    assert GUARD_REASONS[int(state.guard.reason)] in ("q_edge", "edge_mass")
    q = learner.act_q(state, jnp.ones((4, N_FEATURES + 1)))
    assert np.all(np.abs(np.asarray(q)) <= 240.0)


def test_packed_metrics_round_trip_exactly_with_dtypes_and_leading_axes() -> None:
    from jdqn.agent import LearnerMetrics, pack_metrics, unpack_metrics
    from jdqn.agent.train import IterationMetrics

    metrics = LearnerMetrics(
        *[jnp.float32(0.5 * i - 3.0) for i in range(len(LearnerMetrics._fields))]
    )
    record = IterationMetrics(
        learner=metrics,
        trained=jnp.bool_(True),
        active=jnp.bool_(False),
        epsilon=jnp.float32(0.25),
        reward_mean=jnp.float32(-1e-7),
    )
    packed = pack_metrics(record)
    assert packed.shape == (len(LearnerMetrics._fields) + 4,) and packed.dtype == jnp.float32
    back = unpack_metrics(packed, record)
    for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(record), strict=True):
        assert got.dtype == want.dtype and got == want
    # A scan stacks packed rows to [L, M]: unpacking gives [L] leaves.
    stacked = jnp.stack([packed, packed + 1])
    back = unpack_metrics(stacked, jax.eval_shape(lambda: record))
    assert back.learner.loss_mse.shape == (2,) and back.trained.dtype == jnp.bool_
    assert float(back.learner.loss_mse[1]) == float(metrics.loss_mse) + 1
    with pytest.raises(ValueError, match="columns"):
        unpack_metrics(packed[:-1], record)


@pytest.mark.slow
def test_the_static_metrics_record_matches_what_the_step_returns() -> None:
    from jdqn.agent import LEARNER_METRICS_RECORD

    learner = make_learner(_cfg(), 15, (9, 10))
    state = learner.init(jax.random.PRNGKey(0))
    traced = jax.eval_shape(learner.step, state, 0.2, 0.5)[1]
    assert jax.tree.structure(traced) == jax.tree.structure(LEARNER_METRICS_RECORD)
    for got, want in zip(
        jax.tree.leaves(traced), jax.tree.leaves(LEARNER_METRICS_RECORD), strict=True
    ):
        assert (got.shape, got.dtype) == (want.shape, want.dtype)


@pytest.mark.slow
def test_is_weights_and_donors_enter_the_loss(monkeypatch):
    """The sampled rows' IS weights multiply their loss terms and the donors' rows add theirs:
    with every IS weight set to w (the sampler patched to return w, through the step's beta
    argument, so one compile serves every w), each loss part is D + w S with D > 0 (donors) and
    S > 0 (sampled rows), exactly linear in w."""
    from jdqn.agent import batch as batch_module

    real = batch_module.replay_sample

    def constant_weights(replay, key, batch_size, alpha, beta):
        indices, sampled, weights = real(replay, key, batch_size, alpha, beta)
        return indices, sampled, jnp.full_like(weights, beta)

    monkeypatch.setattr(batch_module, "replay_sample", constant_weights)
    cfg = _cfg("loss.donor_mode=all", "loss.donor_fraction=1.0")
    learner = make_learner(cfg, N_FEATURES, NON_CAUSAL)
    state = _filled(learner)
    step = jax.jit(learner.step)
    parts = {}
    for w in (0.0, 0.5, 1.0):
        _, metrics = step(_copy(state), jnp.float32(0.5), jnp.float32(w))
        parts[w] = np.array([float(metrics.loss_mse), float(metrics.loss_c51)])
    donors, sampled = parts[0.0], parts[1.0] - parts[0.0]
    assert np.all(donors > 0) and np.all(sampled > 0)
    np.testing.assert_allclose(parts[0.5], donors + 0.5 * sampled, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("write, resume", [(FUSED, XLA_TAIL), (XLA_TAIL, FUSED)])
def test_a_checkpoint_resumes_under_the_other_update(tmp_path, write, resume):
    """One state form whatever the implementation (jdqn.accel): a state stepped and saved with
    one update restores into the other's state and steps on, to what the writer's next step
    gives (float32 rounding)."""
    from tiny_learner import TINY

    tiny = (*TINY, "network.n_heads=1")
    writer, reader = (_learner(*tiny, impl) for impl in (write, resume))
    state = writer.init(jax.random.PRNGKey(0))
    state = writer.insert(state, _transitions(jax.random.PRNGKey(1), 16))
    state, _ = jax.jit(writer.step)(state, jnp.float32(0.2), jnp.float32(0.4))
    checkpointer = Checkpointer(tmp_path / "group0")
    checkpointer.save(1, state, {})
    restored, _ = checkpointer.restore(reader.init(jax.random.PRNGKey(5)))
    checkpointer.close()
    _assert_trees_equal(restored, state)
    resumed, resumed_metrics = jax.jit(reader.step)(restored, jnp.float32(0.2), jnp.float32(0.4))
    kept, kept_metrics = jax.jit(writer.step)(state, jnp.float32(0.2), jnp.float32(0.4))
    assert int(resumed.step) == 2 and not bool(resumed.guard.halted)
    names = ("params", "target_params", "masks", "opt_state", "phi_hat", "sn_u", "replay", "key")
    _assert_states_close(resumed, kept, names)
    np.testing.assert_allclose(resumed_metrics.loss_c51, kept_metrics.loss_c51, rtol=1e-5)
