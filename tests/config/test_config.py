"""Config: frozen, validated at construction, JSON round-trip, typed overrides."""

import dataclasses

import pytest

from jdqn.config import DEFAULT, SMOKETEST, Config, apply_overrides, profile


def test_profiles_have_the_documented_smoketest_shape():
    cfg = profile("smoketest")
    assert cfg.network.hidden == (64, 64)
    assert cfg.train.batch_size == 64 and cfg.replay.capacity == 256
    assert cfg.train.n_slices == 64 and cfg.train.epochs == 4
    assert cfg.walkforward.n_folds == 3
    assert cfg.loss.alpha_schedule == (0.0, 0.2)
    assert (cfg.network.n_atoms, cfg.network.v_min, cfg.network.v_max) == (51, -10.0, 10.0)
    assert cfg.env.reward_unit == "train_volatility" and cfg.train.bootstrap_slice_ends
    assert (cfg.loss.donor_mode, cfg.loss.donor_fraction) == ("all", 2.0)
    assert cfg.network.post_trade_values and cfg.loss.n_step == 3


def test_volatility_units_resolve_from_the_train_window():
    """reward_scale / RMS of the per-bar price change; once resolved, resolving again is a no-op;
    a window whose close never moves is refused with the fix."""
    from jdqn.evaluation.env import volatility_reward_scale

    env = apply_overrides(SMOKETEST, ["env.reward_scale=2.0"]).env
    close = [100.0, 101.0, 100.0, 102.0]  # changes 1, -1, 2: RMS sqrt(2)
    resolved = volatility_reward_scale(env, close)
    assert resolved.reward_unit == "points"
    assert resolved.reward_scale == pytest.approx(2.0 / 2**0.5)
    assert volatility_reward_scale(resolved, [1.0, 5.0]) == resolved
    with pytest.raises(ValueError, match="env.reward_unit"):
        volatility_reward_scale(env, [100.0, 100.0, 100.0])


@pytest.mark.parametrize("cfg", [SMOKETEST, DEFAULT])
def test_json_round_trip_is_exact(cfg):
    assert Config.from_json(cfg.to_json()) == cfg


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SMOKETEST.train.epochs = 5  # type: ignore[misc]


def test_overrides_are_typed():
    cfg = apply_overrides(
        SMOKETEST,
        ["network.hidden=[32, 16]", "loss.huber_delta=1.5", "train.epochs=3", "output.plots=false"],
    )
    assert cfg.network.hidden == (32, 16)
    assert cfg.loss.huber_delta == 1.5
    assert cfg.train.epochs == 3 and isinstance(cfg.train.epochs, int)
    assert cfg.output.plots is False
    assert apply_overrides(cfg, ["loss.huber_delta=none"]).loss.huber_delta is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("network.v_min=500", "network.v_min"),
        ("foo.bar=1", "valid sections"),
        ("train.nope=1", "valid keys of train"),
        ("train.epochs=x", "expected int"),
        ("train.epochs=2.5", "expected int"),
        ("walkforward.mode=sideways", "walkforward.mode"),
        ("walkforward.purge_bars=10", "feature lookback"),
        ("replay.capacity=8", "replay.capacity"),
        ("loss.alpha_schedule=[0.0, 1.5]", "loss.alpha_schedule"),
        ("accel.kernels=interpret", "accel.kernels"),
        ("data.signal_kind=trend", "data.signal_kind: 'trend' is not one of"),
        ("data.signal_lookback=0", "data.signal_lookback"),
        ("output.settings_tried=0", "output.settings_tried"),
        ("trainepochs", "section.field=value"),
    ],
)
def test_impossible_values_name_the_field(override, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(SMOKETEST, [override])


def test_unknown_profile_lists_valid_ones():
    with pytest.raises(ValueError, match="smoketest"):
        profile("huge")


def test_scaled_returns_is_a_boolean_named_in_its_error():
    assert apply_overrides(SMOKETEST, ["data.scaled_returns=false"]).data.scaled_returns is False
    with pytest.raises(ValueError, match=r"data\.scaled_returns: expected true/false; got 'maybe'"):
        apply_overrides(SMOKETEST, ["data.scaled_returns=maybe"])
