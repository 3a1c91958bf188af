"""Debug mode: named runtime checks at every boundary, absent when off.

Three levels: the check primitives on hand-made values (message fields pinned by hand), the
learner step with a non-finite value injected at each boundary (named by debug mode, halted by the
guard without it), and whole walk-forward runs through the CLI on the real ES sample.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from es_sample import ES_FOLDS, ES_SAMPLE
from smoke import SMOKE
from tiny_learner import N_FEATURES, TINY

import jdqn.agent.surgery as surgery_module
from jdqn.agent import GUARD_REASONS, debug, losses, make_learner, networks
from jdqn.agent.train import FoldData, make_train
from jdqn.agent.transition import Transition
from jdqn.cli import EXIT_DEBUG_FAILURE, EXIT_HALTED, main
from jdqn.config import SMOKETEST, apply_overrides
from jdqn.data import FoldArrays
from jdqn.run import walkforward


def _failures(fn, *args):
    error, _ = jax.jit(debug.checked(fn))(*args)
    return debug.failures(error)


# --- the check primitives -------------------------------------------------------------------


def test_finite_names_component_leaf_step_count_and_first_bad_value():
    def f(x, step):
        checks = debug.boundaries(True, step)
        checks.finite("comp", "tree", {"ok": jnp.ones(3), "w": x})
        return x

    [(run, failure)] = _failures(f, jnp.array([1.0, jnp.nan, jnp.inf, 2.0]), jnp.int32(7))
    assert run is None
    assert (failure.component, failure.tensor, failure.problem) == (
        "comp",
        "tree['w']",
        "non-finite",
    )
    assert (failure.step, failure.count) == (7, 2) and math.isnan(failure.value)
    assert _failures(f, jnp.array([1.0, 2.0]), jnp.int32(7)) == []


@pytest.mark.slow
def test_range_distribution_and_norm_checks_pin_the_offender():
    def within(x):
        debug.boundaries(True, jnp.int32(0)).within("net", "q", x, -10.0, 10.0)
        return x

    [(_, failure)] = _failures(within, jnp.array([0.0, 5.0, -12.0, 11.0, 10.0, -10.0]))
    assert failure.problem == "outside [-10, 10]"
    assert (failure.count, failure.value) == (2, -12.0)  # -12 is further out than 11

    def distribution(p):
        debug.boundaries(True, jnp.int32(3)).distribution("proj", "m", p, 1e-4)
        return p

    leaky = jnp.array([[0.5, 0.5], [0.7, 0.2995]])  # second row sums to 0.9995
    [(_, failure)] = _failures(distribution, leaky)
    assert failure.problem == "row sums differ from 1 by more than 0.0001"
    assert failure.count == 1 and failure.value == pytest.approx(0.9995, abs=1e-6)
    negative = jnp.array([[1.1, -0.1], [0.5, 0.5]])  # rows sum to 1, entries leave [0, 1]
    [(_, failure)] = _failures(distribution, negative)
    assert failure.problem == "outside [-0.0001, 1.0001]" and failure.count == 2
    # float32 rounding of a kernel's partial masses (seen on the H200: 1 + 1e-7) is allowed
    rounded = jnp.array([[0.25, 0.75], [1.0000001, 0.0], [-1e-8, 1.0]])
    assert _failures(distribution, rounded) == []

    def norm(x):
        debug.boundaries(True, jnp.int32(0)).finite_norm("adam", "update", [x])
        return x

    [(_, failure)] = _failures(norm, jnp.array([1e20, 1.0]))  # (1e20)^2 overflows float32
    assert failure.tensor == "update[0]" and failure.problem == "squared norm overflows float32"
    assert failure.value == pytest.approx(1e20, rel=1e-6)
    assert _failures(norm, jnp.array([1e18, 1.0])) == []  # 1e36 still fits


def test_the_first_failure_in_time_wins_not_the_first_in_program_order():
    """Inside a scan, a later-traced check failing at step 3 beats an earlier one at step 5."""

    def f(bad_early_at, bad_late_at):
        def body(carry, step):
            checks = debug.boundaries(True, step)
            checks.finite("early", "a", jnp.where(step == bad_early_at, jnp.nan, 1.0))
            checks.finite("late", "b", jnp.where(step == bad_late_at, jnp.inf, 1.0))
            return carry, None

        return jax.lax.scan(body, 0, jnp.arange(10))[0]

    [(_, failure)] = _failures(f, 5, 3)
    assert (failure.component, failure.step, failure.value) == ("late", 3, math.inf)
    [(_, failure)] = _failures(f, 4, 4)  # same step: program order
    assert (failure.component, failure.step) == ("early", 4)


def test_vmapped_runs_map_to_fold_seed_and_the_earliest_step_is_reported(tmp_path):
    def run(bad_step):
        def body(carry, step):
            debug.boundaries(True, step).finite(
                "loss", "loss_c51", jnp.where(step == bad_step, jnp.nan, 0.0)
            )
            return carry, None

        return jax.lax.scan(body, 0, jnp.arange(8))[0]

    error, _ = jax.jit(jax.vmap(debug.checked(run)))(jnp.array([-1, 6, 4]))
    run_ids = [(0, 0), (0, 1), (1, 0)]
    failure, others = debug.first_failure(error, run_ids, epoch=1, chunk=2)
    assert (failure.fold, failure.seed, failure.epoch, failure.step, failure.chunk) == (
        1,
        0,
        2,
        4,
        2,
    )
    assert [(o.fold, o.seed, o.step) for o in others] == [(0, 1, 6)]
    assert failure.message == (
        "debug check failed in loss: loss_c51 non-finite (1 entries, e.g. nan) "
        "at fold 1 seed 0 epoch 2 step 4"
    )
    with pytest.raises(debug.DebugCheckFailed) as raised:
        debug.raise_if_failed(error, run_ids=run_ids, epoch=1, chunk=2, run_dir=tmp_path)
    assert (
        str(raised.value) == failure.message
        and raised.value.record == tmp_path / debug.FAILURE_FILE
    )
    record = json.loads((tmp_path / debug.FAILURE_FILE).read_text())
    assert record["failure"]["message"] == failure.message and record["failure"]["value"] == "nan"
    assert [(r["fold"], r["seed"], r["step"]) for r in record["other_runs"]] == [(0, 1, 6)]
    clean, _ = jax.jit(jax.vmap(debug.checked(run)))(jnp.array([-1, -1, -1]))
    debug.raise_if_failed(clean, run_ids=run_ids, epoch=0, chunk=0, run_dir=tmp_path / "x")


def test_off_traces_nothing():
    def plain(x):
        return x * 2

    def with_off_checks(x):
        checks = debug.boundaries(False, jnp.int32(0))
        checks.finite("a", "b", x)
        checks.within("a", "b", x, 0.0, 1.0)
        checks.distribution("a", "b", x, 1e-4)
        checks.finite_norm("a", "b", x)
        return x * 2

    x = jnp.ones((2, 3))
    assert str(jax.make_jaxpr(with_off_checks)(x)) == str(jax.make_jaxpr(plain)(x))


# --- the learner step: injections at each boundary ------------------------------------------


def _transitions(key, n):
    k = jax.random.split(key, 5)
    return Transition(
        features=jax.random.normal(k[0], (n, N_FEATURES)),
        position=jax.random.randint(k[1], (n,), -1, 2).astype(jnp.float32),
        action=jax.random.randint(k[2], (n,), 0, 3),
        reward=jax.random.normal(k[3], (n,)),
        next_features=jax.random.normal(k[4], (n, N_FEATURES)),
        price_change=jax.random.normal(k[3], (n,)),
        done=jnp.zeros((n,)),
    )


@pytest.fixture(scope="module")
def tiny():
    """Learners with debug on/off and a state with a full buffer. Steps run eagerly: every
    injection traces a different program, and op-by-op dispatch reuses compiled primitives."""
    cfg = apply_overrides(SMOKETEST, TINY)
    learners = {flag: make_learner(cfg, N_FEATURES, (0,), debug=flag) for flag in (False, True)}
    state = learners[True].init(jax.random.PRNGKey(0))
    state = learners[True].insert(state, _transitions(jax.random.PRNGKey(1), 16))
    return cfg, learners, state


def _step_both(tiny, state, alpha=0.2, beta=0.5):
    """(debug failures, guard reason of the same step with debug off)."""
    _, learners, _ = tiny
    error, _ = debug.checked(learners[True].step)(state, alpha, beta)
    plain_state, _ = learners[False].step(state, alpha, beta)
    guard = plain_state.guard
    reason = GUARD_REASONS[int(guard.reason)] if bool(guard.halted) else None
    return debug.failures(error), reason


def _poison(tree):
    """NaN as the first entry of every floating leaf (Adam's int32 count stays)."""

    def poison(x):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return x.at[(0,) * x.ndim].set(jnp.nan)

    return jax.tree.map(poison, tree)


def _replay(state, **fields):
    transitions = state.replay.transitions._replace(**fields)
    return state.replace(replay=state.replay._replace(transitions=transitions))


def _poison_layers(params):
    """NaN as the first entry of every leaf of a parameter tree."""
    return _poison(params)


STATE_INJECTIONS = {
    "params": (lambda s: s.replace(params=_poison_layers(s.params)), "learner_state", "params['"),
    "target_params": (
        lambda s: s.replace(target_params=_poison_layers(s.target_params)),
        "learner_state",
        "target_params['",
    ),
    "spectral_u": (lambda s: s.replace(sn_u=_poison(s.sn_u)), "target_network", "logits_next"),
    "features": (
        lambda s: _replay(s, features=jnp.full_like(s.replay.transitions.features, jnp.nan)),
        "batch",
        "observation",
    ),
    "reward": (
        lambda s: _replay(s, reward=jnp.full_like(s.replay.transitions.reward, jnp.inf)),
        "batch",
        "reward",
    ),
    "adam_moments": (
        lambda s: s.replace(opt_state=_poison(s.opt_state)),
        "adam",
        "update['",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STATE_INJECTIONS))
def test_state_injection_is_named_by_debug_and_halts_the_guard(tiny, name):
    _, _, state = tiny
    inject, component, tensor = STATE_INJECTIONS[name]
    found, reason = _step_both(tiny, inject(state))
    assert found, name
    failure = found[0][1]
    assert (failure.component, failure.tensor[: len(tensor)]) == (component, tensor), failure
    assert failure.step == 0 and failure.problem == "non-finite"
    assert reason is not None  # without debug: halted by the guard, not a crash


@pytest.mark.slow
def test_argument_injections(tiny):
    _, _, state = tiny
    [(_, failure)], reason = _step_both(tiny, state, alpha=jnp.nan)
    # Named by its layer: grad_mse['head']['bias'] and so on.
    assert (failure.component, failure.tensor[:10]) == ("gradient", "grad_mse['")
    assert reason == "gradient"
    [(_, failure)], reason = _step_both(tiny, state, beta=jnp.nan)
    assert (failure.component, failure.tensor) == ("replay", "is_weights")
    assert reason is not None


@pytest.mark.slow
def test_a_clock_that_is_not_the_learners_step_count_is_named(tiny):
    """The schedules follow a given clock; debug mode says when it is not the state's own step
    counter (a caller whose learners do not step in lock-step) and passes when it is."""
    _, learners, state = tiny
    step = debug.checked(learners[True].step)
    error, _ = step(state, 0.2, 0.5, jnp.int32(0))
    assert debug.failures(error) == []
    error, _ = step(state, 0.2, 0.5, jnp.int32(3))
    [(_, failure)] = debug.failures(error)
    assert (failure.component, failure.tensor, failure.value) == (
        "learner_state",
        "step_minus_clock",
        -3.0,
    )


def _nan_like(fn, fields=None):
    """``fn`` with NaN outputs: all of it, or the named fields of its NamedTuple result."""

    def poisoned(*args, **kwargs):
        out = fn(*args, **kwargs)
        if fields is None:
            return out * jnp.nan
        return out._replace(**{name: getattr(out, name) * jnp.nan for name in fields})

    return poisoned


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "attribute", "fields", "component", "tensor", "guard"),
    [
        (losses, "c51_project", None, "projection", "projected_target", "loss"),
        (losses, "cross_entropy", None, "loss", "loss_c51", "loss"),
        (losses, "causal_kl", None, "loss", "loss_causal", "loss"),
        # A surgery that returns a NaN part also returns a NaN total (the sum Adam gets).
        (surgery_module, "gradient_surgery", ("g1", "total"), "surgery", "grad_mse", "gradient"),
        (surgery_module, "gradient_surgery", ("g2", "total"), "surgery", "grad_c51", "gradient"),
    ],
)
def test_component_injection_is_named(
    tiny, monkeypatch, target, attribute, fields, component, tensor, guard
):
    _, _, state = tiny
    monkeypatch.setattr(target, attribute, _nan_like(getattr(target, attribute), fields))
    found, reason = _step_both(tiny, state)
    failure = found[0][1]
    assert (failure.component, failure.tensor, failure.step) == (component, tensor, 0), failure
    assert reason == guard


