"""The size estimate (jdqn.run.memory) against the real arrays, and requests that cannot fit refused
in one line before any memory is taken."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from smoke import SMOKE
from test_cli import _assert_one_line_error

from jdqn.agent import networks
from jdqn.agent.train import FoldData, make_train
from jdqn.cli import EXIT_USER_ERROR, main
from jdqn.config import SMOKETEST, apply_overrides
from jdqn.data import compute_features, synthetic_bars
from jdqn.run import memory

GIB = 2**30


@pytest.mark.parametrize("scaled", ["true", "false"])
@pytest.mark.parametrize("horizons", ["[1, 5, 15, 60]", "[1, 2]"])
def test_the_feature_count_is_the_features_module_s(horizons, scaled):
    overrides = [f"data.return_horizons={horizons}", f"data.scaled_returns={scaled}"]
    cfg = apply_overrides(SMOKETEST, overrides)
    features = compute_features(synthetic_bars(2_000, seed=0), cfg.data)
    assert memory.n_features(cfg.data) == features.values.shape[1]


@pytest.mark.parametrize("overrides", [[], ["network.hidden=[32, 16, 8]", "network.n_heads=3"]])
def test_the_parameter_count_is_the_network_s(overrides):
    cfg = apply_overrides(SMOKETEST, overrides)
    assert memory.param_count(cfg, 15) == networks.param_layout(cfg, 16).size


def _nbytes(tree) -> int:
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))


@pytest.mark.parametrize(
    "overrides", [[], ["replay.capacity=2048", "network.hidden=[128, 128]", "train.n_slices=8"]]
)
def test_the_state_estimate_matches_the_initialised_state(overrides):
    """The checkpoint copy of the states against the bytes of the state ``init`` builds (shapes
    only), per learner."""
    cfg = apply_overrides(SMOKETEST, overrides)
    n_features = memory.n_features(cfg.data)
    program = make_train(cfg, n_features, 512, (0,))
    fold = FoldData(jnp.zeros((512, n_features)), jnp.ones((512,)))
    shapes = jax.eval_shape(program.init, jax.random.PRNGKey(0), fold)
    actual = _nbytes(shapes)
    estimated = memory.estimate(cfg, n_learners=3, n_bars=None).host[
        "checkpoint copy of the states"
    ]
    assert estimated / 3 == pytest.approx(actual, rel=0.02)


def test_a_request_that_fits_passes_and_one_that_does_not_names_estimate_limit_and_fix():
    need = memory.MemoryEstimate(host={"bar series and features": 5 * GIB}, device={})
    memory.check_fits(need, memory.MemoryLimits(host_bytes=8 * GIB, device_bytes=None))
    with pytest.raises(memory.RequestTooLarge) as caught:
        memory.check_fits(need, memory.MemoryLimits(host_bytes=6 * GIB, device_bytes=None))
    message = str(caught.value)
    assert message == (
        "this run needs about 5.0 GiB of host (the CPU device's arrays included) memory "
        "(bar series and features: 5.0 GiB), more than the 4.8 GiB usable of 6.0 GiB; "
        "fix: fewer data.synthetic_bars or a shorter bar file"
    )
    on_gpu = memory.MemoryLimits(host_bytes=64 * GIB, device_bytes=4 * GIB)
    states = memory.MemoryEstimate(device={"fold arrays": 1, "learner step working set": 4 * GIB})
    with pytest.raises(memory.RequestTooLarge, match=r"of device memory \(learner step working"):
        memory.check_fits(states, on_gpu)


def test_the_estimate_grows_with_what_the_request_asks_for():
    base = memory.estimate(SMOKETEST, n_learners=3, n_bars=60_000)
    seeds = memory.estimate(SMOKETEST, n_learners=300_000, n_bars=60_000)
    assert seeds.host_bytes > 90_000 * base.host_bytes / 1_000
    # The device holds one learner at the least, whatever the seeds (the rest run in waves).
    assert seeds.device == base.device
    assert memory.learners(apply_overrides(SMOKETEST, ["train.seeds=7"])) == 21
    expanding = apply_overrides(SMOKETEST, ["train.seeds=7", "walkforward.mode=expanding"])
    assert memory.learners(expanding) == 7
    assert base.host["bar series and features"] == 60_000 * (144 + 12 * 19)  # 19 features
    assert np.isfinite(float(base.host_bytes))


@pytest.mark.parametrize(
    ("argv", "part"),
    [
        (["--seeds", "100000"], "fix: fewer --seeds"),
        (["--seeds", "2000"], "fix: fewer --seeds"),  # M6: every learner is held at once on CPU
        (["--set", "network.hidden=[100000,100000]"], "or a smaller train.batch_size or network"),
        (["--set", "data.synthetic_bars=1e9"], "bar series and features"),
        (["--set", "data.synthetic_bars=1e10"], "outside [-2,147,483,647, 2,147,483,647]"),
    ],
)
def test_the_cli_refuses_what_cannot_fit_in_one_line_and_leaves_nothing(
    tmp_path, capsys, monkeypatch, argv, part
):
    """On a machine of 16 GiB (the limits are the test's, so the result is the same anywhere)."""
    monkeypatch.setattr(memory, "limits", lambda: memory.MemoryLimits(16 * GIB, None))
    out = tmp_path / "runs"
    code = main([*SMOKE, *argv, "--out", str(out), "--no-progress"])
    assert code == EXIT_USER_ERROR
    err = capsys.readouterr().err
    _assert_one_line_error(err, part)
    assert "fix: " in err
    assert part.startswith("outside") or "usable of 16.0 GiB" in err
    assert not out.exists()


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz", ".parquet"])
def test_a_bar_file_s_rows_and_columns_are_told_without_reading_it(tmp_path, suffix):
    """Issue 49 item 3: the estimate counts a bar file before it is loaded."""
    from jdqn.data import write_bars

    path = tmp_path / f"bars{suffix}"
    write_bars(synthetic_bars(20_000, seed=0), path)
    rows, columns = memory.bar_file_shape(path)
    assert columns == 6 and abs(rows - 20_000) <= 20_000 * 0.05, rows
    assert memory.bar_file_shape(tmp_path / "missing.csv") is None


def test_a_bar_file_too_large_for_memory_is_refused_before_it_is_read(tmp_path, capsys):
    """SIXTYM: a (sparse) 1 TB CSV of real rows' length: refused in one line at once."""
    path = tmp_path / "huge.csv"
    with open(path, "wb") as handle:
        handle.write(b"timestamp,open,high,low,close,volume\n")
        handle.write(b"2021-01-03 17:00:00,1854.75,1855.0,1854.75,1854.75,440\n" * 2000)
        handle.truncate(10**12)
    out = tmp_path / "out"
    argv = ["walkforward", "--profile", "smoketest", "--data", str(path), "--out", str(out)]
    assert main([*argv, "--no-progress"]) == EXIT_USER_ERROR
    _assert_one_line_error(capsys.readouterr().err, "or a shorter bar file")
    assert not out.exists()


PEAK_RSS_CHILD = """
import resource, subprocess, sys
subprocess.run([sys.executable, "-m", "jdqn", *sys.argv[1:]], check=True, capture_output=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


@pytest.mark.slow
@pytest.mark.parametrize("seeds", [1, 64])
def test_the_cpu_estimate_is_within_2x_of_the_measured_peak(tmp_path, seeds):
    """M7: a CPU run's peak RSS (the process's own, measured by a parent of its own) against
    the estimate the CLI checks (every learner held at once, the process, the bar file)."""
    from es_sample import ES_FOLDS, ES_SAMPLE

    settings = [*ES_FOLDS, "walkforward.n_folds=1", "train.epochs=1", f"train.seeds={seeds}"]
    settings += ["output.plots=false", "output.tensorboard=false", f"data.path={ES_SAMPLE}"]
    settings += ["output.compilation_cache=false"]  # compiled here: its peak counts, every time
    argv = ["walkforward", "--profile", "smoketest", "--no-progress", "--out", str(tmp_path)]
    for item in settings:
        argv += ["--set", item]
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", PEAK_RSS_CHILD, *argv], capture_output=True, text=True, check=True
    )
    peak = int(done.stdout)
    cfg = apply_overrides(SMOKETEST, settings)
    need = memory.request_estimate(cfg, None, None, cpu=True)
    estimated = need.host_bytes + need.device_bytes
    assert 0.5 < peak / estimated < 2.0, (peak, estimated)
