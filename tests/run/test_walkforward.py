"""End-to-end walk-forward runs: the trained agent, outputs, reproducibility, resume."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from child import run_child
from es_sample import ES_FOLDS, ES_SAMPLE
from smoke import SMOKE

from jdqn import accel
from jdqn.agent import networks
from jdqn.bench import learning
from jdqn.cli import EXIT_HALTED, main
from jdqn.config import SMOKETEST, apply_overrides
from jdqn.run import background, report, rundir, walkforward
from jdqn.run.checkpoint import (
    META,
    Checkpointer,
    CheckpointLayoutError,
    all_finite,
    check_param_layout,
)
from jdqn.run.walkforward import run_walkforward


def _run(tmp_path: Path, overrides: list[str], name: str = "run"):
    cfg = apply_overrides(SMOKETEST, [f"output.out_dir={tmp_path}", *overrides])
    return run_walkforward(cfg, progress=False, name=name, log=lambda _: None)


def _agent_numbers(results: dict) -> list[float]:
    return [
        value
        for row in results["folds"]
        for value in (row["agent"]["net_pnl_points"], row["agent"]["sharpe"])
    ]


def _assert_outputs_complete(run_dir: Path, results: dict, n_folds: int) -> None:
    assert not run_dir.name.endswith(".incomplete")
    assert json.loads((run_dir / "results.json").read_text()) == results
    assert json.loads((run_dir / "config.json").read_text())["walkforward"]["n_folds"] == n_folds
    for row in results["folds"]:
        stem = f"fold{row['fold']}_seed{row['seed']}"
        curve = pd.read_csv(run_dir / "curves" / f"{stem}_equity.csv")
        assert {"agent_equity_points", "flat_equity_points", "random_equity_points"} <= set(curve)
        assert np.isclose(curve["agent_equity_points"].iloc[-1], row["agent"]["net_pnl_points"])
        for plot in ("equity", "training"):
            assert (run_dir / "plots" / f"{stem}_{plot}.png").stat().st_size > 1000
    assert (run_dir / "plots" / "summary.png").stat().st_size > 1000
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and {"loss_mse", "loss_c51", "q_mean", "edge_mass"} <= set(rows[0])
    assert list((run_dir / "tensorboard").rglob("events.out.tfevents.*"))


@pytest.mark.slow
def test_dqn_trains_on_es_fut(tmp_path):
    """Smoketest: 3 folds x 4 epochs (C51 blended in from epoch 2) on 60,000 synthetic ES bars."""
    outcome = _run(tmp_path, [])
    results = outcome.results
    assert not outcome.halted
    assert len(results["folds"]) == 3
    assert [row["status"] for row in results["folds"]] == ["ok"] * 3
    _assert_outputs_complete(outcome.run_dir, results, 3)
    rows = [
        json.loads(line) for line in (outcome.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    v_max = SMOKETEST.network.v_max
    q_max = [row["q_max"] for row in rows if row["q_max"] is not None]
    assert q_max and all(math.isfinite(q) and abs(q) <= v_max for q in q_max)
    # alpha = 0 in epoch 1 and 0.2 from epoch 2: the C51 part is blended in and stays finite.
    alphas = {(row["epoch"], round(row["alpha"], 6)) for row in rows if row["alpha"] is not None}
    assert alphas == {(0, 0.0), (1, 0.2), (2, 0.2), (3, 0.2)}


@pytest.mark.slow
def test_dqn_trains_on_the_real_es_sample(tmp_path):
    outcome = _run(tmp_path, [f"data.path={ES_SAMPLE}", *ES_FOLDS])
    assert not outcome.halted
    assert [row["status"] for row in outcome.results["folds"]] == ["ok"] * 3
    _assert_outputs_complete(outcome.run_dir, outcome.results, 3)
    # What made the run: schema, version, commit (this is a git checkout), the file's digest.
    assert outcome.results["schema_version"] == 2
    made_by = outcome.results["provenance"]
    assert made_by["jdqn_version"] == importlib.metadata.version("jdqn")
    assert made_by["git_commit"] is None or len(made_by["git_commit"]) == 40
    assert made_by["data"] == {
        "path": str(ES_SAMPLE),
        "sha256": hashlib.sha256(ES_SAMPLE.read_bytes()).hexdigest(),
        "bars": 2_264,
    }


# Seeds are told apart by the agent's numbers, so these runs need an agent that trades: the
# smoketest's learner these checks were written on (on the ES sample a short run of today's,
# with post-trade values, 3-step returns, gamma 0.95, scaled returns and learning rate 0.002,
# sits out: every seed nets 0).
TRADES = [
    "network.post_trade_values=false",
    "loss.n_step=1",
    "train.epochs=2",
    "loss.gamma=0.9",
    "data.scaled_returns=false",
    "optim.learning_rate=1e-3",
]


def _assert_seeds_differ_within_each_fold(results: dict, folds: int, seeds: int) -> None:
    assert [(row["fold"], row["seed"]) for row in results["folds"]] == [
        (fold, seed) for fold in range(folds) for seed in range(seeds)
    ]
    by_fold: dict[int, list[float]] = {}
    for row in results["folds"]:
        by_fold.setdefault(row["fold"], []).append(row["agent"]["net_pnl_points"])
    assert all(a != b for a, b in by_fold.values())  # seeds differ within a fold


@pytest.mark.slow
def test_expanding_folds_run_in_sequence_and_seeds_are_vmapped(tmp_path):
    """2 folds x 2 seeds: each window's length is its own program, compiled in turn, its seeds
    vmapped in it (rolling folds, vmapped with their seeds: the flat-tail test below)."""
    quiet = ["output.plots=false", "output.tensorboard=false", "train.epochs=1"]
    two = [*TRADES, f"data.path={ES_SAMPLE}", *ES_FOLDS, *quiet, "walkforward.n_folds=2"]
    two.append("train.seeds=2")
    expanding = _run(tmp_path, [*two, "walkforward.mode=expanding"], "expanding").results
    windows = [row["window"]["train"] for row in expanding["folds"] if row["seed"] == 0]
    assert len({start for start, _ in windows}) == 1  # every fold trains from the same first bar
    assert [end for _, end in windows] == sorted({end for _, end in windows})  # and grows
    groups = (tmp_path / "expanding" / "checkpoints").glob("group*")  # sha256/: the manifests
    assert sorted(group.name for group in groups) == ["group0", "group1"]
    _assert_seeds_differ_within_each_fold(expanding, folds=2, seeds=2)


@pytest.mark.slow
def test_the_flat_tail_kernels_train_every_fold_and_seed(tmp_path, monkeypatch):
    """The step's tail as Pallas kernels (interpret mode here; the GPU picks them from 16
    learners on): a walk-forward whose program steps 3 folds x 2 seeds, told its learner count;
    each seed of a fold gets its own numbers."""
    seen = []
    resolve = accel.choose

    def recording(cfg, *, backend, debug, learners):
        seen.append(learners)
        return resolve(cfg, backend=backend, debug=debug, learners=learners)

    monkeypatch.setattr(accel, "choose", recording)  # as jdqn.agent.step calls it
    quiet = ["output.plots=false", "output.tensorboard=false", "train.epochs=1"]
    outcome = _run(
        tmp_path,
        [
            *TRADES,
            f"data.path={ES_SAMPLE}",
            *ES_FOLDS,
            *quiet,
            "train.seeds=2",
            "accel.pieces=tail=interpret",
        ],
    )
    assert seen and set(seen) == {6}
    assert not outcome.halted
    assert [row["status"] for row in outcome.results["folds"]] == ["ok"] * 6
    assert all(math.isfinite(value) for value in _agent_numbers(outcome.results))
    _assert_seeds_differ_within_each_fold(outcome.results, folds=3, seeds=2)


@pytest.mark.slow
def test_same_seed_same_numbers_other_seed_other_numbers(tmp_path, monkeypatch):
    """Also wherever the work that overlaps the training compile ran: inline on this 2-core
    machine (run a) or on worker threads (run b, as on a machine with cores to spare)."""
    small = [*ES_FOLDS, f"data.path={ES_SAMPLE}", "output.plots=false", "output.tensorboard=false"]
    small = [*TRADES, *small]
    baseline_threads: list[str] = []
    baselines = walkforward._baselines

    def recorded(*args):
        baseline_threads.append(threading.current_thread().name)
        return baselines(*args)

    monkeypatch.setattr(walkforward, "_baselines", recorded)
    monkeypatch.setattr(background, "MIN_CORES", 10**6)
    first = _run(tmp_path, small, "a").results
    monkeypatch.setattr(background, "MIN_CORES", 1)
    second = _run(tmp_path, small, "b").results
    other = _run(tmp_path, [*small, "train.seed=1"], "c").results
    assert baseline_threads[0] == threading.main_thread().name
    assert baseline_threads[1].startswith("jdqn-overlap")
    assert first["folds"] == second["folds"]
    assert _agent_numbers(first) != _agent_numbers(other)


@pytest.mark.slow
def test_a_warm_run_loads_its_programs_instead_of_tracing_them(tmp_path, monkeypatch):
    """On the GPU a second process with the same config and shapes (here: a second run in this
    one) finds the compiled training, init, evaluation and baselines programs on disk: it
    neither traces nor compiles them, and its numbers are the first run's. On CPU nothing is
    stored (an XLA:CPU executable is not whole when serialised:
    jdqn.run.walkforward._executable_cache) and both runs trace; the numbers agree all the same."""
    monkeypatch.setenv("JDQN_CACHE_DIR", str(tmp_path / "cache"))
    small = [
        *ES_FOLDS,
        f"data.path={ES_SAMPLE}",
        "output.plots=false",
        "output.tensorboard=false",
        "output.checkpoints=false",
    ]
    traced: list[str] = []

    def listener(event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/jaxpr_trace_duration":
            traced.append(str(kwargs.get("fun_name")))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        first = _run(tmp_path, small, "cold").results
        cold_traced = list(traced)
        traced.clear()
        # Other outputs, same programs: where results go is not part of a program's key.
        second = _run(tmp_path / "elsewhere", small, "warm").results
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    programs = {"run_chunk", "init_run", "evaluate_run", "baselines_run"}
    assert programs <= set(cold_traced)
    directory = tmp_path / "cache" / "executables"
    if jax.default_backend() == "gpu":
        assert not programs & set(traced)
        assert {p.name.split("-")[0] for p in directory.iterdir()} == programs
    else:
        assert programs <= set(traced) and not directory.exists()
    assert first["folds"] == second["folds"]


@pytest.mark.slow
def test_absurd_learning_rate_halts_folds_cleanly(tmp_path, capsys):
    code = main(
        [
            *SMOKE,
            "--data",
            str(ES_SAMPLE),
            "--out",
            str(tmp_path),
            "--no-progress",
            "--name",
            "halt",
            *[arg for item in ES_FOLDS for arg in ("--set", item)],
            "--set",
            "optim.learning_rate=1e30",
        ]
    )
    assert code == EXIT_HALTED
    out = capsys.readouterr().out
    assert "halted:" in out
    results = json.loads((tmp_path / "halt" / "results.json").read_text())
    statuses = [row["status"] for row in results["folds"]]
    assert all(status.startswith("halted: ") and " at epoch " in status for status in statuses)
    for group in (tmp_path / "halt" / "checkpoints").glob("group*"):  # sha256/: the manifests
        checkpointer = Checkpointer(group)
        step = checkpointer.latest_step()
        assert step is not None
        assert (group / f"{step}.npz").exists()
        checkpointer.close()
    assert all_finite_checkpoints(tmp_path / "halt" / "checkpoints")


def all_finite_checkpoints(directory: Path) -> bool:
    """Every array saved under ``directory`` is finite (each step's .npz read back raw)."""
    steps = [rundir.read_arrays(step) for step in directory.rglob("*.npz")]
    return bool(steps) and all(all_finite({k: v for k, v in a.items() if k != META}) for a in steps)


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_numbers(tmp_path):
    args = [
        "--data",
        str(ES_SAMPLE),
        "--no-progress",
        "--epochs",
        "3",
        *[arg for item in ES_FOLDS for arg in ("--set", item)],
        "--set",
        "train.chunk_iterations=8",
        "--set",
        "output.plots=false",
    ]
    reference = tmp_path / "reference"
    assert main([*SMOKE, *args, "--out", str(reference), "--name", "r"]) == 0
    expected = json.loads((reference / "r" / "results.json").read_text())

    killed = tmp_path / "killed"
    incomplete = killed / "k.incomplete"
    # SIGKILL mid-epoch, after the first epoch's checkpoint: at the second chunk of epoch 2, a
    # moment the child picks itself (a timed kill from here could land after the run ended).
    argv = [*SMOKE, *args, "--out", str(killed), "--name", "k"]
    child = (
        "import os, signal, sys\n"
        "from jdqn.cli import console\n"
        "from jdqn.run.metrics_log import MetricsLog\n"
        "add = MetricsLog.add\n"
        "def add_then_die(self, epoch, chunk, *rest):\n"
        "    if (epoch, chunk) == (1, 1):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return add(self, epoch, chunk, *rest)\n"
        "MetricsLog.add = add_then_die\n"
        f"sys.argv = ['jdqn', *{argv!r}]\n"
        "sys.exit(console())\n"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert incomplete.exists() and not (incomplete / "results.json").exists()
    assert list(incomplete.glob("checkpoints/group0/[0-9]*"))

    code = main(["walkforward", "--resume", str(incomplete), "--no-progress"])
    assert code == 0
    resumed = json.loads((killed / "k" / "results.json").read_text())
    assert _agent_numbers(resumed) == _agent_numbers(expected)
    assert [r["training"] for r in resumed["folds"]] == [r["training"] for r in expected["folds"]]


# Learning: the smoketest agent, 3 seeds x 3 folds, on planted momentum 0.3 and on a martingale
# (jdqn.data.synth) of an evaluation path (never used to choose a setting), with shorter test
# windows (20,000 train bars, 6,000 test bars) so that one compiled program trains all 18 runs
# on a CPU. Both data sets share the volatility unit of the first one's first train window (the
# same shocks drive both), so they share the program.
LEARNING_WINDOWS = ["walkforward.train_bars=20000", "walkforward.test_bars=6000"]
LEARNING_BARS = 20_000 + 1_380 + 3 * 6_000
LEARNING_PATH = learning.EVALUATION_PATHS[0]
# The scorecard's yardstick: $2,500 per 12,000 bars, so $1,250 per 6,000-bar test window.
FLAT_BAND_USD = learning.FLAT_BAND_USD * 6_000 / learning.FLAT_BAND_BARS


class Judged(NamedTuple):
    """A policy's test-window results [fold][seed]."""

    net_usd: list[list[float]]
    exposure: list[list[float]]  # share of bars in a position


def takes_the_edge(judged: Judged) -> bool:
    """Every seed-fold nets at least the flat band above flat: a margin float32 rounding cannot
    flip, and one a policy that stopped learning (flat, random) does not reach."""
    return all(min(nets) >= FLAT_BAND_USD for nets in judged.net_usd)


def sits_out(judged: Judged) -> bool:
    """No edge: the median exposure over seed-folds is at most the scorecard's 10 % and every
    seed-fold stays within the flat band (holding one direction, whatever it nets, fails)."""
    exposure = np.median(np.concatenate(judged.exposure))
    nets = np.abs(np.concatenate(judged.net_usd))
    return bool(exposure <= learning.SITTING_OUT_EXPOSURE and np.all(nets <= FLAT_BAND_USD))


def _learning_data(strengths: tuple[float, ...], seeds: int):
    from jdqn.data import prepare_walkforward, synthetic_bars

    cfg = apply_overrides(
        SMOKETEST,
        [*LEARNING_WINDOWS, f"data.synthetic_bars={LEARNING_BARS}", f"train.seeds={seeds}"],
    )
    datasets = [
        prepare_walkforward(
            synthetic_bars(LEARNING_BARS, LEARNING_PATH, strength),
            apply_overrides(cfg, [f"data.signal_strength={strength}"]),
        )
        for strength in strengths
    ]
    return cfg, datasets


def _judge_positions(cfg, close: np.ndarray, held: list[np.ndarray]) -> tuple[list, list]:
    """Net $ and exposure of each position path over one test window (the environment's
    convention: ``held[i]`` over bar i -> i+1, from flat)."""
    from jdqn.evaluation.baselines import position_record

    records = [position_record(close, h, cfg.env.cost_points) for h in held]
    usd = cfg.env.point_value_usd
    return (
        [usd * float(r.net_points.sum()) for r in records],
        [float(np.mean(r.positions != 0.0)) for r in records],
    )


def _learning_runs(strengths: tuple[float, ...], seeds: int) -> list[Judged]:
    """The greedy agent's test-window results on each data set."""
    from jdqn.agent.train import FoldData, make_train
    from jdqn.run.walkforward import resolve_reward_unit, run_keys

    cfg, datasets = _learning_data(strengths, seeds)
    cfg = resolve_reward_unit(cfg, datasets[0])
    first = datasets[0]
    non_causal = tuple(first.feature_groups["calendar"])
    folds = len(first.folds)
    program = make_train(cfg, first.n_features, 20_000, non_causal, learners=folds * seeds)
    fold_of_run = np.repeat(np.arange(folds), seeds)
    keys = run_keys(0, fold_of_run, np.tile(np.arange(seeds), folds))
    init = jax.jit(jax.vmap(program.init))
    chunk = jax.jit(jax.vmap(program.run_chunk, in_axes=(0, 0, None, None)))
    evaluate = jax.jit(jax.vmap(program.evaluate))
    results = []
    for data in datasets:

        def stacked(windows):
            return FoldData(
                features=jnp.asarray(np.stack([windows[k].features for k in fold_of_run])),
                close=jnp.asarray(np.stack([windows[k].close for k in fold_of_run])),
            )

        train, test = stacked(data.train), stacked(data.test)
        state = init(keys.training, train)
        for epoch in range(cfg.train.epochs):
            for c in range(program.chunks_per_epoch):
                state, _ = chunk(state, train, jnp.int32(epoch), jnp.int32(c))
        assert not np.any(np.asarray(state.learner.guard.halted))
        rollout = jax.device_get(evaluate(state, test, keys.evaluation))
        usd = cfg.env.point_value_usd
        runs = [np.flatnonzero(fold_of_run == k) for k in range(folds)]
        judged = Judged(
            [[usd * float(np.sum(rollout.net_points[r])) for r in fold] for fold in runs],
            [[float(np.mean(rollout.positions[r] != 0)) for r in fold] for fold in runs],
        )
        results.append(judged)
    return results


def test_the_learning_checks_fail_flat_always_long_always_short_and_random():
    """The checks the learning test applies, run on policies that learned nothing, over the same
    test windows: none takes the planted edge (a trader who knows the drift does); on the
    martingale, only flat sits out."""
    cfg, (planted, martingale) = _learning_data((0.3, 0.0), seeds=1)
    rng = np.random.default_rng(0)

    def policy(data, make):
        judged = Judged([], [])
        for window in data.test:
            close = np.asarray(window.close, np.float64)
            held = [make(close.size - 1) for _ in range(3)]
            net, exposure = _judge_positions(cfg, close, held)
            judged.net_usd.append(net)
            judged.exposure.append(exposure)
        return judged

    policies = {
        "flat": np.zeros,
        "always long": np.ones,
        "always short": lambda n: -np.ones(n),
        "random": lambda n: rng.integers(-1, 2, n).astype(np.float64),
    }
    for name, make in policies.items():
        assert not takes_the_edge(policy(planted, make)), name
        assert sits_out(policy(martingale, make)) == (name == "flat"), name
    # A trader who knows the planted drift passes the edge check.
    from jdqn.data.synth import synthetic_path
    from jdqn.evaluation.baselines import band_positions

    drift = synthetic_path(LEARNING_BARS, LEARNING_PATH, 0.3).drift_points
    informed = Judged([], [])
    for window, fold in zip(planted.test, planted.folds, strict=True):
        signal = drift[fold.test_start : fold.test_end]
        held = band_positions(signal / signal.std(), 1.0)
        net, exposure = _judge_positions(cfg, np.asarray(window.close, np.float64), [held])
        informed.net_usd.append(net)
        informed.exposure.append(exposure)
    assert takes_the_edge(informed), informed


@pytest.fixture(scope="module")
def learned() -> list[Judged]:
    return _learning_runs((0.3, 0.0), seeds=3)


@pytest.mark.slow
def test_agent_takes_a_planted_edge_on_an_evaluation_path(learned):
    """Planted momentum 0.3 on a path no setting was chosen on: every seed-fold nets at least
    $1,250 per 6,000 bars (the scorecard's $2,500 per 12,000)."""
    planted, _ = learned
    assert takes_the_edge(planted), planted


@pytest.mark.slow
def test_agent_sits_out_a_martingale(learned):
    """No edge: median exposure at most 10 % and every seed-fold within the flat band."""
    _, martingale = learned
    assert sits_out(martingale), martingale


def test_a_checkpoint_of_another_state_layout_is_a_one_line_error(tmp_path):
    """Resuming a run whose checkpoint was written with another state layout (an older jdqn's
    flat vectors, say) names the problem and the fix instead of a list of leaves."""
    old = {"params": {"head": {"bias": jnp.zeros(3)}}, "step": jnp.int32(4)}
    checkpointer = Checkpointer(tmp_path / "group0")
    checkpointer.save(1, old, {"epochs_done": 1})
    new = {"params": jnp.zeros(3), "step": jnp.int32(0)}
    with pytest.raises(ValueError, match=r"holds a state of another layout") as caught:
        checkpointer.restore(new)
    assert "\n" not in str(caught.value) and "fix: start the run again" in str(caught.value)
    restored, meta = checkpointer.restore(old)  # the matching layout still restores
    assert int(restored["step"]) == 4 and meta == {"epochs_done": 1}
    checkpointer.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("written", "named"),
    [("tree", "holds a state of another layout"), ("orbax", "written by an older jdqn (orbax)")],
)
def test_resuming_from_a_checkpoint_of_another_layout_says_start_again(
    tmp_path, capsys, written, named
):
    """The CLI path: one line, exit 2, no "resume with" hint (resuming again cannot help), and
    the user's directory is left as it was. ``orbax``: an older jdqn's step folder."""
    cfg = apply_overrides(SMOKETEST, [*ES_FOLDS, f"data.path={ES_SAMPLE}", "output.plots=false"])
    incomplete = tmp_path / "old.incomplete"
    incomplete.mkdir()
    (incomplete / "config.json").write_text(cfg.to_json() + "\n")
    group = incomplete / "checkpoints" / "group0"
    if written == "orbax":
        (group / "1" / "state").mkdir(parents=True)
    else:
        checkpointer = Checkpointer(group)
        tree_params = {"params": {"head": {"bias": jnp.zeros(3)}}}  # not this jdqn's state
        checkpointer.save(1, tree_params, {"epochs_done": 1, "halted_epoch": {}})
        checkpointer.close()
    before = sorted(group.rglob("*"))
    code = main(["walkforward", "--resume", str(incomplete), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("jdqn: error")]
    assert len(lines) == 1 and named in lines[0]
    assert "fix: start the run again" in lines[0] and "resume with" not in err
    assert sorted(group.rglob("*")) == before


def test_a_checkpoint_of_another_parameter_order_is_refused(tmp_path):
    """A flat vector of the same size in another order (an older jdqn stored the head kernel
    [in, out]) restores without complaint, so the checkpoint's layout record decides."""
    layout = networks.param_layout(SMOKETEST, 16).record()
    check_param_layout({"param_layout": layout}, layout, tmp_path)  # its own: accepted
    head = [name for name, _ in layout].index("['head']['kernel']")
    transposed = [list(entry) for entry in layout]
    transposed[head] = [transposed[head][0], transposed[head][1][::-1]]
    for meta in ({"epochs_done": 1}, {"param_layout": transposed}):  # no record; another order
        with pytest.raises(CheckpointLayoutError, match="another order or shape") as caught:
            check_param_layout(meta, layout, tmp_path)
        assert "\n" not in str(caught.value) and "fix: start the run again" in str(caught.value)


def test_a_checkpoint_holds_the_state_as_saved_after_its_buffers_are_donated(tmp_path):
    """Saves write on a thread while training goes on, and the next chunk donates the
    state's device buffers: the checkpoint must hold the values at save time, not whatever the
    buffers hold (or fail on) later."""
    state = {"w": jnp.arange(6.0).reshape(2, 3), "step": jnp.int32(7)}
    expected = jax.device_get(state)
    checkpointer = Checkpointer(tmp_path / "group0")
    checkpointer.save(1, state, {"epochs_done": 1})
    for leaf in jax.tree.leaves(state):
        leaf.delete()  # what donation does to the caller's arrays
    checkpointer.close()
    reopened = Checkpointer(tmp_path / "group0")
    like = {"w": jnp.zeros((2, 3)), "step": jnp.int32(0)}
    restored, meta = reopened.restore(like)
    reopened.close()
    np.testing.assert_array_equal(np.asarray(restored["w"]), expected["w"])
    assert int(restored["step"]) == 7 and meta == {"epochs_done": 1}


def test_only_the_latest_two_checkpoints_remain_once_closed(tmp_path):
    checkpointer = Checkpointer(tmp_path / "group0")
    for step in range(1, 5):
        checkpointer.save(step, {"w": jnp.full(3, float(step))}, {"epochs_done": step})
    checkpointer.close()
    assert sorted(p.name for p in (tmp_path / "group0").iterdir()) == ["3.npz", "4.npz", "sha256"]


@pytest.mark.slow
def test_a_whole_run_imports_no_orbax_or_tensorstore(tmp_path):
    """Checkpoints are .npz files (issue 47): a run that checkpoints, resumes from its checkpoint
    and saves its policies loads neither library (0.2-0.3 s of start-up they cost)."""
    args = [*SMOKE, "--data", str(ES_SAMPLE), "--no-progress", "-q", "--epochs", "1"]
    args += [a for item in (*ES_FOLDS, "output.plots=false") for a in ("--set", item)]
    script = (
        "import sys\n"
        "from jdqn.cli import main\n"
        f"assert main({[*args, '--out', str(tmp_path), '--name', 'r']!r}) == 0\n"
        "libraries = {m.split('.')[0] for m in sys.modules} & {'orbax', 'tensorstore'}\n"
        "assert not libraries, libraries\n"
    )
    done = run_child(script, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert list((tmp_path / "r" / "checkpoints" / "group0").glob("*.npz"))
    assert list((tmp_path / "r" / "policies").glob("fold*_seed0"))


def test_prefetch_imports_on_the_writer_thread_in_order(monkeypatch):
    seen: list[tuple[str, str]] = []
    real = report._import

    def recording(module: str) -> None:
        seen.append((module, threading.current_thread().name))
        real(module)

    monkeypatch.setattr(report, "_import", recording)
    with report.BackgroundWrites() as writes:
        writes.prefetch(["colorsys", "json"])
    assert [module for module, _ in seen] == ["colorsys", "json"]
    assert all(name.startswith("jdqn-writes") for _, name in seen)
    assert "colorsys" in sys.modules


@pytest.mark.slow
def test_a_run_prefetches_what_its_metrics_and_checkpoints_import(tmp_path, monkeypatch):
    """Once per group, after its first chunk is queued: tensorboardX, the import that no longer
    happens before training."""
    asked: list[list[str]] = []
    real = report.BackgroundWrites.prefetch

    def recording(self, modules):
        asked.append(list(modules))
        real(self, modules)

    monkeypatch.setattr(report.BackgroundWrites, "prefetch", recording)
    _run(tmp_path, [*ES_FOLDS, f"data.path={ES_SAMPLE}", "output.plots=false", "train.epochs=1"])
    assert asked and all(modules == ["tensorboardX"] for modules in asked)


def test_an_unused_checkpointer_closes_without_creating_its_directory(tmp_path):
    checkpointer = Checkpointer(tmp_path / "group0")
    assert checkpointer.latest_step() is None
    checkpointer.close()
    assert not (tmp_path / "group0").exists()


def test_the_tensorboard_writer_waits_for_the_first_chunk(tmp_path):
    """tensorboardX's import runs while the first chunk trains, not before (MetricsLog.add);
    that the first add writes the events is checked by the complete runs above."""
    from types import SimpleNamespace

    from jdqn.run.metrics_log import MetricsLog

    run = SimpleNamespace(
        metrics_path=tmp_path / "metrics.jsonl", tensorboard_dir=tmp_path / "tensorboard"
    )
    log = MetricsLog(run, SMOKETEST, [(0, 0)], 0, 0, writes=None)
    assert SMOKETEST.output.tensorboard and log._writer is None
    assert not (tmp_path / "tensorboard").exists()
    log.close(write_plots=False)


def test_a_chunk_row_averages_the_causal_kl_over_its_due_steps_only(tmp_path):
    """The causal KL is measured on due steps only (0 on the others, causal_applied says
    which): a chunk's row averages it over those, and has no value when the chunk has none;
    every other metric averages over all trained iterations."""
    from types import SimpleNamespace

    from jdqn.agent import LearnerMetrics
    from jdqn.run.metrics_log import MetricsLog

    run = SimpleNamespace(metrics_path=tmp_path / "metrics.jsonl")
    cfg = apply_overrides(SMOKETEST, ["output.tensorboard=false"])
    log = MetricsLog(run, cfg, [(0, 0), (1, 0)], 0, 0, writes=None)
    zeros = np.zeros((2, 4), np.float32)
    learner = LearnerMetrics(*[zeros for _ in LearnerMetrics._fields])._replace(
        loss_mse=np.array([[1.0, 2.0, 3.0, 4.0]] * 2, np.float32),
        loss_causal=np.array([[0.4, 0.0, 0.0, 0.2], [0.0, 0.0, 0.0, 0.0]], np.float32),
        causal_applied=np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]], np.float32),
    )
    chunk = SimpleNamespace(
        learner=learner,
        active=np.ones((2, 4), bool),
        trained=np.ones((2, 4), bool),
        epsilon=zeros,
        reward_mean=zeros,
    )
    log.add(0, 0, np.array([4, 4]), chunk)
    log.close(write_plots=False)
    rows = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    assert [row["loss_causal"] for row in rows] == [pytest.approx(0.3), None]
    assert [row["loss_mse"] for row in rows] == [2.5, 2.5]


