"""jdqn.accel: the user's accel.kernels choice and the test override, as implementations."""

import jax
import pytest

from jdqn import accel
from jdqn.accel import Kernels, kernels_for, pieces
from jdqn.config import SMOKETEST, apply_overrides


def test_auto_leaves_each_piece_to_the_backend_and_off_is_plain_xla(monkeypatch):
    monkeypatch.delenv(accel.KERNELS_ENV, raising=False)
    assert kernels_for(SMOKETEST.accel) == Kernels("auto", "auto")
    off = apply_overrides(SMOKETEST, ["accel.kernels=off"]).accel
    assert kernels_for(off) == Kernels("reference", "xla")


def test_the_test_override_replaces_the_pieces_it_names_and_restores_the_variable(monkeypatch):
    monkeypatch.setenv(accel.KERNELS_ENV, "tail=xla")
    off = apply_overrides(SMOKETEST, ["accel.kernels=off"]).accel
    with accel.forced("tail=interpret, projection=interpret"):
        assert kernels_for(off) == Kernels("interpret", "interpret")
    assert kernels_for(off) == Kernels("reference", "xla")
    with accel.forced(""):
        assert kernels_for(SMOKETEST.accel) == Kernels("auto", "auto")


@pytest.mark.parametrize(
    "spec",
    ["tail", "tail=triton", "adam=pallas", "pick=xla", "dense=xla", "vjp=custom", "barriers=0"],
)
def test_a_bad_override_names_the_variable_and_the_choices(spec, monkeypatch):
    with (
        pytest.raises(ValueError, match=f"{accel.KERNELS_ENV}=.*not PIECE=IMPL"),
        accel.forced(spec),
    ):
        pass
    monkeypatch.setenv(accel.KERNELS_ENV, spec)
    with pytest.raises(ValueError, match="unset JDQN_KERNELS"):
        kernels_for(SMOKETEST.accel)
    with pytest.raises(ValueError, match="unset JDQN_KERNELS"):
        pieces.piece("dense")  # as the dense stack reads it when traced


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


def test_the_other_pieces_resolve_auto_to_todays_form_and_take_their_plain_form(monkeypatch):
    monkeypatch.delenv(accel.KERNELS_ENV, raising=False)
    assert [pieces.piece(p) for p in ("dense", "vjp", "barriers")] == ["custom", "closed", "on"]
    assert pieces.piece("tail") == "auto"  # resolved against the backend by update_impl
    assert pieces.piece("executables") == "on"
    plain = "dense=autodiff,vjp=autodiff,barriers=off,executables=off"
    with accel.forced(plain):
        assert [pieces.piece(p) for p in ("dense", "vjp", "barriers", "executables")] == [
            "autodiff",
            "autodiff",
            "off",
            "off",
        ]
        # The Pallas pieces are untouched, whatever accel.kernels says.
        assert kernels_for(SMOKETEST.accel) == Kernels("auto", "auto")
    with accel.forced("dense=auto,barriers=on"):
        assert (pieces.piece("dense"), pieces.piece("barriers")) == ("custom", "on")
    x = jax.numpy.ones(3)
    with accel.forced("barriers=off"):
        assert pieces.barrier(x) is x


def test_a_step_traces_under_the_override_its_learner_was_built_under():
    seen = []
    with accel.forced("vjp=autodiff"):
        traced = pieces.traced_under(pieces.spec_now(), lambda: seen.append(pieces.piece("vjp")))
    traced()
    with accel.forced("vjp=closed"):
        traced()
    assert seen == ["autodiff", "autodiff"]
