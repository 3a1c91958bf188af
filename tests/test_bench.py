"""jdqn bench: sections produce well-formed rows on tiny sizes; the torch peer matches jdqn.

Timings are never asserted (they depend on the machine); only the shape and sanity of the rows.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cuda_lowering import TRITON_DEPRECATION, lower_for_h200

from jdqn.bench import (
    breakdown,
    fused_mlp,
    loads,
    suite,
    timeline,
    torch_peer,
    walkforward_run,
)
from jdqn.config import SMOKETEST, apply_overrides
from jdqn.donors import n_donors_for
from jdqn.replay import replay_sample

TINY = apply_overrides(
    SMOKETEST,
    ["network.hidden=[16]", "network.n_atoms=11", "replay.capacity=64", "train.batch_size=16"],
)


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
    assert modes == ["per call (Python loop)", "in lax.scan", "in lax.scan, 4 steps per loop trip"]
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
    assert [g["goal"] for g in out["goals"]][:2] == [
        "in-scan learner step us",
        "seed-steps/s at S=16",
    ]
    assert out["goals"][0]["measured"] == out["sections"]["learner_step"]["rows"][1]["us_per_step"]


def test_a_failing_section_is_recorded_and_the_others_still_run(monkeypatch) -> None:
    def broken(quick, cfg):
        raise RuntimeError("boom")

    monkeypatch.setitem(suite.SECTIONS, "seeds", broken)
    monkeypatch.setitem(suite.SECTIONS, "replay", lambda q, c: {"rows": [{"x": 1.0}]})
    out = suite.run_all(["seeds", "replay"], None, quick=True, echo=lambda _: None)
    assert out["sections"]["seeds"]["error"] == "RuntimeError: boom"
    assert out["sections"]["replay"]["rows"] == [{"x": 1.0}]
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
    counted = [r for r in rows[1:] if not r["component"].startswith("projection")]
    assert sum(r["us_per_step"] for r in counted) == pytest.approx(full, rel=1e-9)


def _jax_batch_inputs(learner_state, cfg):
    """The learner step's own draws (same key splits as jdqn.learner.step)."""
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
    cfg = SMOKETEST
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


def test_torch_peer_reports_unavailable_without_torch() -> None:
    if torch_peer.available():
        pytest.skip("torch is importable here")
    assert torch_peer.run(quick=True) == []
    assert "not importable" in suite.SECTIONS["torch_peer"](True, TINY)["skipped"]


def test_projection_sizes_flag_parses_cases_and_rejects_bad_ones(capsys) -> None:
    from jdqn.bench import projection

    assert projection.parse_sizes("262144x101,64x51") == ((262144, 101), (64, 51))
    for bad in ("262144", "64x51,abc", "0x51", "64x1", ""):
        with pytest.raises(SystemExit) as exit_info:
            projection.main(["--sizes", bad])
        assert exit_info.value.code == 2
        assert "want BxN cases" in capsys.readouterr().err


def test_projection_tune_sizes_flag_rejects_bad_cases(capsys) -> None:
    """--tune-sizes goes through the same parser: a bad case stops before any benchmark runs."""
    from jdqn.bench import projection

    with pytest.raises(SystemExit) as exit_info:
        projection.main(["--tune", "--tune-sizes", "64x1"])
    assert exit_info.value.code == 2
    assert "want BxN cases" in capsys.readouterr().err


def test_kernels_section_turns_the_profile_into_rows_and_a_table(monkeypatch) -> None:
    from jdqn.bench import kernels

    profile = {
        "device": "cpu (cpu)",
        "jax": jax.__version__,
        "n_seeds": 1,
        "n_steps": 5,
        "repeats": 3,
        "wall_us_per_step": 10.0,
        "traced_wall_us_per_step": 11.0,
        "busy_us_per_step": 8.0,
        "kernels_per_step": 3.0,
        "command_buffers": False,
        "scopes": {
            "backward": {"kernels_per_step": 2.0, "us_per_step": 6.0},
            "adam": {"kernels_per_step": 1.0, "us_per_step": 2.0},
        },
        "kernels": [
            {
                "kernel": "gemm_fusion_dot.1",
                "scope": "backward",
                "launches_per_step": 2.0,
                "us_per_step": 6.0,
                "op_name": "x/transpose(jvp(online_forward))/dot_general",
            },
            {
                "kernel": "loop_multiply_fusion",
                "scope": "adam",
                "launches_per_step": 1.0,
                "us_per_step": 2.0,
                "op_name": "x/adam/mul",
            },
        ],
    }
    calls = []
    monkeypatch.setattr(
        kernels, "run_without_command_buffers", lambda **kw: calls.append(kw) or profile
    )
    out = suite.run_all(["kernels"], None, quick=True, echo=lambda _: None, keep_going=False)
    section = out["sections"]["kernels"]
    assert calls == [{"n_steps": 5}]
    assert [r["scope"] for r in section["rows"]] == ["backward", "adam"]
    assert section["rows"][0]["us_per_step"] == 6.0
    assert "gemm_fusion_dot.1" in section["table"] and "kernels/step" in section["table"]


