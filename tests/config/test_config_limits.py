"""Every config number is finite and within the program's float32/int32 ranges, checked at
validation with the field named (jdqn.config.limits)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from smoke import SMOKE
from test_cli import _assert_one_line_error

from jdqn.cli import EXIT_USER_ERROR, main
from jdqn.config import DEFAULT, SMOKETEST, Config, apply_overrides
from jdqn.config.limits import FLOAT32_MAX, INT32_MAX


@pytest.mark.parametrize(
    ("override", "field", "problem"),
    [
        ("optim.learning_rate=inf", "optim.learning_rate", "not a finite number"),
        ("env.reward_scale=inf", "env.reward_scale", "not a finite number"),
        ("network.v_min=-inf", "network.v_min", "not a finite number"),
        ("loss.huber_delta=inf", "loss.huber_delta", "not a finite number"),
        ("loss.alpha_schedule=[0.0, nan]", "loss.alpha_schedule", "not a JSON list"),
        ("loss.alpha_schedule=0.0,nan", "loss.alpha_schedule", "not a finite number"),
        ("env.tick_size=1e308", "env.tick_size", "float32's range"),
        ("loss.q_clip=1e39", "loss.q_clip", "float32's range"),
        ("env.positions=[-1e39, 0, 1]", "env.positions", "float32's range"),
        ("train.seed=1e308", "train.seed", "outside [0, 2,147,483,647]"),
        ("train.seed=-1", "train.seed", "outside [0, 2,147,483,647]"),
        ("data.synthetic_seed=4294967296", "data.synthetic_seed", "outside [0,"),
        ("train.epochs=3000000000", "train.epochs", "outside"),
        ("env.tick_size=3e38", "env.tick_size", "overflow float32"),
        ("train.epochs=100000000", "train.epochs", "int32 step counter"),
    ],
)
def test_non_finite_and_impossible_numbers_are_refused_naming_the_field(override, field, problem):
    with pytest.raises(ValueError) as caught:
        apply_overrides(SMOKETEST, [override])
    message = str(caught.value)
    assert message.startswith(f"{field}:") and problem in message and "\n" not in message
    assert "fix" in message or "must be" in message


def test_every_float_field_rejects_inf_and_nan():
    """Walks the whole tree, so a new float field is covered without a new case here."""
    raw = SMOKETEST.to_dict()
    checked = 0
    for section, values in raw.items():
        for key, value in values.items():
            if isinstance(value, float) or (
                isinstance(value, list) and value and isinstance(value[0], float)
            ):
                for bad in (float("inf"), float("-inf"), float("nan")):
                    changed = json.loads(json.dumps(raw))
                    changed[section][key] = [bad, *value[1:]] if isinstance(value, list) else bad
                    with pytest.raises(ValueError, match=rf"^{section}\.{key}:"):
                        Config.from_dict(changed)
                checked += 1
    assert checked >= 30


def test_the_limits_are_float32_and_int32_and_sensible_values_pass():
    assert pytest.approx(3.4028235e38) == FLOAT32_MAX and INT32_MAX == 2**31 - 1
    edge = apply_overrides(
        SMOKETEST, ["optim.learning_rate=1e30", "train.seed=2147483647", "loss.q_clip=3e38"]
    )
    assert edge.train.seed == INT32_MAX
    for cfg in (SMOKETEST, DEFAULT):
        assert Config.from_json(cfg.to_json()) == cfg
    dataclasses.replace(SMOKETEST)  # validation passes on the profiles


@pytest.mark.parametrize("override", ["optim.learning_rate=inf", "train.seed=1e308"])
def test_the_cli_says_it_in_one_line_and_leaves_nothing(tmp_path, capsys, override):
    out = tmp_path / "runs"
    code = main([*SMOKE, "--set", override, "--out", str(out), "--no-progress"])
    assert code == EXIT_USER_ERROR
    _assert_one_line_error(capsys.readouterr().err, override.split("=")[0])
    assert not out.exists()


def test_sections_built_in_python_are_checked_when_the_config_is():
    from jdqn.config import OptimConfig

    with pytest.raises(ValueError, match=r"^optim\.learning_rate: inf is not a finite number"):
        Config(optim=OptimConfig(learning_rate=float("inf")))
