"""jdqn's XLA flags: added to XLA_FLAGS at import, without overriding what the user set."""

import os
import subprocess
import sys

from jdqn.xla_flags import REPRODUCIBLE_GPU_FLAGS, with_reproducible_gpu_flags


def test_flags_are_added_to_empty_and_other_flags():
    assert with_reproducible_gpu_flags("") == "--xla_gpu_autotune_level=0"
    assert with_reproducible_gpu_flags("--xla_force_host_platform_device_count=1").split() == [
        "--xla_force_host_platform_device_count=1",
        "--xla_gpu_autotune_level=0",
    ]


def test_a_level_the_user_set_wins_and_nothing_is_added_twice():
    assert with_reproducible_gpu_flags("--xla_gpu_autotune_level=4") == (
        "--xla_gpu_autotune_level=4"
    )
    once = with_reproducible_gpu_flags("")
    assert with_reproducible_gpu_flags(once) == once


def test_importing_jdqn_sets_the_flags_before_any_backend_starts():
    """A fresh process: after ``import jdqn`` XLA_FLAGS holds the flags and JAX still runs."""
    code = (
        "import os, jdqn, jax.numpy as jnp;"
        "print(os.environ['XLA_FLAGS']);"
        "print(float(jnp.arange(4.0).sum()))"
    )
    env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    flags, total = result.stdout.split("\n")[:2]
    assert flags.split() == list(REPRODUCIBLE_GPU_FLAGS)
    assert total == "6.0"
