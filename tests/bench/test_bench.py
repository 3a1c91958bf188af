"""jdqn bench: sections produce well-formed rows on tiny sizes; the torch peer matches jdqn.

Timings are never asserted (they depend on the machine); only the shape and sanity of the rows.
"""

from __future__ import annotations

import json
import math
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import breakdown, torch_peer
from jdqn import bench
from jdqn.agent.donors import n_donors_for
from jdqn.agent.replay import replay_sample
from jdqn.bench import suite, walkforward_run
from jdqn.cli import EXIT_USER_ERROR, main
from jdqn.config import SMOKETEST, apply_overrides

TINY = apply_overrides(
    SMOKETEST,
    ["network.hidden=[16]", "network.n_atoms=11", "replay.capacity=64", "train.batch_size=16"],
)


def test_a_json_file_that_cannot_be_written_is_refused_before_measuring(
    tmp_path, capsys, monkeypatch
) -> None:
    """A benchmark's result would be lost after minutes of measuring: its ``--json`` path is
    checked first (one line, exit 2); a directory not there yet is made when it is written."""
    monkeypatch.setattr(suite, "run_all", lambda *_, **__: pytest.fail("nothing may run"))
    assert main(["bench", "--json", str(tmp_path)]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "a directory; fix: name a file" in err and err.count("\n") == 1
    assert "not a directory you can write in" in str(bench.json_problem("/dev/null/bench.json"))
    target = tmp_path / "not" / "yet" / "bench.json"
    assert bench.json_problem(target) is None
    bench.write_json(target, {"step_us": 101.5})
    assert json.loads(target.read_text()) == {"step_us": 101.5}
    assert bench.json_problem(target) is None  # an earlier result: written over


def test_unknown_section_raises_with_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid sections: .*learner_step.*seeds"):
        suite.run_all(["learner_step", "no_such_section"], None, quick=True)


@pytest.mark.slow
def test_quick_step_sections_write_well_formed_json(tmp_path) -> None:
    path = tmp_path / "bench.json"
    out = suite.run_all(
        ["learner_step", "seeds"],
        str(path),
        quick=True,
        cfg=TINY,
        echo=lambda _: None,
        keep_going=False,
    )
    written = json.loads(path.read_text())
    assert set(written["sections"]) == {"learner_step", "seeds"}
    assert written["meta"]["jax_version"] == jax.__version__
    modes = [r["mode"] for r in out["sections"]["learner_step"]["rows"]]
    assert modes == ["per call (Python loop)", "in lax.scan"]
    assert not out["sections"]["learner_step"]["detail"]["halted"]
    for row in out["sections"]["learner_step"]["rows"]:
        assert math.isfinite(row["us_per_step"]) and row["us_per_step"] > 0
    seeds = out["sections"]["seeds"]["rows"]
    assert [r["seeds"] for r in seeds] == [1, 16]
    # On CPU every S uses the XLA tail (the kernels are for a GPU's many learners).
    assert [r["update_impl"] for r in seeds] == ["xla", "xla"]
    for r in seeds:  # seed-steps/s is S / (seconds per vmapped step), by definition
        assert r["seed_steps_per_s"] == pytest.approx(
            r["seeds"] / (1e-6 * r["us_per_vmapped_step"])
        )


def test_a_failing_section_is_recorded_and_the_others_still_run(monkeypatch) -> None:
    def broken(quick, cfg):
        raise RuntimeError("boom")

    monkeypatch.setitem(suite.SECTIONS, "seeds", broken)
    monkeypatch.setitem(suite.SECTIONS, "extra", lambda q, c: {"rows": [{"x": 1.0}]})
    out = suite.run_all(["seeds", "extra"], None, quick=True, echo=lambda _: None)
    assert out["sections"]["seeds"]["error"] == "RuntimeError: boom"
    assert out["sections"]["extra"]["rows"] == [{"x": 1.0}]
    with pytest.raises(RuntimeError, match="boom"):
        suite.run_all(["seeds"], None, quick=True, echo=lambda _: None, keep_going=False)


@pytest.mark.slow
def test_breakdown_rows_cover_every_component_and_sum_to_the_full_step() -> None:
    rows = breakdown.run(quick=True, cfg=TINY)
    names = [r["component"] for r in rows]
    assert names[0] == "full step" and names[-1].startswith("remainder")
    for expected in ("spectral norm", "HER donors", "causal", "gradient surgery", "Adam"):
        assert any(n.startswith(expected) for n in names), expected
    full = rows[0]["us_per_step"]
    counted = [r for r in rows[1:] if not r["component"].startswith("GPU kernels")]
    assert sum(r["us_per_step"] for r in counted) == pytest.approx(full, rel=1e-9)


def _jax_batch_inputs(learner_state, cfg):
    """The learner step's own draws (same key splits as jdqn.agent.step)."""
    _, sample_key, donor_key, causal_key, _ = jax.random.split(learner_state.key, 5)
    batch = cfg.train.batch_size
    indices, _, weights = replay_sample(
        learner_state.replay, sample_key, batch, cfg.replay.alpha, jnp.float32(breakdown.BETA)
    )
    n_donors = n_donors_for(batch, cfg.loss.donor_fraction, cfg.loss.donor_mode, cfg.env.n_actions)
    donor_rows = jax.random.permutation(donor_key, batch)[:n_donors]
    permutation = jax.random.permutation(causal_key, batch)
    return [np.asarray(x) for x in (indices, weights, donor_rows, permutation)]


def test_torch_peer_computes_the_same_losses_and_gradients_as_the_jax_step() -> None:
    torch = pytest.importorskip(
        "torch",
        reason="torch is not a jdqn dependency; the peer "
        "is checked where it is installed (the GPU machine)",
    )
    cfg = suite.BENCH_CONFIG  # the step the peer implements (the seed's "best" donors)
    learner, state = breakdown.filled_learner(cfg)
    _, metrics = jax.jit(learner.step)(
        state, jnp.float32(breakdown.ALPHA), jnp.float32(breakdown.BETA)
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    peer = torch_peer.peer_from_state(cfg, breakdown.NON_CAUSAL, state, device)
    indices, weights, donor_rows, permutation = (
        torch.as_tensor(x).to(device) for x in _jax_batch_inputs(state, cfg)
    )
    batch = peer.batch_from(indices.long(), weights, donor_rows.long(), permutation.long())
    g_mse, g_c51, _, parts, _ = peer.part_gradients(batch)
    parts = parts.detach().cpu().numpy()
    np.testing.assert_allclose(parts[0], metrics.loss_mse, rtol=2e-4)
    np.testing.assert_allclose(parts[1], metrics.loss_c51, rtol=2e-4)
    np.testing.assert_allclose(parts[2], metrics.loss_causal, rtol=2e-3, atol=1e-7)
    np.testing.assert_allclose(
        float(torch.linalg.vector_norm(g_mse)), metrics.grad_norm_mse, rtol=1e-3
    )
    np.testing.assert_allclose(
        float(torch.linalg.vector_norm(g_c51)), metrics.grad_norm_c51, rtol=1e-3
    )
    # A whole peer step runs, stays finite and writes priorities only at sampled slots.
    before = peer.replay["priorities"].clone()
    assert bool(torch.isfinite(peer.step()).all())
    changed = torch.nonzero(peer.replay["priorities"] != before).flatten().cpu().numpy()
    assert changed.size > 0 and changed.max() < cfg.replay.capacity


def test_torch_peer_refuses_n_step_returns() -> None:
    cfg = apply_overrides(SMOKETEST, ["loss.n_step=3"])
    with pytest.raises(ValueError, match=r"loss\.n_step must be 1"):
        torch_peer.TorchPeer(cfg, (), {}, {}, {}, {})


def test_torch_peer_reports_unavailable_without_torch() -> None:
    if torch_peer.available():
        pytest.skip("torch is importable here")
    assert torch_peer.run(quick=True) == []


def test_compile_times_attribute_trace_lower_and_compile_to_the_training_program() -> None:
    # Real events from JAX: a fresh jitted function named like the training program.
    times = walkforward_run.CompileTimes()
    jax.monitoring.register_event_duration_secs_listener(times)
    try:

        def run_chunk(x: jax.Array) -> jax.Array:
            return jnp.sin(x) * 3.0 + 1.0

        jax.jit(run_chunk)(jnp.arange(7.0)).block_until_ready()
    finally:
        jax.monitoring.unregister_event_duration_listener(times)
    assert walkforward_run.TRAINING_PROGRAM == "run_chunk"
    training = times.per_program["run_chunk"]
    # Its trace, lowering and compile are counted under one name, within all compile events.
    stages = sum(times.durations[e] for e in walkforward_run.COMPILE_EVENTS)
    assert 0.0 < training <= stages
    assert next(iter(times.top_programs(1))) in times.per_program
    assert walkforward_run.program_name("jit(run_chunk)") == "run_chunk"
    assert walkforward_run.program_name("run_chunk") == "run_chunk"


def test_walkforward_table_shows_the_training_program_compile() -> None:
    row = {
        "run": "cold",
        "process_wall_s": 20.0,
        "walkforward_s": 17.0,
        "compile_s": 12.0,
        "compiling_s": 9.0,
        "training_compile_s": 8.5,
        "run_s": 8.0,
        "import_s": 3.0,
        "backend_compiles": 28,
        "overrides": [],
    }
    table = walkforward_run.format_table([row])
    assert "training-program compile s" in table
    assert "| cold | 20.0 | 17.0 | 12.0 | 9.0 | 8.5 | 8.0 | 3.0 | 28 |" in table


def test_compiling_time_is_the_union_of_the_compile_intervals() -> None:
    # Hand-computed, window [0, 10]: [-3, -1] lies before it; [-1, 0.5] is cut at its start
    # (0.5); [1, 4] and [2, 5] overlap (compiles on two threads) -> [1, 5] (4); [7, 8] apart (1);
    # [9, 12] is cut at its end (1).
    intervals = [(2.0, 5.0), (1.0, 4.0), (7.0, 8.0), (9.0, 12.0), (-1.0, 0.5), (-3.0, -1.0)]
    assert walkforward_run.covered_s(intervals, 0.0, 10.0) == pytest.approx(0.5 + 4 + 1 + 1)
    assert walkforward_run.covered_s([(1.0, 3.0), (1.5, 2.0)], 0.0, 10.0) == pytest.approx(2.0)
    assert walkforward_run.covered_s([], 0.0, 10.0) == 0.0


def test_main_command_bench_passes_an_override_given_twice_once(monkeypatch) -> None:
    calls = []

    def spawn(cache_dir, out_dir, overrides):
        calls.append(list(overrides))
        return {}

    monkeypatch.setattr(walkforward_run, "_spawn", spawn)
    monkeypatch.setattr(walkforward_run, "missing_outputs", lambda: ["tensorboardX"])
    given = ["output.tensorboard=false", "train.epochs=1"]
    rows = walkforward_run.run(overrides=given)
    assert calls == [given, given]
    assert [r["overrides"] for r in rows] == [given, given]


def test_compile_intervals_lie_within_the_compile() -> None:
    times = walkforward_run.CompileTimes()
    start = time.perf_counter()
    jax.monitoring.register_event_duration_secs_listener(times)
    try:

        def fresh_program(x: jax.Array) -> jax.Array:
            return jnp.cos(x) * 2.0 - 1.0

        jax.jit(fresh_program)(jnp.arange(5.0)).block_until_ready()
    finally:
        jax.monitoring.unregister_event_duration_listener(times)
    end = time.perf_counter()
    assert times.intervals
    # JAX times an event on its own clock: a millisecond of slack for the two clocks' reads.
    assert all(start - 1e-3 <= lo <= hi <= end for lo, hi in times.intervals)
    covered = walkforward_run.covered_s(times.intervals, start, end)
    assert 0.0 < covered <= min(end - start, sum(hi - lo for lo, hi in times.intervals)) + 1e-9


def test_seeds_cli_times_the_s_it_is_given_and_refuses_zero(monkeypatch, capsys) -> None:
    from jdqn.bench import seeds

    assert seeds.seed_counts(False, [3, 5]) == (3, 5)
    assert seeds.seed_counts(True, None) == seeds.QUICK_SEEDS
    assert seeds.seed_counts(False, None) == seeds.SEEDS
    with pytest.raises(SystemExit) as exit_info:
        seeds.main(["--seeds", "0", "4"])
    assert exit_info.value.code == 2
    assert "--seeds: every S must be at least 1, got [0, 4]" in capsys.readouterr().err


@pytest.mark.slow
def test_seeds_settings_give_the_learners_learning_rates_of_one_program(capsys) -> None:
    """``--settings N``: learner i steps with the (i mod N)-th of N learning rates log-spaced
    over 0.1x to 10x the config's, in one vmapped program; N < 1 is one line, exit 2."""
    from jdqn.bench import seeds
    from jdqn.bench.fixture import scan_steps_fn

    cfg = TINY
    learner, states = seeds.seeded_states(cfg, 4, settings=2)
    rates = np.float32(cfg.optim.learning_rate * np.array([0.1, 10.0, 0.1, 10.0]))
    np.testing.assert_allclose(np.asarray(states.hyper.learning_rate), rates, rtol=1e-6)
    after, _ = scan_steps_fn(learner, 2, vmapped=True)(states)
    np.testing.assert_array_equal(np.asarray(after.hyper.learning_rate), rates)
    with pytest.raises(SystemExit) as exit_info:
        seeds.main(["--settings", "0"])
    assert exit_info.value.code == 2
    assert "--settings 0: must be at least 1" in capsys.readouterr().err


def test_seeds_cli_times_the_config_it_is_given(monkeypatch, capsys) -> None:
    """``--set`` overrides reach the timed config; a bad one is one line, before any compile."""
    from jdqn.bench import seeds

    timed = []
    monkeypatch.setattr(seeds, "run", lambda quick, cfg, **_: timed.append(cfg) or [])
    seeds.main(["--quick", "--set", "loss.causal_weight=0", "--set", "optim.tau=0.01"])
    [cfg] = timed
    assert (cfg.loss.causal_weight, cfg.optim.tau) == (0.0, 0.01)
    with pytest.raises(SystemExit) as exit_info:
        seeds.main(["--set", "loss.no_such_field=1"])
    assert exit_info.value.code == 2 and timed == [cfg]
    assert "loss.no_such_field" in capsys.readouterr().err


def test_the_peer_table_divides_the_peer_by_jdqn_measured_in_the_same_run() -> None:
    jdqn_rows = [
        {"mode": "per call (Python loop)", "us_per_step": 400.0},
        {"mode": "in lax.scan", "us_per_step": 100.0},
    ]
    peer_rows = [{"impl": "torch eager", "device": "cuda", "us_per_step": 1200.0}]
    last = torch_peer.ratio_table(jdqn_rows, peer_rows).splitlines()[-1]
    assert [cell.strip() for cell in last.strip("|").split("|")] == [
        "torch eager (cuda)",
        "1200.0",
        "3.0x",
        "12.0x",
    ]


def _writes(name: str, status: int = 0) -> list[str]:
    """A command that leaves a file named ``name`` in the working directory and exits ``status``."""
    code = f"import pathlib, sys; pathlib.Path({name!r}).write_text('x'); print({name!r})"
    return [sys.executable, "-c", f"{code}; sys.exit({status})"]


def test_processes_run_at_once_keep_going_and_name_the_first_failure(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    commands = {"a": _writes("a"), "b": _writes("b", 3), "c": _writes("c", 4), "d": _writes("d")}
    assert bench.run_processes(commands, 2, tmp_path) == ("b", 3)
    assert all((tmp_path / case).is_file() for case in commands)  # every case ran
    assert (tmp_path / "d.log").read_text() == "d\n"  # each one's output in its own log
    for case in commands:
        (tmp_path / case).unlink()
    assert bench.run_processes(commands, 1, tmp_path) == ("b", 3)  # one at a time: stops there
    assert [c for c in commands if (tmp_path / c).is_file()] == ["a", "b"]
    assert bench.run_processes({"a": _writes("a")}, 3, tmp_path) is None