@pytest.mark.slow
def test_range_injections_are_named(tiny, monkeypatch):
    """Finite but impossible values: the guard lets them through, debug mode does not."""
    cfg, _, state = tiny
    project = losses.c51_project
    monkeypatch.setattr(losses, "c51_project", lambda *a, **k: project(*a, **k) * 0.99)
    [(_, failure)], reason = _step_both(tiny, state)  # mass lost, every entry still in [0, 1]
    assert (failure.component, failure.tensor) == ("projection", "projected_target")
    assert failure.problem == "row sums differ from 1 by more than 0.0001"
    assert failure.value == pytest.approx(0.99, abs=1e-5)
    assert reason is None
    monkeypatch.undo()
    q_values = networks.q_values
    monkeypatch.setattr(networks, "q_values", lambda *a: q_values(*a) + 2 * cfg.network.v_max)
    found, _ = _step_both(tiny, state)
    failure = found[0][1]
    assert (failure.component, failure.tensor) == ("online_network", "q_next")
    assert failure.problem == "outside [-10.002, 10.002]"


@pytest.mark.slow
def test_clean_step_passes_every_check_and_gives_the_numbers_of_debug_off(tiny):
    """Both evaluated the same way (checkify's evaluation of the traced step; eager op-by-op
    differs from it in float32 rounding). The whole-run test compares the compiled programs."""
    _, learners, state = tiny
    error, checked = debug.checked(learners[True].step)(state, 0.2, 0.5)
    assert error.get() is None
    no_checks, plain = debug.checked(learners[False].step)(state, 0.2, 0.5)
    assert no_checks.get() is None and not bool(plain[0].guard.halted)
    jax.tree.map(np.testing.assert_array_equal, checked, plain)


