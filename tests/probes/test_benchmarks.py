"""benchmarks/ (research probes of the GPU kernels): their command lines and tiny runs.

Timings are never asserted; only the rows' shape and the kernels' agreement with references.
"""

from __future__ import annotations

import jax
import pytest


def test_projection_sizes_flag_parses_cases_and_rejects_bad_ones(capsys) -> None:
    from benchmarks import projection

    assert projection.parse_sizes("262144x101,64x51") == ((262144, 101), (64, 51))
    for bad in ("262144", "64x51,abc", "0x51", "64x1", ""):
        with pytest.raises(SystemExit) as exit_info:
            projection.main(["--sizes", bad])
        assert exit_info.value.code == 2
        assert "want BxN cases" in capsys.readouterr().err


def test_projection_tune_sizes_flag_rejects_bad_cases(capsys) -> None:
    """--tune-sizes goes through the same parser: a bad case stops before any benchmark runs."""
    from benchmarks import projection

    with pytest.raises(SystemExit) as exit_info:
        projection.main(["--tune", "--tune-sizes", "64x1"])
    assert exit_info.value.code == 2
    assert "want BxN cases" in capsys.readouterr().err


@pytest.mark.slow
def test_projection_benchmark_reports_kernel_time_per_call() -> None:
    """The projection section on this backend: a kernel time from the profiler for every
    implementation, next to the loop and call times, and the agreement with the scatter."""
    from benchmarks import projection

    rows = projection.run(sizes=((16, 51),), repeats=2, impls=("reference", "xla_scatter"))
    assert [row["impl"] for row in rows] == ["reference", "xla_scatter"]
    for row in rows:
        assert row["median_us"] > 0 and row["loop_us"] > 0 and row["call_us"] > 0
        assert row["max_abs_diff_vs_xla_scatter"] < 2e-5
    assert "kernel us" in projection.format_table(rows)


def test_projection_goals_judge_the_80_us_target_and_the_fastest_implementation() -> None:
    from benchmarks import projection

    def row(batch: int, impl: str, us: float) -> dict:
        return {"batch": batch, "n_atoms": 51, "impl": impl, "median_us": us}

    rows = [
        row(262144, "pallas", 58.9),
        row(262144, "reference", 1424.8),
        row(262144, "xla_scatter", 212.7),
        row(4096, "pallas", 7.0),  # slower than the scatter here
        row(4096, "reference", 23.1),
        row(4096, "xla_scatter", 6.4),
        row(64, "pallas", 9.0),  # below 4,096: not judged
        row(64, "reference", 1.5),
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


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the CPU fallback of the CLI")
def test_projection_cli_without_a_gpu_times_xla_only_and_refuses_tune(capsys) -> None:
    from benchmarks import projection

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


def test_ab_cli_refuses_a_bad_override_and_zero_seeds_before_any_compile(capsys) -> None:
    from benchmarks import ab

    for argv, message in (
        (["--b", "loss.no_such_field=1"], "loss.no_such_field"),
        (["--seeds", "0"], "every S must be at least 1"),
        (["--b", "accel.pieces=dense=fast"], "accel.pieces: 'dense=fast' is not one of"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            ab.main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_ab_times_each_side_with_its_own_config(monkeypatch) -> None:
    """Each side's config (``--b accel.pieces=...`` among it) is the one its learner is built,
    traced and timed with (``time_seeds`` does all three), in the order A B B A."""
    from benchmarks import ab
    from jdqn.config import SMOKETEST, apply_overrides

    seen = []

    def timed(cfg, n_seeds, quick):
        seen.append(cfg.accel.pieces)
        return {"median_s": 2e-6 if "autodiff" in cfg.accel.pieces else 1e-6, "compile_s": 0}, 1

    monkeypatch.setattr(ab, "time_seeds", timed)
    a = apply_overrides(SMOKETEST, ["accel.pieces=barriers=off"])
    b = apply_overrides(SMOKETEST, ["accel.pieces=dense=autodiff"])
    rows = ab.compare(a, b, True, (1,))
    assert seen == ["barriers=off", "dense=autodiff", "dense=autodiff", "barriers=off"]
    assert rows[0]["b_over_a"] == 2.0


def test_sweep_throughput_times_the_sweep_then_walkforwards_of_its_settings(
    monkeypatch, tmp_path
) -> None:
    """The sweep of the grid first, then walk-forwards of its settings in the sweep's order (from
    the first again where the grid has fewer); the first walk-forward, which compiles, is left
    out of the warm mean."""
    from benchmarks import sweep_throughput

    commands, seconds = [], iter([100.0, 30.0, 10.0, 20.0])

    def timed(command, log, cache):
        commands.append(command)
        return next(seconds)

    monkeypatch.setattr(sweep_throughput, "timed", timed)
    grid = ("optim.learning_rate=1e-3,3e-4", "loss.gamma=0.9")
    result = sweep_throughput.run("smoketest", 2, 3, tmp_path, grid, ("train.epochs=1",))
    sweep, *walkforwards = commands
    assert sweep[3] == "sweep" and sweep.count("--grid") == 2 and "train.epochs=1" in sweep
    rates = [c[c.index("--set", c.index("train.epochs=1")) + 1] for c in walkforwards]
    assert rates == [f"optim.learning_rate={r}" for r in ("1e-3", "3e-4", "1e-3")]
    assert all(c[3] == "walkforward" and "loss.gamma=0.9" in c for c in walkforwards)
    assert result["walkforward_s"] == [30.0, 10.0, 20.0]
    assert result["separate_warm_s"] == 15.0 * 2  # the mean after the first, x 2 settings
    assert result["throughput_x"] == 30.0 / 100.0


def test_the_product_never_imports_the_research_probes_nor_the_cli_from_bench() -> None:
    """jdqn/ and pallas_kernels/ import nothing from benchmarks/, and jdqn.bench (which the CLI
    imports) imports nothing from jdqn.cli: no import circle."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for path in [*root.glob("jdqn/**/*.py"), *root.glob("pallas_kernels/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert not name.startswith("benchmarks"), (path, name)
                if "bench" in path.parts:
                    assert not name.startswith("jdqn.cli"), (path, name)
