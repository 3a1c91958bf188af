"""Compiled programs kept on disk (jdqn.accel.executables): stored once, loaded instead of traced,
the same numbers, keys that change with everything a program depends on.

The tests that load a stored program run in a fresh process, as a warm start would: XLA:CPU
shares the machine code of identical small kernels between the executables of one process, so
in a process that has compiled other programs a serialised executable can miss a kernel (the
reason jdqn stores programs only on the GPU; jdqn.run.walkforward._executable_cache). In a fresh
process the stored program is whole on every backend.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdqn.accel import executables
from jdqn.accel.executables import SUFFIX, ExecutableCache, cache_key, untrusted


def _step(state: dict, x: jax.Array, scale: jax.Array) -> tuple[dict, jax.Array]:
    new = {"w": state["w"] * scale + jnp.sin(x), "n": state["n"] + 1}
    return new, jnp.sum(new["w"] ** 2)


STEP = jax.jit(_step, donate_argnums=0)


def _args() -> tuple[dict, jax.Array, jax.Array]:
    state = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "n": jnp.int32(0)}
    return state, jnp.arange(4.0), jnp.float32(0.5)


def _in_a_fresh_process(scenario: str, tmp_path: Path) -> None:
    """Runs ``scenario(tmp_path)`` of this module in a new interpreter (same environment)."""
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "from pathlib import Path; import test_executables as t; "
        f"t.{scenario}(Path({str(tmp_path)!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_a_stored_program_is_loaded_and_gives_the_same_numbers(tmp_path):
    _in_a_fresh_process("stored_program_scenario", tmp_path)


@pytest.mark.slow
def test_a_damaged_file_is_compiled_again_and_replaced(tmp_path):
    _in_a_fresh_process("damaged_file_scenario", tmp_path)


def stored_program_scenario(tmp_path: Path) -> None:
    first = ExecutableCache(tmp_path)
    compiled = first.compile("step", STEP, *_args(), context="c")
    assert (first.hits, first.misses) == (0, 1)
    assert len(list(tmp_path.glob(f"step-*{SUFFIX}"))) == 1
    expected = compiled(*_args())

    second = ExecutableCache(tmp_path)  # as a new process would
    loaded = second.compile("step", STEP, *_args(), context="c")
    assert (second.hits, second.misses) == (1, 0)
    args = _args()
    got = loaded(*args)
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_array_equal(got[0]["w"], expected[0]["w"])
    assert int(got[0]["n"]) == 1
    assert args[0]["w"].is_deleted()  # the donation is part of the stored program
    np.testing.assert_allclose(got[1], STEP(*_args())[1], rtol=1e-6)

    # Found by the arguments' types alone, with its output types (no tracing, no compile).
    third = ExecutableCache(tmp_path)
    types = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), _args())
    stored = third.load("step", *types, context="c")
    assert stored is not None and (third.hits, third.misses) == (1, 0)
    out_state, out_loss = stored.out_info
    assert (out_state["w"].shape, out_state["w"].dtype, out_loss.shape) == ((3, 4), "float32", ())
    assert third.load("other", *types, context="c") is None


@pytest.mark.slow
def test_a_directory_or_file_others_can_write_is_not_loaded_from(tmp_path):
    _in_a_fresh_process("untrusted_scenario", tmp_path)


def untrusted_scenario(tmp_path: Path) -> None:
    """Issue 49 item 17: loading runs a file's code, so only files no one else can write."""
    ExecutableCache(tmp_path).compile("step", STEP, *_args(), context="c")
    (stored,) = tmp_path.glob(f"step-*{SUFFIX}")
    types = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), _args())
    stored.chmod(0o666)
    assert untrusted(stored) == f"{stored} is writable by others (mode 666)"
    assert ExecutableCache(tmp_path).load("step", *types, context="c") is None
    stored.chmod(0o600)
    assert ExecutableCache(tmp_path).load("step", *types, context="c") is not None
    tmp_path.chmod(0o777)
    shared = ExecutableCache(tmp_path)
    assert shared.directory is None and shared.load("step", *types, context="c") is None
    tmp_path.chmod(0o700)


def test_a_directory_of_another_user_is_refused(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(executables.os, "getuid", lambda: tmp_path.stat().st_uid + 1)
    owner = tmp_path.stat().st_uid
    assert untrusted(tmp_path) == f"{tmp_path} belongs to uid {owner}, not to this user"
    assert ExecutableCache(tmp_path).directory is None
    assert "fix: chmod go-w" in caplog.text and "not using the stored programs" in caplog.text


def test_the_key_changes_with_what_the_program_depends_on(monkeypatch):
    state, x, scale = _args()
    key = cache_key("step", "c", (state, x, scale))
    assert cache_key("step", "c", _args()) == key  # same types, other values: same program
    types = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (state, x, scale))
    assert cache_key("step", "c", types) == key  # the types alone name the same program
    assert cache_key("other", "c", (state, x, scale)) != key
    assert cache_key("step", "d", (state, x, scale)) != key
    assert cache_key("step", "c", (state, jnp.arange(5.0), scale)) != key  # shape
    assert cache_key("step", "c", (state, x, jnp.bfloat16(0.5))) != key  # dtype
    assert cache_key("step", "c", (state, x, jnp.asarray(0.5))) != key  # weakly typed
    assert cache_key("step", "c", ({"w": state["w"]}, x, scale)) != key  # tree structure
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    assert cache_key("step", "c", (state, x, scale)) != key


def test_the_key_changes_with_a_traced_librarys_version(monkeypatch):
    import optax

    from jdqn.accel import executables

    args = _args()
    key = cache_key("step", "c", args)
    monkeypatch.setattr(optax, "__version__", "0.0.0-other")
    executables._versions.cache_clear()  # versions are read once per process
    try:
        assert "optax=0.0.0-other" in executables._versions()
        assert cache_key("step", "c", args) != key
    finally:
        executables._versions.cache_clear()


def damaged_file_scenario(tmp_path: Path) -> None:
    ExecutableCache(tmp_path).compile("step", STEP, *_args(), context="c")
    (path,) = tmp_path.glob(f"step-*{SUFFIX}")
    path.write_bytes(path.read_bytes()[:100])  # a partial write
    cache = ExecutableCache(tmp_path)
    compiled = cache.compile("step", STEP, *_args(), context="c")
    assert (cache.hits, cache.misses) == (0, 1)
    np.testing.assert_allclose(compiled(*_args())[1], STEP(*_args())[1], rtol=1e-6)
    again = ExecutableCache(tmp_path)
    again.compile("step", STEP, *_args(), context="c")
    assert again.hits == 1


def test_without_a_directory_or_a_writable_one_it_only_compiles(tmp_path):
    off = ExecutableCache(None)
    np.testing.assert_allclose(
        off.compile("step", STEP, *_args(), context="c")(*_args())[1],
        STEP(*_args())[1],
        rtol=1e-6,
    )
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    unwritable = ExecutableCache(blocker / "executables")
    compiled = unwritable.compile("step", STEP, *_args(), context="c")
    np.testing.assert_allclose(compiled(*_args())[1], STEP(*_args())[1], rtol=1e-6)
    assert unwritable.misses == 1 and blocker.read_text() == "not a directory"