# --- the compiled training program ------------------------------------------------------------


def _sub_jaxprs(value):
    if hasattr(value, "eqns"):
        yield value
    elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):  # ClosedJaxpr
        yield value.jaxpr
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _sub_jaxprs(item)


def _count_primitive(jaxpr, name: str) -> int:
    """Equations of primitive ``name`` in ``jaxpr`` and every jaxpr nested in its equations."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == name
        for value in eqn.params.values():
            for sub in _sub_jaxprs(value):
                count += _count_primitive(sub, name)
    return count


@pytest.mark.slow
def test_debug_off_program_has_no_checks_and_debug_on_has_them():
    """The vmapped chunk program as walk-forward compiles it: off, no check primitive in the
    jaxpr and no error values among the lowered program's results."""
    cfg = apply_overrides(SMOKETEST, [*TINY, "train.n_slices=4", "train.chunk_iterations=4"])
    folds = FoldData(features=jnp.zeros((2, 64, N_FEATURES)), close=jnp.ones((2, 64)))
    lowered, jaxprs, n_out = {}, {}, {}
    for flag in (False, True):
        program = make_train(cfg, N_FEATURES, 64, (0,), debug=flag)
        state = jax.vmap(program.init)(jax.random.split(jax.random.PRNGKey(0), 2), folds)
        chunk = jax.vmap(program.run_chunk, (0, 0, None, None))
        args = (state, folds, jnp.int32(0), jnp.int32(0))
        jaxprs[flag] = jax.make_jaxpr(chunk)(*args).jaxpr
        n_out[flag] = len(jax.tree.leaves(jax.eval_shape(chunk, *args)))
        wrapped = jax.vmap(debug.checked(program.run_chunk), (0, 0, None, None)) if flag else chunk
        lowered[flag] = jax.jit(wrapped).lower(*args).as_text()
    assert _count_primitive(jaxprs[False], "check") == 0
    assert _count_primitive(jaxprs[True], "check") > 40  # every boundary of the learner step
    assert n_out[False] == n_out[True]

    def n_results(text: str) -> int:
        signature = next(line for line in text.splitlines() if "func.func public @main" in line)
        return signature.split("->", 1)[1].count("tensor<")

    assert n_results(lowered[False]) == n_out[False]  # only state and metrics come out
    assert n_results(lowered[True]) > n_out[True]  # plus the error value: pred, code, payload
    assert lowered[True].count("stablehlo.is_finite") > lowered[False].count("stablehlo.is_finite")


