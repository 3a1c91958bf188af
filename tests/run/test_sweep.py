"""``jdqn sweep`` (jdqn.run.sweep): the settings, their programs, the validation folds, the
selection rules, bad input, and end to end on the ES sample: two learning rates train as one
program whose numbers are each setting's own walk-forward run's, a fold's selection never sees
its test window, a sweep killed between runs resumes."""

from __future__ import annotations

import csv
import errno
import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from es_sample import ES_FOLDS, ES_SAMPLE

from jdqn.agent.state import HYPER_KEYS
from jdqn.cli import main
from jdqn.config import SMOKETEST, WalkForwardConfig, apply_overrides
from jdqn.config.keys import config_keys
from jdqn.data import make_folds
from jdqn.data.folds import validation_folds
from jdqn.evaluation import stats
from jdqn.evaluation.overfitting import probability_of_overfitting
from jdqn.evaluation.policy import load_policy
from jdqn.evaluation.policy_bundle import POLICIES, bundle_dir
from jdqn.run import background, faults, memory, placement, report, rundir, sweep, walkforward
from jdqn.run.walkforward import UserError, load_data, policy_root, run_walkforward

SMALL_SEEDS = 2
SMALL = [
    *ES_FOLDS,
    "walkforward.n_folds=2",
    "train.epochs=1",
    f"train.seeds={SMALL_SEEDS}",
    "output.plots=false",
    "output.tensorboard=false",
    # the smoketest's learner these tests were written on: settings are told apart by the
    # agent's numbers, and a one-epoch agent with post-trade values and 3-step returns sits
    # the ES sample out (every setting nets 0)
    "network.post_trade_values=false",
    "train.act_risk=0",
    "loss.n_step=1",
]
GRID = ("optim.learning_rate=1e-3,3e-4",)


def test_a_grid_is_every_combination_in_order() -> None:
    settings = sweep.grid_settings(
        SMOKETEST, ["optim.learning_rate=1e-3,3e-4", "network.hidden=32,32/64", "loss.gamma=0.9"]
    )
    assert [dict(s) for s in settings] == [
        {"optim.learning_rate": lr, "network.hidden": h, "loss.gamma": "0.9"}
        for lr in ("1e-3", "3e-4")
        for h in ("32,32", "64")
    ]
    # Settings that differ only in the base seed: the null case of overfitting.
    assert sweep.grid_settings(SMOKETEST, ["train.seed=0,1"]) == (
        (("train.seed", "0"),),
        (("train.seed", "1"),),
    )
    # The hold penalty charges training rewards only, so unlike the costs it may vary.
    assert [dict(s) for s in sweep.grid_settings(SMOKETEST, ["env.hold_penalty=0,0.05"])] == [
        {"env.hold_penalty": "0"},
        {"env.hold_penalty": "0.05"},
    ]


def test_samples_draw_from_lists_and_ranges_reproducibly() -> None:
    grid = ["optim.learning_rate=log:1e-5..1e-2", "optim.target_every=10..20", "loss.gamma=0.8,0.9"]
    settings = sweep.grid_settings(SMOKETEST, grid, samples=200, seed=3)
    assert settings == sweep.grid_settings(SMOKETEST, grid, samples=200, seed=3)
    rates = np.array([float(dict(s)["optim.learning_rate"]) for s in settings])
    syncs = {int(dict(s)["optim.target_every"]) for s in settings}
    assert rates.min() >= 1e-5 and rates.max() <= 1e-2
    assert (rates < 1e-4).mean() == pytest.approx(1 / 3, abs=0.1)  # log-uniform: a third a decade
    assert syncs <= set(range(10, 21)) and len(syncs) > 5
    assert {dict(s)["loss.gamma"] for s in settings} == {"0.8", "0.9"}


def test_settings_that_differ_in_values_only_share_a_program() -> None:
    """Learning rate, gamma and exploration's end are values of the learners and the config seed
    seeds their keys: settings differing only in them are one program; a layer size makes
    programs of its own."""
    grid = ["optim.learning_rate=1e-3,3e-4", "network.hidden=8,8/16,16", "loss.gamma=0.8,0.9"]
    plan = sweep.SweepPlan(sweep.grid_settings(SMOKETEST, grid))
    assert sweep.program_groups(plan) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    cfg = sweep.group_config(SMOKETEST, plan, [2, 3, 6, 7])
    assert cfg.network.hidden == (16, 16) and cfg.train.seeds == 4 * SMOKETEST.train.seeds
    assert cfg.optim.learning_rate == SMOKETEST.optim.learning_rate  # the learners carry theirs
    seeds = sweep.SweepPlan(sweep.grid_settings(SMOKETEST, ["train.seed=1,2"]))
    assert sweep.program_groups(seeds) == [[0, 1]]