def test_projection_benchmark_reports_kernel_time_per_call() -> None:
    """The projection section on this backend: a kernel time from the profiler for every
    implementation, next to the loop and call times, and the agreement with the scatter."""
    from jdqn.bench import projection

    rows = projection.run(sizes=((16, 51),), repeats=2, impls=("reference", "xla_scatter"))
    assert [row["impl"] for row in rows] == ["reference", "xla_scatter"]
    for row in rows:
        assert row["median_us"] > 0 and row["loop_us"] > 0 and row["call_us"] > 0
        assert row["max_abs_diff_vs_xla_scatter"] < 2e-5
    assert "kernel us" in projection.format_table(rows)


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
    goals = suite._goals({"walkforward": {"rows": [row, {**row, "run": "warm"}]}})
    assert {
        "goal": "training-program compile s (cold)",
        "measured": 8.5,
        "limit": 10.0,
        "met": True,
    } in goals


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

    def spawn(cache_dir, out_dir, overrides, cache_min_compile_s):
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


def test_projection_goals_judge_the_80_us_target_and_the_fastest_implementation() -> None:
    from jdqn.bench import projection

    def row(batch: int, impl: str, us: float) -> dict:
        return {"batch": batch, "n_atoms": 51, "impl": impl, "median_us": us}

    rows = [
        row(262144, "pallas", 58.9),
        row(262144, "xla_hat", 1424.8),
        row(262144, "xla_scatter", 212.7),
        row(4096, "pallas", 7.0),  # slower than the scatter here
        row(4096, "xla_hat", 23.1),
        row(4096, "xla_scatter", 6.4),
        row(64, "pallas", 9.0),  # below 4,096: not judged
        row(64, "xla_hat", 1.5),
        row(64, "xla_scatter", 3.1),
    ]
    lines = projection.goals(rows)
    assert lines[0] == "- pallas at 262144 x 51: 58.9 us (goal <= 80): met"
    assert (
        lines[1] == "- pallas fastest of 3 at each of 2 cases with B >= 4096: NOT met at 4096 x 51"
    )
    rows[0] = row(262144, "pallas", 80.5)
    rows[3] = row(4096, "pallas", 2.4)
    assert projection.goals(rows) == [
        "- pallas at 262144 x 51: 80.5 us (goal <= 80): NOT met",
        "- pallas fastest of 3 at each of 2 cases with B >= 4096: met",
    ]
    # On a CPU run (no pallas rows) nothing can be judged.
    assert projection.goals([r for r in rows if r["impl"] != "pallas"]) == []


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the CPU fallback of the CLI")
def test_projection_cli_without_a_gpu_times_xla_only_and_refuses_tune(capsys) -> None:
    from jdqn.bench import projection

    projection.main(["--sizes", "64x51", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "no GPU: timing the XLA implementations only" in out
    assert "| 64 | 51 | xla_scatter |" in out and "| pallas |" not in out
    with pytest.raises(SystemExit) as exit_info:
        projection.main(["--tune"])
    assert exit_info.value.code == 2
    assert (
        "--tune times the Pallas kernel's launch knobs; it needs a GPU" in capsys.readouterr().err
    )


def test_seeds_cli_times_the_s_it_is_given_and_refuses_zero(monkeypatch, capsys) -> None:
    from jdqn.bench import seeds

    assert seeds.seed_counts(False, [3, 5]) == (3, 5)
    assert seeds.seed_counts(True, None) == seeds.QUICK_SEEDS
    assert seeds.seed_counts(False, None) == seeds.SEEDS
    with pytest.raises(SystemExit) as exit_info:
        seeds.main(["--seeds", "0", "4"])
    assert exit_info.value.code == 2
    assert "--seeds: every S must be at least 1, got [0, 4]" in capsys.readouterr().err


def test_seeds_cli_times_the_config_it_is_given(monkeypatch, capsys) -> None:
    """``--set`` overrides reach the timed config; a bad one is one line, before any compile."""
    from jdqn.bench import seeds

    timed = []
    monkeypatch.setattr(seeds, "run", lambda quick, cfg, seeds, unroll: timed.append(cfg) or [])
    seeds.main(["--quick", "--set", "loss.causal_weight=0", "--set", "optim.tau=0.01"])
    [cfg] = timed
    assert (cfg.loss.causal_weight, cfg.optim.tau) == (0.0, 0.01)
    with pytest.raises(SystemExit) as exit_info:
        seeds.main(["--set", "loss.no_such_field=1"])
    assert exit_info.value.code == 2 and timed == [cfg]
    assert "loss.no_such_field" in capsys.readouterr().err


@pytest.mark.slow
def test_update_impl_comparison_times_each_impl_twice() -> None:
    from jdqn.bench import seeds

    rows = seeds.compare_update_impls(quick=True, cfg=TINY, impls=("xla", "interpret"), seeds=(2,))
    assert [r["seeds"] for r in rows] == [2]
    times = rows[0]["us"]
    assert all(len(times[impl]) == 2 and min(times[impl]) > 0 for impl in ("xla", "interpret"))
    assert rows[0]["ratio"] == pytest.approx(np.mean(times["interpret"]) / np.mean(times["xla"]))
    table = seeds.format_comparison(rows)
    assert "| seeds S | xla us per vmapped step | interpret us per vmapped step |" in table


def test_an_unrolled_scan_takes_the_same_steps() -> None:
    """``unroll`` only regroups the loop: 5 steps at 2 per iteration (one left over) end in the
    state 5 steps at 1 per iteration do."""
    learner, state = breakdown.filled_learner(TINY)
    copy = jax.tree.map(jnp.copy, state)
    looped, metrics = breakdown.scan_steps_fn(learner, 5)(state)
    unrolled, unrolled_metrics = breakdown.scan_steps_fn(learner, 5, unroll=2)(copy)
    assert int(unrolled.step) == int(looped.step) == 5
    for a, b in zip(jax.tree.leaves(looped), jax.tree.leaves(unrolled), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(metrics), np.asarray(unrolled_metrics), rtol=1e-5)


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        ("seeds", ["--compare-unroll", "1", "0"], "steps per loop iteration must be at least 1"),
        ("seeds", ["--unroll", "0"], "steps per loop iteration must be at least 1"),
        ("learner_step", ["--unroll", "0"], "steps per loop trip must be at least 1, got 0"),
    ],
)
def test_bench_clis_refuse_an_unroll_below_one(module, argv, message, capsys) -> None:
    import importlib

    main = importlib.import_module(f"jdqn.bench.{module}").main
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_unroll_comparison_times_each_unroll_twice() -> None:
    from jdqn.bench import seeds

    rows = seeds.compare_unrolls((1, 2), quick=True, cfg=TINY, seeds=(2,))
    times = rows[0]["us"]
    expected_ratio = np.mean(times["unroll 2"]) / np.mean(times["unroll 1"])
    assert rows[0]["impls"] == ("unroll 1", "unroll 2")
    assert all(len(t) == 2 and min(t) > 0 for t in times.values())
    assert rows[0]["ratio"] == pytest.approx(expected_ratio)
    assert all(len(t) == 2 and min(t) > 0 for t in rows[0]["compile_s"].values())
    assert "compile s at S = 2: unroll 1" in seeds.format_comparison(rows)