# --- whole walk-forward runs through the CLI ----------------------------------------------------


def _cli(tmp_path: Path, name: str, *extra: str) -> int:
    args = [*SMOKE, "--data", str(ES_SAMPLE), "--out", str(tmp_path), "--no-progress"]
    args += ["--name", name, "--epochs", "1"]
    for item in [*ES_FOLDS, "output.plots=false", "output.tensorboard=false"]:
        args += ["--set", item]
    return main([*args, *extra])


def _statuses(run_dir: Path) -> list[str]:
    return [row["status"] for row in json.loads((run_dir / "results.json").read_text())["folds"]]


@pytest.mark.slow
def test_poisoned_data_is_named_in_debug_and_halts_the_guard_without(tmp_path, monkeypatch, capsys):
    """Fold 0: NaN features at four train bars; fold 1: NaN closes (so NaN rewards) there."""
    load = walkforward.load_data

    def poisoned(cfg):
        data = load(cfg)
        train = [FoldArrays(a.features.copy(), a.close.copy()) for a in data.train]  # folds
        train[0].features[100:104, 0] = np.nan  # may share the bar series' memory
        train[1].close[100:104] = np.nan
        return dataclasses.replace(data, train=tuple(train))

    monkeypatch.setattr(walkforward, "load_data", poisoned)
    assert _cli(tmp_path, "debug", "--debug") == EXIT_DEBUG_FAILURE
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    record = json.loads((tmp_path / "debug.incomplete" / debug.FAILURE_FILE).read_text())
    assert not (tmp_path / "debug").exists()  # left incomplete
    failures = [record["failure"], *record["other_runs"]]
    assert err.startswith("jdqn: ") and record["failure"]["message"] in err
    named = {f["fold"]: (f["component"], f["tensor"], f["epoch"], f["step"]) for f in failures}
    assert named[0][0] == "batch" and named[0][1] in ("observation", "next_observation")
    assert named[1][:2] == ("batch", "reward") and named[0][2] == named[1][2] == 1
    assert record["failure"]["step"] == min(step for *_, step in named.values())

    assert _cli(tmp_path, "plain") == EXIT_HALTED
    statuses = _statuses(tmp_path / "plain")
    # The guard stops each poisoned fold at the very step debug mode named.
    assert statuses == [f"halted: batch at epoch 1 step {named[k][3]}" for k in (0, 1)] + ["ok"]


