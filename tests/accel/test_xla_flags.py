"""jdqn's XLA flags: added to XLA_FLAGS by ``jdqn.configure()`` (the ``jdqn`` command and
``run_walkforward`` call it), never by ``import jdqn``, without overriding what the user set."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jdqn.accel.xla_flags import (
    CPU_YNN_FUSIONS_FLAG,
    DOT_MERGER_FLAG,
    PREALLOCATE_VAR,
    SCHEDULING_FLAG,
    cache_root,
    with_gpu_flags,
)

CONCURRENT = f"{SCHEDULING_FLAG}=CONCURRENT"
NO_DOT_MERGE = f"{DOT_MERGER_FLAG}=0"
NO_YNN = f"{CPU_YNN_FUSIONS_FLAG}="


def test_the_graph_mode_dot_merging_and_cpu_fusions_are_added_to_empty_and_other_flags():
    assert with_gpu_flags("").split() == [CONCURRENT, NO_DOT_MERGE, NO_YNN]
    assert with_gpu_flags("--xla_force_host_platform_device_count=1").split() == [
        "--xla_force_host_platform_device_count=1",
        CONCURRENT,
        NO_DOT_MERGE,
        NO_YNN,
    ]


def test_what_the_user_set_wins_and_nothing_is_added_twice():
    # An autotune level (0 = no autotuning: fresh compiles agree) is passed on as is.
    level = "--xla_gpu_autotune_level=0"
    assert with_gpu_flags(level).split() == [level, CONCURRENT, NO_DOT_MERGE, NO_YNN]
    own = f"{SCHEDULING_FLAG}=LHS {DOT_MERGER_FLAG}=32 {CPU_YNN_FUSIONS_FLAG}=default"
    assert with_gpu_flags(own) == own
    once = with_gpu_flags("")
    assert with_gpu_flags(once) == once


def test_cache_root_follows_jdqn_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("JDQN_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("JDQN_CACHE_DIR")
    assert cache_root() == Path.home() / ".cache" / "jdqn" / "xla"


def _fresh_process(code: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = {
        key: value for key, value in os.environ.items() if key not in ("XLA_FLAGS", PREALLOCATE_VAR)
    }
    env.update(JAX_PLATFORMS="cpu", **env_extra)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )


@pytest.mark.slow
def test_importing_jdqn_changes_nothing_in_the_process(tmp_path):
    code = (
        "import os, jdqn, jdqn.run.walkforward, jdqn.agent.step;"
        f"print(repr(os.environ.get('XLA_FLAGS')), os.environ.get('{PREALLOCATE_VAR}'))"
    )
    assert _fresh_process(code, JDQN_CACHE_DIR=str(tmp_path)).stdout.strip() == "None None"
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_configure_sets_the_flags_before_any_backend_starts(tmp_path):
    """A fresh process: after ``jdqn.configure()`` XLA_FLAGS holds jdqn's flags, and JAX (which
    parses every flag) still runs."""
    code = (
        "import os, jdqn, jax.numpy as jnp;"
        "print(jdqn.configure());"
        "print(os.environ['XLA_FLAGS']);"
        "print(float(jnp.arange(4.0).sum()))"
    )
    result = _fresh_process(code, JDQN_CACHE_DIR=str(tmp_path))
    took, flags, total = result.stdout.split("\n")[:3]
    assert took == "True"
    assert flags.split() == [CONCURRENT, NO_DOT_MERGE, NO_YNN]
    assert total == "6.0"


@pytest.mark.slow
def test_configure_after_a_backend_started_changes_nothing_and_says_so(tmp_path):
    code = (
        "import os, jdqn, jax.numpy as jnp;"
        "jnp.arange(2.0).sum().block_until_ready();"
        "print(jdqn.configure(), repr(os.environ.get('XLA_FLAGS')))"
    )
    assert _fresh_process(code, JDQN_CACHE_DIR=str(tmp_path)).stdout.strip() == "False None"


@pytest.mark.slow
def test_the_jdqn_command_configures_before_it_runs(tmp_path):
    code = (
        "import os, contextlib, io, jdqn.cli;"
        "out = io.StringIO();"
        "ctx = contextlib.redirect_stdout(out);"
        "ctx.__enter__(); jdqn.cli.main(['config', 'keys']); ctx.__exit__(None, None, None);"
        "print(os.environ['XLA_FLAGS'])"
    )
    flags = _fresh_process(code, JDQN_CACHE_DIR=str(tmp_path)).stdout.strip().split()
    assert flags == [CONCURRENT, NO_DOT_MERGE, NO_YNN]


@pytest.mark.slow
def test_gpu_memory_is_taken_on_demand_unless_the_user_says_otherwise(tmp_path):
    """``jdqn.configure()`` turns JAX's up-front reservation of 75 % of the GPU off (it cost every
    process ~1.4 s on the H200), unless the user set the variable themselves."""
    code = f"import os, jdqn; jdqn.configure(); print(os.environ['{PREALLOCATE_VAR}'])"
    assert _fresh_process(code, JDQN_CACHE_DIR=str(tmp_path)).stdout.strip() == "false"
    own = _fresh_process(code, JDQN_CACHE_DIR=str(tmp_path), **{PREALLOCATE_VAR: "true"})
    assert own.stdout.strip() == "true"