def test_alpha_schedules_of_other_lengths_are_one_program() -> None:
    """A tuple-valued key separates its values with ``/``: two alpha schedules (each learner's,
    padded to the epochs) make one program; a bad schedule is named with its setting."""
    plan = sweep.SweepPlan(sweep.grid_settings(SMOKETEST, ["loss.alpha_schedule=0,0.2/0,0.5,0.5"]))
    assert [dict(s) for s in plan.settings] == [
        {"loss.alpha_schedule": "0,0.2"},
        {"loss.alpha_schedule": "0,0.5,0.5"},
    ]
    assert sweep.program_groups(plan) == [[0, 1]]
    schedules = [c.loss.alpha_schedule for c in sweep.setting_configs(SMOKETEST, plan)]
    assert schedules == [(0.0, 0.2), (0.0, 0.5, 0.5)]
    bad = sweep.SweepPlan(sweep.grid_settings(SMOKETEST, ["loss.alpha_schedule=0,0.2/0,2"]))
    with pytest.raises(ValueError, match=r"^setting loss.alpha_schedule=0,2: loss.alpha_schedule"):
        sweep.setting_configs(SMOKETEST, bad)


def test_jdqn_config_keys_says_which_keys_share_a_program() -> None:
    """Every key a learner carries as a value, and only those, says so in ``jdqn config keys``."""
    said = "a learner's value: one sweep program"
    assert {k.key for k in config_keys() if said in k.description} == set(HYPER_KEYS)


def test_a_program_of_acting_risks_computes_the_std_where_one_is_above_0(tmp_path) -> None:
    """Acting's std is a static branch: a program whose settings' act_risk include one above 0
    is built with the largest; a walk-forward asked for such settings under act_risk 0 refuses
    in one line, writing nothing."""
    plan = sweep.SweepPlan(sweep.grid_settings(SMOKETEST, ["train.act_risk=0,0.5,0.25"]))
    assert sweep.program_groups(plan) == [[0, 1, 2]]
    assert sweep.group_config(SMOKETEST, plan, [0, 1, 2]).train.act_risk == 0.5
    assert sweep.group_config(SMOKETEST, plan, [0]).train.act_risk == 0.0
    settings = [[("train.act_risk", "0")], [("train.act_risk", "0.5")]]
    with pytest.raises(UserError, match="^settings of train.act_risk > 0 need the run's"):
        run_walkforward(_config(tmp_path), progress=False, log=print, settings=settings)
    assert not list(tmp_path.iterdir())


def test_a_walkforward_refuses_settings_its_learners_cannot_carry(tmp_path) -> None:
    """Settings of one program: only the keys the learners carry as values, as many as divide
    the seeds; else one line, nothing written."""
    for settings in ([(("network.hidden", "8,8"),)], [(), (), ()]):  # a shape; 3 into 2 seeds
        with pytest.raises(UserError, match="must be optim.learning_rate, loss.gamma"):
            run_walkforward(_config(tmp_path), progress=False, log=print, settings=settings)
    assert not list(tmp_path.iterdir())


def test_validation_tails_end_at_the_train_windows_and_are_purged() -> None:
    layout = WalkForwardConfig(n_folds=3, train_bars=100, test_bars=30, purge_bars=5)
    folds = make_folds(200, layout)
    inner = validation_folds(folds, 20, 5)
    for outer, fold in zip(folds, inner, strict=True):
        assert fold.train_start == outer.train_start and fold.test_end == outer.train_end
        assert (fold.test_end - fold.test_start, fold.test_start - fold.train_end) == (20, 5)
        assert fold.train_end - fold.train_start == 100 - 20 - 5
    with pytest.raises(ValueError, match="validation tail of 94 bars"):
        validation_folds(folds, 94, 5)


def test_rules_pick_the_best_median_or_lower_bound() -> None:
    """Setting 1 has the higher median in fold 0 but a wide spread; the lower bound of the
    bootstrap median is its worst-but-one seed, so lcb prefers the steadier setting 0. In fold 1
    setting 0 halted in a seed (-inf) and still has the higher median of three."""
    scores = np.array(
        [
            [[1.0, 1.1, 1.2], [5.0, 5.0, -np.inf]],
            [[-9.0, 2.0, 3.0], [4.0, 4.5, 4.6]],
        ]
    )
    chosen, value = sweep.select(scores, "median", seed=0)
    assert list(chosen) == [1, 0] and value[1, 0] == 2.0 and value[0, 1] == 5.0
    chosen, value = sweep.select(scores, "lcb", seed=0)
    draws = stats.bootstrap_distribution([scores[1, 0]], stats.median, seed=0)
    assert value[1, 0] == np.percentile(draws, 2.5, method="lower") == -9.0
    assert list(chosen) == [0, 1] and value[0, 1] == -np.inf