@pytest.mark.slow
def test_absurd_learning_rate_is_named_in_debug_and_halts_the_guard_without(tmp_path, capsys):
    absurd = ("--set", "optim.learning_rate=1e30")
    assert _cli(tmp_path, "debug", "--debug", *absurd) == EXIT_DEBUG_FAILURE
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "debug check failed in adam: update['" in err
    assert "squared norm overflows float32" in err and "epoch 1 step 0" in err
    assert _cli(tmp_path, "plain", *absurd) == EXIT_HALTED
    assert all(
        s.startswith("halted: params at epoch 1 step 0") for s in _statuses(tmp_path / "plain")
    )


@pytest.mark.slow
def test_clean_run_gives_the_same_numbers_with_and_without_debug(tmp_path):
    """What is promised on CPU: the same numbers while the C51 weight alpha is 0 (the MSE-only
    epochs; the smoketest's first, the one these runs train: the programs of the runs above,
    not compiled again). With alpha > 0 the two programs differ in float32 rounding
    from the first learner step (about 1e-9 in phi_hat and 3e-7 in the parameters after two
    chunks), and training carries that apart: debug mode's checks make XLA:CPU keep values of
    the C51 part of the pass that it otherwise fuses away; neither rounding the surgered parts
    nor the gradient rows like the checked program removed it."""
    assert _cli(tmp_path, "debug", "--debug") == 0
    assert _cli(tmp_path, "plain") == 0
    with_debug = json.loads((tmp_path / "debug" / "results.json").read_text())
    without = json.loads((tmp_path / "plain" / "results.json").read_text())
    assert with_debug["folds"] == without["folds"]
    assert (tmp_path / "debug" / "metrics.jsonl").read_text() == (
        tmp_path / "plain" / "metrics.jsonl"
    ).read_text()
    assert not (tmp_path / "debug" / debug.FAILURE_FILE).exists()