def test_timeline_marks_a_run_in_order() -> None:
    """One worker process of the timeline bench: its marks come in the order the run takes
    them, all before the parent saw the process end."""
    (row,) = timeline.run(processes=1, quick=True)
    found = timeline.marks(row["events"])
    assert list(found) == list(timeline.MARKS), found
    seconds = [found[m] for m in timeline.MARKS]
    assert seconds == sorted(seconds) and 0 < seconds[-1] < row["wall_s"]
    labels = {text.split("] ", 1)[1] for _, text in row["events"]}
    assert {"< load_data", "< baselines", "< chunk metrics", "< results"} <= labels
    assert "| process | wall s |" in timeline.format_table([row])


def test_timeline_cli_refuses_fewer_than_one_process(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        timeline.main(["--processes", "0"])
    assert exit_info.value.code == 2
    assert "--processes 0: need at least 1" in capsys.readouterr().err


def test_loads_times_a_start_up_in_every_mode(monkeypatch, tmp_path) -> None:
    """Fresh start-ups on a given cache (no programs stored: on CPU none are): every mode, each
    step's end in the order the worker takes them."""
    monkeypatch.setenv("JDQN_CACHE_DIR", str(tmp_path))
    rows = loads.run(processes=3)
    assert [row["mode"] for row in rows] == ["serial", "thread", "backend"]
    for row in rows:
        at = {label: seconds for seconds, label in row["events"]}
        assert set(at) == {"import jax", "backend", "imports", "done"}
        assert 0 < at["import jax"] <= at["backend"] and at["imports"] <= at["done"]
        if row["mode"] == "serial":
            assert at["backend"] <= at["imports"]
    assert loads.format_table(rows).count("none stored") == 3


def test_loads_names_a_stored_program_that_cannot_be_loaded(monkeypatch, tmp_path) -> None:
    (tmp_path / "executables").mkdir()
    (tmp_path / "executables" / "run_chunk-0123.jaxexe").write_bytes(b"not a program")
    monkeypatch.setenv("JDQN_CACHE_DIR", str(tmp_path))
    for mode in loads.MODES:  # on the main thread or on the worker's thread
        with pytest.raises(RuntimeError, match="run_chunk-0123.jaxexe: stored program could not"):
            loads.spawn(mode, dict(os.environ))


def test_loads_table_gives_each_load_its_own_seconds() -> None:
    events = [
        (0.9, "import jax"),
        (1.4, "backend"),
        (2.0, "load baselines_run"),
        (2.1, "load init_run"),
        (2.8, "imports"),
        (2.8, "done"),
    ]
    table = loads.format_table([{"mode": "serial", "events": events}])
    assert "| serial | 0.90 | 1.40 | baselines_run 0.600, init_run 0.100 | 2.80 | 2.80 |" in table


def test_loads_cli_refuses_fewer_than_one_process(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        loads.main(["--processes", "0"])
    assert exit_info.value.code == 2
    assert "--processes 0: need at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("out_block", [256, 64, 16])
def test_fused_mlp_program_matches_xla(out_block) -> None:
    """The one-program forward and backward against XLA's vjp, whole head or in blocks:
    interpret mode here, the real kernel as well on a GPU (TF32 dots there)."""
    assert fused_mlp.compare(3, interpret=True, out_block=out_block) < 1e-4
    if jax.default_backend() == "gpu":
        assert fused_mlp.compare(3, interpret=False, out_block=out_block) < 2e-2


def test_fused_mlp_loops_give_the_same_weights() -> None:
    """Three passes in the timed loop (each feeding its gradients and output back into the
    weights): the fused program in interpret mode against XLA's, on the real (unpadded) part."""
    params, x, dy = fused_mlp.random_inputs(2)
    want = fused_mlp.looped(fused_mlp._xla_pass, 3)(params, x, dy)
    fused = functools.partial(fused_mlp.fused_forward_backward, interpret=True)
    got = fused_mlp.looped(fused, 3)(*fused_mlp.pad(params, x, dy))
    real = (*got[:4], got[4][..., : fused_mlp.OUTPUTS], got[5][..., : fused_mlp.OUTPUTS])
    for g, w, start in zip(real, want, params, strict=True):
        assert not np.allclose(np.asarray(w), start)  # the loop moved every weight
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7)


@pytest.mark.filterwarnings(TRITON_DEPRECATION)
@pytest.mark.parametrize("out_block", [256, 64])
def test_fused_mlp_program_lowers_for_the_h200_as_one_kernel(out_block) -> None:
    learners = 4
    shapes = [
        (learners, fused_mlp.INPUTS, fused_mlp.HIDDEN),
        (learners, fused_mlp.HIDDEN),
        (learners, fused_mlp.HIDDEN, fused_mlp.HIDDEN),
        (learners, fused_mlp.HIDDEN),
        (learners, fused_mlp.HIDDEN, fused_mlp.OUTPUTS_TILE),
        (learners, fused_mlp.OUTPUTS_TILE),
        (learners, fused_mlp.ROWS_TILE, fused_mlp.INPUTS),
        (learners, fused_mlp.ROWS_TILE, fused_mlp.OUTPUTS_TILE),
    ]

    def run(w1, b1, w2, b2, w3, b3, x, dy):
        params = (w1, b1, w2, b2, w3, b3)
        return fused_mlp.fused_forward_backward(params, x, dy, out_block=out_block)

    assert lower_for_h200(run, *shapes).count("__gpu$xla.gpu.triton") == 1


def test_fused_mlp_refuses_an_output_block_that_does_not_divide_the_head(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        fused_mlp.main(["--out-blocks", "48"])
    assert exit_info.value.code == 2
    assert "--out-blocks [48]: use powers of two" in capsys.readouterr().err
    with pytest.raises(ValueError, match="out_block 8"):
        fused_mlp.compare(1, interpret=True, out_block=8)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--learners", "0"], "each must be at least 1"),
        (["--steps", "0"], "each must be at least 1"),
        (["--repeats", "0"], "each must be at least 1"),
        (["--warps", "3"], "--warps [3]: Triton takes powers of two"),
    ],
)
def test_fused_mlp_cli_refuses_impossible_counts(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        fused_mlp.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_fused_mlp_cli_refuses_a_cpu(capsys) -> None:
    if jax.default_backend() == "gpu":
        pytest.skip("the CLI runs on a GPU")
    with pytest.raises(SystemExit) as exit_info:
        fused_mlp.main(["--learners", "1"])
    assert exit_info.value.code == 2
    assert "run this on a GPU" in capsys.readouterr().err
