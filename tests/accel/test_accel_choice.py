"""jdqn.accel.choose: the user's accel.kernels and the tests' accel.pieces, as one static
description (jdqn.accel.Pieces) that the step passes down."""

import jax
import jax.numpy as jnp
import pytest

from jdqn.accel import FUSED_TAIL_MIN_LEARNERS, Pieces, choose
from jdqn.accel.pieces import PLAIN
from jdqn.agent import make_learner
from jdqn.config import SMOKETEST, apply_overrides

MANY = FUSED_TAIL_MIN_LEARNERS


def _choose(overrides=(), backend="cpu", debug=False, learners=1):
    cfg = apply_overrides(SMOKETEST, list(overrides))
    return choose(cfg, backend=backend, debug=debug, learners=learners)


def test_auto_runs_the_kernels_on_a_gpu_where_they_pay_and_off_is_plain_xla():
    assert _choose() == Pieces() == PLAIN  # CPU: the jnp projection, XLA's tail
    assert _choose(backend="gpu", learners=MANY) == Pieces(projection="pallas", tail="pallas")
    assert _choose(backend="gpu", learners=MANY - 1) == Pieces(projection="pallas")
    assert _choose(backend="gpu", debug=True, learners=MANY).tail == "xla"
    assert _choose(backend="cpu", learners=MANY) == Pieces()
    assert _choose(["accel.kernels=off"], backend="gpu", learners=MANY) == Pieces()


def test_accel_pieces_forces_the_pieces_it_names_whatever_the_backend_and_kernels_say():
    forced = ["accel.kernels=off", "accel.pieces=tail=interpret, projection=interpret"]
    assert _choose(forced) == Pieces(projection="interpret", tail="interpret")
    for tail in ("xla", "pallas", "interpret"):
        assert _choose([f"accel.pieces=tail={tail}"], debug=True).tail == tail
    plain = "accel.pieces=dense=autodiff,vjp=autodiff,barriers=off,executables=off"
    got = _choose([plain], backend="gpu", learners=MANY)
    assert got == Pieces("pallas", "pallas", "autodiff", "autodiff", False, False)
    assert _choose(["accel.pieces=dense=auto,barriers=on"]) == Pieces()
    x = jnp.ones(3)
    assert got.barrier(x) is x and Pieces().barrier(x) is not x
    assert hash(got) != hash(Pieces())  # a static argument: hashable, equal by value


@pytest.mark.parametrize(
    "spec",
    ["tail", "tail=triton", "adam=pallas", "pick=xla", "dense=xla", "vjp=custom", "barriers=0"],
)
def test_a_bad_pieces_value_names_the_field_and_the_choices(spec):
    with pytest.raises(ValueError, match=f"accel.pieces: '{spec}' is not one of projection="):
        apply_overrides(SMOKETEST, [f"accel.pieces={spec}"])


def test_interpret_is_not_a_user_value_and_old_config_files_still_load():
    with pytest.raises(ValueError, match="accel.kernels"):
        apply_overrides(SMOKETEST, ["accel.kernels=interpret"])
    with pytest.raises(ValueError, match="unknown key"):
        apply_overrides(SMOKETEST, ["optim.update_impl=xla"])
    old = SMOKETEST.to_dict()
    old["loss"].update(projection_impl="auto", pick_impl="interpret")
    old["optim"]["update_impl"] = "interpret"
    del old["accel"]
    assert type(SMOKETEST).from_dict(old) == SMOKETEST


@pytest.mark.slow
def test_no_environment_variable_reaches_the_traced_step(monkeypatch):
    """The step's program follows its config alone: the retired ``JDQN_KERNELS`` override, set
    while a learner is built and traced, changes nothing; ``accel.pieces`` does."""

    def jaxpr(overrides=()):
        learner = make_learner(apply_overrides(SMOKETEST, list(overrides)), 4, (0,))
        state = learner.init(jax.random.PRNGKey(0))
        return str(jax.make_jaxpr(learner.step)(state, jnp.float32(0.2), jnp.float32(0.4)))

    plain = jaxpr()
    monkeypatch.setenv("JDQN_KERNELS", "dense=autodiff,vjp=autodiff,barriers=off")
    assert jaxpr() == plain
    forced = jaxpr(["accel.pieces=dense=autodiff,vjp=autodiff,barriers=off"])
    assert "custom_vjp_call" in plain and "custom_vjp_call" not in forced
    assert "optimization_barrier" in plain and "optimization_barrier" not in forced