def test_cscv_blocks_shrink_to_the_bars_and_need_two_settings() -> None:
    noise = np.random.default_rng(0).normal(size=(9, 3))
    assert sweep._cscv(noise, 16)["blocks"] == 8 and sweep._cscv(noise, 4)["splits"] == 6
    assert sweep._cscv(noise[:, :1], 16)["pbo"] is None
    # settings that all sat out tie everywhere: nothing was chosen, so no probability (the
    # first of equals would rank worst out of sample and read as PBO 1)
    flat = np.zeros((64, 4))
    assert sweep._cscv(flat, 16)["pbo"] is None
    assert probability_of_overfitting(flat, 16).pbo == 1.0


def test_ranks_and_their_plot(tmp_path) -> None:
    """Rank 1 is the best value in its fold; a halted setting (-inf) ranks last."""
    validation = np.array([[3.0, -np.inf], [1.0, 2.0], [2.0, 5.0]])
    assert sweep._ranks(validation).tolist() == [[1, 3], [3, 2], [2, 1]]
    path = tmp_path / "ranks.png"
    sweep.plot_ranks(path, validation, validation[::-1], np.array([0, 2]))
    assert path.stat().st_size > 1000


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "at least one --grid"),
        (["--grid", "optim.nonsense=1,2"], "optim.nonsense: unknown key"),
        (["--grid", "walkforward.n_folds=2,3"], "cannot vary in a sweep"),
        (["--grid", "env.slippage_ticks=0,1"], "same contract and costs"),
        (["--grid", "env.hold_penalty=0,-1"], "env.hold_penalty: must be >= 0"),
        (["--grid", "train.seeds=1,2"], "cannot vary"),
        (["--grid", "optim.learning_rate="], "an empty value"),
        (["--grid", "optim.learning_rate=1e-3,,2e-3"], "an empty value"),
        (["--grid", "optim.learning_rate=1e-3,-1"], "optim.learning_rate: must be > 0"),
        (["--grid", "optim.learning_rate=1e-4..1e-3"], "needs --samples"),
        (["--grid", "optim.learning_rate=a..b", "--samples", "2"], "two numbers"),
        (["--grid", "loss.gamma=0.9", "--rule", "best"], "--rule best"),
        (["--grid", "replay.capacity=128,1000000000"], "memory"),  # the second is too large
        (["--grid", "loss.gamma=0.9", "--validation-bars", "990"], "validation tail of 990"),
        (["--grid", "loss.gamma=0.9", "--validation-bars", "1"], "validation tail of 1"),
        (["--grid", "loss.gamma=0.9", "--name", "../x"], "name"),
        (["--resume", "x.incomplete"], "--resume continues a sweep with its own plan"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, flags, message) -> None:
    settings = [f"--set={item}" for item in SMALL]
    code = main(["sweep", "--data", str(ES_SAMPLE), "--out", str(tmp_path), *settings, *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("jdqn: error: ")
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_sweep_keeps_its_directory_only_when_there_is_something_to_resume(
    tmp_path, monkeypatch
) -> None:
    """A Ctrl-C in the first run leaves nothing; one after a finished run keeps the directory
    and says how to resume (the runs are stand-ins: nothing is trained)."""
    calls: list[str] = []

    def stand_in(cfg, *, name, **_):
        calls.append(name)
        if len(calls) == 2:
            finished = Path(cfg.output.out_dir) / "validation"
            finished.mkdir(parents=True)
            (finished / "results.json").write_text("{}")
            return SimpleNamespace(results={}, run_dir=finished)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "run_walkforward", stand_in)
    plan = sweep.SweepPlan(sweep.grid_settings(SMOKETEST, list(GRID)))
    logged: list[str] = []
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            sweep.run_sweep(_config(tmp_path), plan, name="s", progress=False, log=logged.append)
    assert calls == ["validation", "validation", "test"]
    assert [p.name for p in tmp_path.iterdir()] == [f"s{rundir.INCOMPLETE_SUFFIX}"]
    assert logged[-1].endswith(f"jdqn sweep --resume {tmp_path}/s{rundir.INCOMPLETE_SUFFIX}")


@pytest.mark.parametrize("moment", ["as _new_run returns", "in the first log line"])
def test_a_ctrl_c_once_the_sweep_directory_is_made_leaves_nothing(tmp_path, monkeypatch, moment):
    """A Ctrl-C let through once the directory is made, but raised before the sweep has it in
    hand or before its first run (a re-raise after a garbage-collector callback lands on a
    later call): the directory is removed all the same (as walk-forward's: test_termination)."""
    new_run = sweep._new_run

    def interrupted_on_return(*args, **kwargs):
        new_run(*args, **kwargs)
        raise KeyboardInterrupt

    def interrupted_log(line: str) -> None:
        raise KeyboardInterrupt

    if moment == "as _new_run returns":
        monkeypatch.setattr(sweep, "_new_run", interrupted_on_return)
    plan = sweep.SweepPlan(sweep.grid_settings(SMOKETEST, list(GRID)))
    log = interrupted_log if moment == "in the first log line" else (lambda _: None)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(_config(tmp_path), plan, name="s", progress=False, log=log)
    assert list(tmp_path.iterdir()) == []


# --- end to end on the ES sample ---------------------------------------------------------------


def _config(tmp_path: Path, data: Path = ES_SAMPLE) -> sweep.Config:
    return apply_overrides(SMOKETEST, [*SMALL, f"data.path={data}", f"output.out_dir={tmp_path}"])


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> rundir.RunOutcome:
    """Two learning rates x 2 folds x 2 seeds, one epoch each."""
    out = tmp_path_factory.mktemp("sweep")
    plan = sweep.SweepPlan(sweep.grid_settings(SMOKETEST, list(GRID)))
    return sweep.run_sweep(_config(out), plan, name="sweep", progress=False, log=lambda _: None)


def _setting_rows(run: Path, i: int, phase: str, seeds: int = SMALL_SEEDS) -> list[dict]:
    """Setting ``i``'s result rows in the run of its program, seeds as in its own run."""
    entry = json.loads((run / "results.json").read_text())["settings"][i]
    rows = json.loads((run / entry["runs"] / phase / "results.json").read_text())["folds"]
    offset = entry["seed_offset"]
    return [{**r, "seed": r["seed"] - offset} for r in rows if 0 <= r["seed"] - offset < seeds]


@pytest.mark.slow
def test_each_settings_numbers_in_one_program_are_its_own_walkforward_runs(swept, tmp_path):
    """The two learning rates trained as learners of one program (settings x folds x seeds)
    give each setting's own walk-forward numbers, on the test windows and the selection's: bit
    for bit on CPU (no tolerance needed; a GPU may reassociate float32 sums between programs
    of 8 and 4 learners)."""
    results = swept.results
    assert [s["runs"] for s in results["settings"]] == ["settings/s000"] * 2
    assert [s["seed_offset"] for s in results["settings"]] == [0, SMALL_SEEDS]
    assert _setting_rows(swept.run_dir, 0, "test") != _setting_rows(swept.run_dir, 1, "test")
    cfg = _config(tmp_path)
    _, validation = sweep.prepare_data(cfg, 300)
    for i, setting in enumerate(sweep.grid_settings(SMOKETEST, list(GRID))):
        setting_cfg = apply_overrides(cfg, [f"{k}={v}" for k, v in setting])
        quiet = dict(progress=False, log=lambda _: None)
        own = run_walkforward(setting_cfg, name=f"own{i}", **quiet).results
        assert _setting_rows(swept.run_dir, i, "test") == own["folds"]
        own_validation = run_walkforward(
            sweep.validation_config(setting_cfg, validation), data=validation, name=f"v{i}", **quiet
        ).results
        assert _setting_rows(swept.run_dir, i, "validation") == own_validation["folds"]
        chosen_folds = [k for k, s in enumerate(results["selection"]["chosen"]) if s == i]
        selected = [row for row in results["folds"] if row["fold"] in chosen_folds]
        own_selected = [{**r, "setting": i} for r in own["folds"] if r["fold"] in chosen_folds]
        assert selected == own_selected


# Two settings that differ in every key the learners carry as values, so one sweep checks them
# all: a key the program did not carry would give setting 1 setting 0's value, and its rows
# would then differ from its own run's.
CARRIED = {
    "loss.alpha_schedule": ("0,0.2", "0,0.5,0.5"),
    "loss.label_smoothing": ("0.01", "0.3"),
    "env.hold_penalty": ("0", "0.05"),
    "train.act_risk": ("0", "0.5"),  # the program's 0.5; the learner of 0 acts by the mean
    "optim.target_every": ("100", "300"),
    "env.train_cost_scale": ("1", "2"),
}


@pytest.mark.slow
def test_a_sweep_of_values_the_learners_carry_is_one_program_of_their_own_runs(tmp_path):
    """Two settings of the keys the learners carry as values (:data:`CARRIED`), swept over 2
    epochs as one program: each setting's rows, on the test windows and on the validation tails,
    are those of its own walk-forward runs, bit for bit on CPU."""
    cfg = apply_overrides(_config(tmp_path), ["train.seeds=1", "train.epochs=2"])
    settings = tuple(tuple((k, v[i]) for k, v in CARRIED.items()) for i in (0, 1))
    plan = sweep.SweepPlan(settings)
    assert sweep.program_groups(plan) == [[0, 1]]
    quiet = dict(progress=False, log=lambda _: None)
    swept = sweep.run_sweep(cfg, plan, name="sweep", **quiet).run_dir
    _, validation = sweep.prepare_data(cfg, sweep.validation_length(cfg, plan))
    policies = []
    for i, setting in enumerate(plan.settings):
        own_cfg = apply_overrides(cfg, [f"{k}={v}" for k, v in setting])
        own = run_walkforward(own_cfg, name=f"own{i}", **quiet)
        assert _setting_rows(swept, i, "test", seeds=1) == own.results["folds"]
        own_validation = run_walkforward(
            sweep.validation_config(own_cfg, validation), data=validation, name=f"v{i}", **quiet
        ).results
        assert _setting_rows(swept, i, "validation", seeds=1) == own_validation["folds"]
        ours = policy_root(swept / "settings/s000/test", i, 2)
        policies.append(np.load(bundle_dir(ours, 1, 0) / "arrays.npz"))
        theirs = np.load(bundle_dir(own.run_dir, 1, 0) / "arrays.npz")
        for name in theirs.files:
            np.testing.assert_array_equal(policies[i][name], theirs[name])
    # The values mattered: the two settings learned other policies.
    assert any(not np.array_equal(policies[0][n], policies[1][n]) for n in policies[0].files)


@pytest.mark.slow
def test_settings_of_other_config_seeds_in_one_program_are_their_own_runs(tmp_path):
    """Two settings that differ only in ``train.seed`` (the null case of overfitting) train as
    learners of one program with the keys of their own runs: each gives its own run's rows (the
    fold's baselines, shared by its settings, are the first setting's)."""
    cfg = apply_overrides(_config(tmp_path), ["train.seeds=1", "walkforward.n_folds=1"])
    quiet = dict(progress=False, log=lambda _: None)
    settings = [[("train.seed", "0")], [("train.seed", "7")]]
    run = run_walkforward(
        apply_overrides(cfg, ["train.seeds=2"]), name="both", settings=settings, **quiet
    )
    both = run.results["folds"]
    for index, seed in enumerate((0, 7)):
        own = run_walkforward(
            apply_overrides(cfg, [f"train.seed={seed}"]), name=f"own{seed}", **quiet
        )
        mine = [{**row, "seed": 0} for row in both if row["seed"] == index]
        assert [{**row, "baselines": None} for row in mine] == [
            {**row, "baselines": None} for row in own.results["folds"]
        ]
        if seed == 0:
            assert mine == own.results["folds"]
        # The policies learned, to the bit: each setting trained with its own seed's keys.
        ours = np.load(bundle_dir(policy_root(run.run_dir, index, 2), 0, 0) / "arrays.npz")
        theirs = np.load(bundle_dir(own.run_dir, 0, 0) / "arrays.npz")
        assert ours.files == theirs.files
        for name in ours.files:
            np.testing.assert_array_equal(ours[name], theirs[name])
    first, second = (
        np.load(bundle_dir(policy_root(run.run_dir, k, 2), 0, 0) / "arrays.npz") for k in (0, 1)
    )
    assert any(not np.array_equal(first[n], second[n]) for n in first.files)


def _two_rates_in_waves_of_three(tmp_path, monkeypatch) -> tuple[sweep.Config, list]:
    """The program of the two learning rates and its settings, with device room for 3 of its 8
    learners (so they run in waves)."""
    plan = sweep.SweepPlan(sweep.grid_settings(SMOKETEST, list(GRID)))
    cfg = sweep.group_config(_config(tmp_path), plan, [0, 1])
    data = load_data(cfg)
    each = memory.learner_bytes(cfg, data.n_features)
    shared = sum(a.features.nbytes + a.close.nbytes for a in (*data.train, *data.test))
    room = int((3.5 * each + shared) / placement.MEMORY_FRACTION)
    monkeypatch.setattr(placement, "free_bytes", lambda _: room)
    return cfg, [list(setting) for setting in plan.settings]


@pytest.mark.slow
def test_a_program_of_settings_runs_in_waves_where_memory_demands(swept, tmp_path, monkeypatch):
    """With room for 3 learners, the 8 of the two learning rates (settings x folds x seeds) run
    in waves of their one program, with the numbers of all at once (the baselines too: a
    fold's are seeded by its seed-0 key in whatever wave its first run falls). Each wave is
    judged on a worker thread (as where cores are spare) while the next one trains; the rows
    keep their order."""
    monkeypatch.setattr(background, "MIN_CORES", 1)
    judged_on: list[str] = []
    judge_group = walkforward._judge_group

    def recorded(*args):
        judged_on.append(threading.current_thread().name)
        return judge_group(*args)

    monkeypatch.setattr(walkforward, "_judge_group", recorded)
    cfg, settings = _two_rates_in_waves_of_three(tmp_path, monkeypatch)
    notices: list[str] = []
    waves = run_walkforward(cfg, progress=False, log=notices.append, name="w", settings=settings)
    assert any("waves of 3" in line for line in notices), notices
    assert len(judged_on) == 3 and all(t.startswith("jdqn-overlap") for t in judged_on)
    kept = json.loads((swept.run_dir / "settings/s000/test/results.json").read_text())
    assert waves.results["folds"] == kept["folds"]


@pytest.mark.slow
def test_a_waves_judging_error_stops_the_run_before_the_next_wave_trains(tmp_path, monkeypatch):
    """Judged inline (a 2-core machine), the first wave's error is raised before the second
    wave trains, not after every wave has."""
    cfg, settings = _two_rates_in_waves_of_three(tmp_path, monkeypatch)
    monkeypatch.setattr(background, "MIN_CORES", 10**6)
    trained: list[int] = []
    train_group = walkforward._train_group

    def counted(job, programs, *args):
        trained.append(programs.index)
        return train_group(job, programs, *args)

    def failing(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(walkforward, "_train_group", counted)
    monkeypatch.setattr(walkforward, "_judge_group", failing)
    with pytest.raises(faults.IOFault, match="no space left"):
        run_walkforward(cfg, progress=False, log=lambda _: None, name="w", settings=settings)
    assert trained == [0]


@pytest.mark.slow
def test_the_sweeps_outputs(swept, tmp_path) -> None:
    run, results = swept.run_dir, swept.results
    assert not run.name.endswith(rundir.INCOMPLETE_SUFFIX)
    assert json.loads((run / "results.json").read_text()) == results
    with (run / "sweep.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * 2 * 2  # settings x folds x seeds
    chosen = results["selection"]["chosen"]
    for row in rows:
        assert row["selected"] == str(int(chosen[int(row["fold"])] == int(row["setting"])))
        (match,) = [
            r
            for r in _setting_rows(run, int(row["setting"]), "validation")
            if (r["fold"], r["seed"]) == (int(row["fold"]), int(row["seed"]))
        ]
        assert float(row["validation_net_pnl_usd"]) == match["agent"]["net_pnl_usd"]
    validation = json.loads((run / "settings/s000/validation/results.json").read_text())
    # The validation runs trained on 640 bars and were judged on the 300 before each train end.
    assert validation["config"]["walkforward"]["train_bars"] == 640
    # Its reward unit: the volatility of fold 0's inner train part, before every validation tail.
    _, inner = sweep.prepare_data(_config(tmp_path), 300)
    rms = np.sqrt(np.mean(np.diff(inner.train[0].close.astype(np.float64)) ** 2))
    assert validation["config"]["env"]["reward_scale"] == pytest.approx(1 / rms, rel=1e-12)
    folds = make_folds(2264, _config(tmp_path).walkforward)
    tails = {tuple(r["window"]["test"]) for r in validation["folds"]}
    assert tails == {(f.train_end - 300, f.train_end) for f in folds}
    assert results["n_trials"] == 4 and results["summary"]["overall"]["deflated_sharpe"][
        "n_trials"
    ] in (4, 2)  # settings x seeds; 2 seeds x 2 settings unless a seed halted
    overfit = results["overfitting"]
    assert 0.0 <= overfit["pbo"] <= 1.0 and overfit["splits"] == 12870  # C(16, 8)
    assert overfit["bars_used"] == 2 * 299 - 2 * 299 % 16  # two test windows of 299 intervals
    assert sorted(overfit["folds"]) == ["0", "1"] and overfit["folds"]["1"]["bars_used"] == 288
    # The selected policies are bundles that jdqn.load_policy and jdqn evaluate read; they are
    # the test runs' (whole train windows): the selection runs save none.
    assert bundle_dir(policy_root(run / "settings/s000/test", chosen[1], 2), 1, 0).is_dir()
    assert not list((run / "settings/s000/validation").glob(f"**/{POLICIES}"))
    policy = load_policy(run, fold=1, seed=0)
    lr = dict(sweep.grid_settings(SMOKETEST, list(GRID))[chosen[1]])["optim.learning_rate"]
    assert policy.cfg.optim.learning_rate == float(lr)
    assert main(["evaluate", str(run), "--data", str(ES_SAMPLE), "--fold", "1"]) == 0


def test_each_folds_choice_is_checked_against_its_test_window(swept) -> None:
    """results.json says, per fold, the chosen setting's validation net (median over its seeds'
    runs) with an interval over trading days and seeds, its test net (the median of its test
    runs) and whether that lies within the interval."""
    run, results = swept.run_dir, swept.results
    for fold, setting in enumerate(results["selection"]["chosen"]):
        held = results["selection"]["held_up"][fold]
        validation, test = (
            [r["agent"]["net_pnl_usd"] for r in _setting_rows(run, setting, phase)
             if r["fold"] == fold and r["agent"]]
            for phase in ("validation", "test")
        )  # fmt: skip
        assert held["validation_net_usd"] == pytest.approx(np.median(validation), abs=1e-6)
        assert held["test_net_usd"] == np.median(test)
        low, high = held["validation_ci"]
        assert low <= held["validation_net_usd"] <= high
        assert held["test_within_ci"] == (low <= held["test_net_usd"] <= high)
        assert held["few_seeds"] and "trading days" in held["ci_covers"]  # 2 seeds


def _equity_run(path: Path, days: int, nets: np.ndarray) -> dict:
    """A stand-in sub-run of fold 0 in ``path``: one bar a day, each seed's agent ``nets`` [n]."""
    stamps = np.datetime64("2020-01-06T10:00", "ns") + np.arange(days + 1) * np.timedelta64(1, "D")
    rows = []
    for seed, net in enumerate(nets):
        curves = {"agent": np.cumsum(net)}
        report.write_equity_csv(
            path / "curves" / f"fold0_seed{seed}_equity.csv",
            stamps,
            curves,
            {"agent": np.zeros(days)},
        )
        agent = {"net_pnl_usd": float(net.sum() * SMOKETEST.env.point_value_usd)}
        rows.append({"fold": 0, "seed": seed, "agent": agent, "window": {"test": [0, days]}})
    return {"run_dir": str(path), "seed_offset": 0, "folds": rows}


def test_a_short_validation_tail_estimates_the_test_windows_length(tmp_path) -> None:
    """A tail of D days judged against a test window of 2D: the estimate is twice the tail's
    median net, and the interval the prediction interval of a sum of 2D days from the tail's D
    (seeds that traded alike leave only the days' noise: the normal one, 2D mean +- 1.96 sd
    sqrt(2D + (2D)^2 / D), the estimate's error and the window's own noise); a tail as long as
    the test window is its own median, unscaled."""
    (tmp_path / "v" / "curves").mkdir(parents=True)
    (tmp_path / "t" / "curves").mkdir(parents=True)
    days = 300
    daily = np.random.default_rng(4).normal(0.5, 4.0, days)
    chosen_on = _equity_run(tmp_path / "v", days, np.tile(daily, (3, 1)))
    test = _equity_run(tmp_path / "t", 2 * days, np.zeros((3, 2 * days)))
    held = sweep._held_up((chosen_on, test), 0, SMOKETEST)
    usd = SMOKETEST.env.point_value_usd
    assert held["validation_net_usd"] == pytest.approx(2 * daily.sum() * usd)
    half = 1.96 * daily.std() * np.sqrt(2 * days + (2 * days) ** 2 / days) * usd
    low, high = held["validation_ci"]
    assert low == pytest.approx(2 * daily.sum() * usd - half, abs=0.1 * half)
    assert high == pytest.approx(2 * daily.sum() * usd + half, abs=0.1 * half)
    assert f"tail's {days} trading days resampled" in held["ci_covers"]
    assert f"then {2 * days} of them" in held["ci_covers"]
    same = sweep._held_up((chosen_on, chosen_on), 0, SMOKETEST)
    assert same["validation_net_usd"] == pytest.approx(daily.sum() * usd, rel=1e-9)
    assert f"then {days} of them" in same["ci_covers"]


@pytest.mark.slow
def test_a_folds_selection_never_sees_its_test_window(swept, tmp_path) -> None:
    """The bars from fold 0's test window on are replaced by another price path: fold 0's
    validation results (and so its choice) are the same to the bit; fold 1's validation tail,
    which overlaps fold 0's test window, did change."""
    bars = pd.read_csv(ES_SAMPLE)
    start = make_folds(len(bars), _config(tmp_path).walkforward)[0].test_start
    prices = ["open", "high", "low", "close"]
    bars.loc[start:, prices] = bars.loc[start:, prices].to_numpy()[::-1] * 1.01
    altered_path = tmp_path / "altered.csv"
    bars.to_csv(altered_path, index=False)
    cfg = _config(tmp_path, altered_path)
    data, validation = sweep.prepare_data(cfg, 300)
    _, original = sweep.prepare_data(_config(tmp_path), 300)
    assert data.folds[0].test_start == start
    assert np.array_equal(validation.test[0].close, original.test[0].close)
    assert not np.array_equal(validation.test[1].close, original.test[1].close)
    plan = sweep.SweepPlan(sweep.grid_settings(SMOKETEST, list(GRID)))
    selection_cfg = sweep.validation_config(sweep.group_config(cfg, plan, [0, 1]), validation)
    altered = run_walkforward(
        selection_cfg,
        data=validation,
        progress=False,
        log=lambda _: None,
        name="v",
        settings=[list(setting) for setting in plan.settings],
    ).results
    kept = json.loads((swept.run_dir / "settings/s000/validation/results.json").read_text())
    assert len(kept["folds"]) == 2 * 2 * SMALL_SEEDS  # settings x folds x seeds, one program
    assert [r for r in altered["folds"] if r["fold"] == 0] == [
        r for r in kept["folds"] if r["fold"] == 0
    ]


@pytest.mark.slow
def test_a_full_disk_in_a_sweeps_run_says_resume_the_sweep(tmp_path, monkeypatch, capsys) -> None:
    """A storage failure inside one of the sweep's walk-forward runs (which says it its own
    way, for its own directory) reaches the user as the sweep's line: resume the sweep, not the
    run (resumed alone, its learners would be refused)."""
    finish = walkforward._finish

    def full_as_the_test_run_ends(job, *args):
        if job.run.path.name.startswith("test"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(job.run.results_path))
        return finish(job, *args)

    monkeypatch.setattr(walkforward, "_finish", full_as_the_test_run_ends)
    plan = sweep.SweepPlan(sweep.grid_settings(SMOKETEST, list(GRID)))
    with pytest.raises(faults.IOFault) as raised:
        sweep.run_sweep(_config(tmp_path), plan, name="sweep", progress=False, log=print)
    killed = tmp_path / f"sweep{rundir.INCOMPLETE_SUFFIX}"
    assert str(raised.value).endswith(
        f"no space left on the device; fix: free space or fix the file system, then resume "
        f"with: jdqn sweep --resume {killed}"
    )
    assert str(killed / "settings/s000/test.incomplete/results.json") in str(raised.value)
    assert "jdqn walkforward" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_sweep_killed_between_runs_resumes_to_the_same_results(
    swept, tmp_path, monkeypatch
) -> None:
    """A kill as the settings' test run ends, after its last checkpoint and before its results:
    the resumed sweep resumes that run (it judges again) and writes the uninterrupted results.
    A finished run of the sweep keeps no checkpoints (it resumes from its results)."""
    finish = walkforward._finish

    def killed_as_the_test_run_ends(job, *args):
        if job.run.path.name.startswith("test"):
            raise KeyboardInterrupt
        return finish(job, *args)

    monkeypatch.setattr(walkforward, "_finish", killed_as_the_test_run_ends)
    plan = sweep.SweepPlan(sweep.grid_settings(SMOKETEST, list(GRID)))
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(_config(tmp_path), plan, name="sweep", progress=False, log=lambda _: None)
    monkeypatch.undo()
    killed = tmp_path / f"sweep{rundir.INCOMPLETE_SUFFIX}"
    assert (killed / "settings/s000/validation/results.json").is_file()
    assert not (killed / "settings/s000/validation/checkpoints").exists()
    alone = killed / f"settings/s000/test{rundir.INCOMPLETE_SUFFIX}"
    assert list(alone.glob("checkpoints/group0/[0-9]*"))
    # Its learners are bound to their settings: resumed without them, refused (one line).
    with pytest.raises(UserError, match="the learners changed since the run started"):
        run_walkforward(None, resume=alone, progress=False, log=lambda _: None)
    outcome = sweep.run_sweep(None, None, resume=killed, progress=False, log=lambda _: None)
    assert outcome.run_dir == tmp_path / "sweep"

    def elsewhere(results: dict) -> dict:  # where the run was written aside
        return {**results, "config": {**results["config"], "output": None}}

    assert elsewhere(outcome.results) == elsewhere(swept.results)
    assert (outcome.run_dir / "sweep.csv").read_text() == (swept.run_dir / "sweep.csv").read_text()
    plan = sweep.SweepPlan(sweep.grid_settings(SMOKETEST, list(GRID)))
    assert sweep.SweepPlan.from_record(swept.results["sweep"]) == plan