@pytest.mark.slow
def test_the_command_draws_its_plots_in_processes_where_cores_are_spare(tmp_path, monkeypatch):
    """`jdqn walkforward` asks for plot processes; a script calling run_walkforward does not by
    default (spawn imports the caller's main module again, which an unguarded script cannot
    take). With cores to spare the command's plots come from the processes, all of them."""
    asked: list[int] = []
    real = report.BackgroundWrites

    def recording(preload=(), plot_processes=0, file_threads=1):
        asked.append(plot_processes)
        return real(preload, plot_processes, file_threads)

    monkeypatch.setattr(report, "BackgroundWrites", recording)
    monkeypatch.setattr(background, "usable_cores", lambda: 4)  # the fewest that spare some
    small = [*ES_FOLDS, "train.epochs=1", "output.tensorboard=false", "output.checkpoints=false"]
    code = main(
        [
            *SMOKE, "--data", str(ES_SAMPLE), "--out", str(tmp_path), "--no-progress",
            "--name", "command", *[arg for item in small for arg in ("--set", item)],
        ]
    )  # fmt: skip
    assert code == 0
    _run(tmp_path, [f"data.path={ES_SAMPLE}", *small], "script")
    assert asked == [report.plot_processes(4), 0] and asked[0] > 0
    for name in ("command", "script"):
        results = json.loads((tmp_path / name / "results.json").read_text())
        plots = sorted(p.name for p in (tmp_path / name / "plots").iterdir())
        assert len(plots) == 2 * len(results["folds"]) + 2, plots  # + stitched curve, summary
