"""The learning scorecard's statistics against hand-computed cases, its store, its command line
and (slow) its CPU variant end to end."""

import json
import subprocess

import jax
import pytest

from jdqn.bench import learning


def _row(agent, trades, fold=0, seed=0, path=100, exposure=0.5, **baselines):
    return {
        "path": path,
        "fold": fold,
        "seed": seed,
        "agent": None
        if agent is None
        else {
            "net_pnl_usd": agent,
            "sharpe": agent / 1000,
            "sharpe_daily": agent / 4000,
            "n_trades": trades,
            "n_bars": 6000,
            "exposure": exposure,
        },
        "baselines": {name: {"net_pnl_usd": value} for name, value in baselines.items()},
    }


def test_score_picks_the_best_tuned_baseline_and_counts_halted_runs_as_failures():
    rows = [
        _row(1000.0, 2, 0, 0, momentum=800.0, ridge=900.0, buy_and_hold=9e9, exposure=0.0),
        _row(-200.0, 4, 0, 1, momentum=800.0, ridge=900.0, buy_and_hold=9e9, exposure=0.2),
        _row(3000.0, 10, 1, 0, momentum=3500.0, ridge=1000.0, buy_and_hold=9e9, exposure=0.9),
        _row(None, 0, 1, 1, momentum=3500.0, ridge=1000.0, buy_and_hold=9e9),  # halted
    ]
    rows[-1]["status"] = "halted: non-finite loss"
    card = learning.score(rows)
    assert (card["runs"], card["halted"]) == (4, 1)
    # Medians over every seed-fold: momentum 2,150 (800, 800, 3500, 3500), ridge 950; buy & hold
    # is not a tuned baseline, so it is never "best".
    assert card["best_baseline"] == "momentum"
    assert card["baseline_median_net_usd"]["ridge"] == 950.0
    # agent - momentum: +200, -1000, -500; halted runs fail every share (denominator 4).
    best = card["agent_minus_best_net_usd"]
    assert best["median"] == -500.0 and best["clusters"] == 2 and best["few_seeds"]
    assert card["share_above"]["momentum"] == pytest.approx(1 / 4)
    assert card["share_positive"] == pytest.approx(2 / 4)
    # Within $2,500 x 6,000 / 12,000 = $1,250 of flat: 1000 and -200.
    assert card["share_within_flat_band"] == pytest.approx(2 / 4)
    assert card["exposure"] == 0.2 and card["share_sitting_out"] == pytest.approx(1 / 4)
    assert card["changes_per_1000_bars"] == pytest.approx(4 / 6)
    assert card["net_usd"]["median"] == 1000.0 and card["sharpe_daily"]["median"] == 0.25
    assert card["run_ids"] == [[100, 0, 0], [100, 0, 1], [100, 1, 0]]
    assert card["halted_runs"] == [[100, 1, 1, "halted: non-finite loss"]]
    table = learning.format_table([{"case": "c", "data": "evaluation", "wall_s": 1.0, **card}])
    assert "| momentum: +2,150 |" in table and "-500 [" in table and "]* |" in table
    assert "| c | momentum (best) | +2,150 |" in learning.format_baselines([{"case": "c", **card}])


def test_each_path_is_scored_on_its_own_seed_folds_against_the_case_s_best_baseline():
    """Path 100 carries the case (agent - momentum +1,000 and +3,000) and path 101 does not
    (-500 and a halted run); the case's best baseline, momentum, is each path's yardstick even
    where ridge does better on that path."""
    rows = [
        _row(2000.0, 2, 0, 0, momentum=1000.0, ridge=0.0),
        _row(4000.0, 2, 1, 0, momentum=1000.0, ridge=0.0, exposure=0.9),
        _row(500.0, 4, 0, 0, path=101, momentum=1000.0, ridge=1500.0, exposure=0.1),
        _row(None, 0, 1, 0, path=101, momentum=3000.0, ridge=1500.0),
    ]
    card = learning.score(rows)
    assert card["best_baseline"] == "momentum"
    first, second = card["by_path"]
    assert first["path"] == 100 and (first["runs"], first["halted"]) == (2, 0)
    assert first["net_usd"] == 3000.0 and first["best_net_usd"] == 1000.0
    assert first["agent_minus_best_net_usd"] == 2000.0 and first["share_above_best"] == 1.0
    assert first["exposure"] == pytest.approx(0.7) and first["share_within_flat_band"] == 0.0
    assert second["path"] == 101 and (second["runs"], second["halted"]) == (2, 1)
    assert second["best_net_usd"] == 2000.0  # over both seed-folds: a baseline does not halt
    assert second["agent_minus_best_net_usd"] == -500.0 and second["share_above_best"] == 0.0
    assert second["share_within_flat_band"] == 0.5  # +500 within $1,250; the halted run fails
    table = learning.format_paths([{"case": "c", **card}])
    assert "| c | 100 | 2 (0) | +3,000 | +1,000 | +2,000 | 100% | 0% | 70% |" in table
    assert "| c | 101 | 2 (1) | +500 | +2,000 | -500 | 0% | 50% | 10% |" in table
    bar_file = learning.score([{**_row(1.0, 1, momentum=0.0), "path": None}])
    assert bar_file["by_path"] == [] and learning.format_paths([{"case": "c", **bar_file}])


def test_a_case_whose_runs_all_halted_prints_n_a():
    card = learning.score([_row(None, 0, momentum=5.0)])
    assert card["halted"] == 1 and card["best_baseline"] == "momentum"
    assert card["exposure"] is None and card["agent_minus_best_net_usd"]["median"] is None
    table = learning.format_table([{"case": "c", "data": "evaluation", "wall_s": 1.0, **card}])
    assert table.count("n/a") >= 6 and "| 1 (1) |" in table


def test_the_causal_bound_share_uses_the_informed_baseline():
    rows = [_row(x, 1, 0, s, momentum=0.0, informed=0.0) for s, x in enumerate((10.0, 30.0))]
    for row, bound in zip(rows, (80.0, 120.0), strict=True):
        row["baselines"]["informed"]["causal_bound_usd"] = bound
    card = learning.score(rows)
    assert card["causal_bound_usd"] == 100.0 and card["share_of_bound"] == pytest.approx(0.2)


def test_paired_compares_the_same_path_fold_and_seed_only():
    """A - B on the runs both have: (100,0,0) +500, (100,0,1) -100, (100,1,0) +0; B's
    (100,1,1) and (101,0,0) have no partner."""
    a = learning.score([_row(1500.0, 1, 0, 0), _row(-300.0, 1, 0, 1), _row(50.0, 1, 1, 0)])
    b = learning.score(
        [_row(1000.0, 1, 0, 0), _row(-200.0, 1, 0, 1), _row(50.0, 1, 1, 0), _row(9.0, 1, 1, 1)]
        + [_row(7.0, 1, 0, 0, path=101)]
    )
    versus = learning.paired(a, b)
    assert versus["pairs"] == 3
    assert versus["share_a_at_least_b"] == pytest.approx(2 / 3)
    assert versus["net_usd_a_minus_b"]["median"] == 0.0
    low, high = versus["net_usd_a_minus_b"]["median_ci"]
    assert -100.0 <= low <= 0.0 <= high <= 500.0


def test_the_data_split_is_fixed_and_evaluation_paths_are_never_development():
    assert len(learning.EVALUATION_PATHS) >= 5 and learning.FULL.paths == learning.EVALUATION_PATHS
    assert not set(learning.EVALUATION_PATHS) & set(learning.DEVELOPMENT_PATHS)
    assert set(learning.SMALL.paths) <= set(learning.EVALUATION_PATHS)


def test_unknown_case_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="valid"):
        learning.run(learning.SMALL._replace(cases=("nope",)))


@pytest.mark.slow
def test_a_finished_case_is_stored_and_reused_until_its_inputs_change(tmp_path, monkeypatch):
    calls = []

    def fake_case(cfg, overrides, *_):
        calls.append(list(overrides))
        return [_row(100.0 * len(calls), 1, 0, s, path=None, momentum=0.0) for s in range(2)]

    monkeypatch.setattr(learning, "run_case", fake_case)
    scale = learning.SMALL._replace(cases=("martingale", "planted_0.3"))
    first = learning.run(scale, store=tmp_path)
    assert len(calls) == 2 and sorted(p.name for p in tmp_path.iterdir()) == [
        "martingale.json",
        "planted_0.3.json",
    ]
    assert learning.run(scale, store=tmp_path) == json.loads(json.dumps(first, default=float))
    assert len(calls) == 2  # both reused
    (tmp_path / "planted_0.3.json").unlink()  # as if cut short before the second case ended
    learning.run(scale, store=tmp_path)
    assert len(calls) == 3 and "data.signal_strength=0.3" in calls[-1]
    learning.run(scale, overrides=["train.epochs=3"], store=tmp_path)
    assert len(calls) == 5  # other overrides: computed again


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cases", "nope"], "unknown case 'nope'"),
        (["--set", "train.epochs=x"], "train.epochs"),
        (["--paths", "a,b"], "invalid literal"),
        (["--json", "/"], "--json /: a directory"),
        (["--json", "/dev/null/scorecard.json"], "not a directory you can write in"),
        (["--jobs", "2"], "--jobs needs --store DIR"),
        (["--jobs", "0", "--store", "/tmp"], "--jobs 0; fix: 1 or more"),
        (["--choose", "train.nope=1,2"], "train.nope"),
        (["--choose", "data.signal_strength=0,0.3"], "data.signal_strength"),
        (["--choose", "train.act_risk=1,0.5", "--rule", "mean"], "--rule 'mean'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(learning, "run_case", lambda *_: pytest.fail("nothing may run"))
    assert learning.main([*argv, "--small"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_cases_run_as_processes_sharing_the_store_and_the_parent_prints_them(
    tmp_path, monkeypatch, capsys
):
    """--jobs 2: each case is this command with --cases CASE in a process of its own (here the
    same main in-process, its training faked), storing into --store; the parent then reads
    every case from the store and trains nothing itself. A case that fails is named with its log."""
    commands = []

    def child(command, stdout, stderr):
        commands.append(command)
        assert command[1:3] == ["-m", "jdqn.bench.learning"] and "--json" not in command
        try:
            status = learning.main(command[3:])
        except ZeroDivisionError:  # what a process would exit with, its traceback in the log
            status = 1
        return subprocess.CompletedProcess(command, status)

    def fake_case(cfg, overrides, *_):
        return [_row(500.0, 1, 0, s, path=None, momentum=0.0) for s in range(2)]

    monkeypatch.setattr(learning.bench.subprocess, "run", child)
    monkeypatch.setattr(learning, "run_case", fake_case)
    store, out = tmp_path / "store", tmp_path / "card.json"
    argv = ["--small", "--cases", "martingale,planted_0.3", "--set", "train.epochs=1"]
    argv += ["--jobs", "2", "--store", str(store), "--json", str(out)]
    assert learning.main(argv) == 0
    assert sorted(c[c.index("--cases") + 1] for c in commands) == ["martingale", "planted_0.3"]
    assert all("--set=train.epochs=1" in c and "--small" in c for c in commands)
    assert {p.name for p in store.iterdir()} >= {"martingale.json", "martingale.log"}
    assert [r["case"] for r in json.loads(out.read_text())] == ["martingale", "planted_0.3"]
    assert "| planted_0.3 |" in capsys.readouterr().out
    monkeypatch.setattr(learning, "run_case", lambda *_: pytest.fail("the parent reuses the store"))
    assert learning.main(argv) == 0  # finished cases: the children reuse the store too
    (store / "planted_0.3.json").unlink()
    monkeypatch.setattr(learning, "run_case", lambda *_: 1 / 0)  # the child fails
    assert learning.main(argv) == 1
    err = capsys.readouterr().err
    assert f"case planted_0.3 stopped (exit 1); its output is in {store}/planted_0.3.log" in err


def test_a_choice_is_judged_on_the_rows_the_sweep_chose_and_stored_under_its_grid(
    tmp_path, monkeypatch, capsys
):
    """--choose: each case runs the sweep (run_case gets the grid and the rule); the case is
    scored on the chosen rows, records which setting each test window got, and is stored under
    its grid and rule, so another grid or rule computes it again."""
    calls = []

    def fake_sweep(cfg, overrides, choose, rule):
        calls.append((tuple(choose), rule))
        fold_setting = {0: 1, 1: 0, 2: 1}  # the setting chosen on each fold's validation tail
        return [
            _row(100.0 * fold, 1, fold, s, path=None, momentum=0.0)
            | {"setting": fold_setting[fold]}
            for fold in range(3)
            for s in range(2)
        ]

    monkeypatch.setattr(learning, "run_case", fake_sweep)
    scale = learning.SMALL._replace(
        cases=("martingale",), paths=(100,), choose=("train.act_risk=1,0.5",), rule="lcb"
    )
    (row,) = learning.run(scale, store=tmp_path)
    assert calls == [(("train.act_risk=1,0.5",), "lcb")]
    assert row["runs"] == 6 and row["net_usd"]["median"] == 100.0
    assert row["choice"] == {
        "settings": [{"train.act_risk": "1"}, {"train.act_risk": "0.5"}],
        "rule": "lcb",
        "chosen": [[100, 0, 1], [100, 1, 0], [100, 2, 1]],
    }
    table = learning.format_choices([row])
    assert "| martingale | train.act_risk=1 | 1 |" in table
    assert "| martingale | train.act_risk=0.5 | 2 |" in table
    learning.run(scale, store=tmp_path)
    assert len(calls) == 1  # reused
    learning.run(scale._replace(rule="median"), store=tmp_path)
    learning.run(scale._replace(choose=("train.act_risk=1,0.25",)), store=tmp_path)
    assert len(calls) == 3
    learning.run(scale._replace(choose=()), store=tmp_path)  # the profile's one setting
    assert calls[-1] == ((), "lcb") and len(calls) == 4


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU variant")
def test_a_choice_runs_the_sweep_and_each_fold_s_seeds_share_its_setting(tmp_path):
    """run_case with a grid runs ``jdqn sweep``'s program for real (short windows, 2 seeds): one
    row per fold and seed, each with the setting its fold chose, scored like any case."""
    short = ["walkforward.train_bars=3000", "walkforward.test_bars=1000", "train.seeds=2"]
    short += ["data.synthetic_bars=7380", "data.synthetic_seed=5"]  # development path 5
    rows = learning.run_case(learning.SMALL.cfg, short, ["train.act_risk=0.5,0.25"], "median")
    assert sorted((r["fold"], r["seed"]) for r in rows) == [
        (f, s) for f in range(3) for s in (0, 1)
    ]
    chosen = learning.chosen_settings(rows)
    assert len(chosen) == 3 and all(setting in (0, 1) for _, _, setting in chosen)
    assert learning.score(rows)["runs"] == 6


def test_comparing_settings_on_evaluation_paths_is_called_out(capsys, monkeypatch):
    monkeypatch.setattr(learning, "run", lambda *_, **__: [])
    monkeypatch.setattr(learning, "format_table", lambda _: "")
    monkeypatch.setattr(learning, "format_baselines", lambda _: "")
    monkeypatch.setattr(learning, "format_paired", lambda _: "")
    assert learning.main(["--small", "--versus", "train.epochs=3"]) == 0
    assert "choose settings on --paths development" in capsys.readouterr().err
    assert learning.main(["--small", "--versus", "train.epochs=3", "--paths", "development"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_the_yardstick_judges_the_baselines_without_training(monkeypatch):
    """The bar to reach, from the baselines alone: on a martingale the informed rule and the
    causal bound are 0 (no drift); on planted momentum both are positive."""
    monkeypatch.setattr(learning, "run_case", lambda *_: pytest.fail("nothing may train"))
    rows = learning.yardstick(learning.SMALL)
    martingale, planted = (r["median_net_usd"] for r in rows)
    assert martingale["informed"] == 0.0 and martingale["causal bound"] == 0.0
    assert planted["informed"] > 0.0 and planted["causal bound"] > 0.0
    assert all(r["windows"] == 3 and r["best_baseline"] in learning.TUNED_BASELINES for r in rows)
    assert "| planted_0.3 | 3 |" in learning.format_yardstick(rows)


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU variant")
def test_the_cpu_variant_scores_every_case_against_the_best_baseline(tmp_path, monkeypatch):
    """What ``jdqn bench --only learning`` runs on a CPU, on windows a quarter as long: every
    case scored on its evaluation path with a best tuned baseline, the informed rule's bound on
    synthetic data, stored. (Whether the agent learns at SMALL's windows is
    tests/run/test_walkforward.py's learning tests' question.)"""
    from jdqn.config import apply_overrides

    short = ["walkforward.train_bars=5000", "walkforward.test_bars=1500"]
    short += ["data.synthetic_bars=10880"]  # 5,000 + 1,380 + 3 x 1,500, as SMALL's
    monkeypatch.setattr(learning, "SMALL", learning.SMALL._replace(overrides=tuple(short)))
    cfg = apply_overrides(learning.SMALL.cfg, [f"output.out_dir={tmp_path}"])
    result = learning.section(quick=True, cfg=cfg)
    assert result["small"] and [r["case"] for r in result["rows"]] == list(learning.SMALL.cases)
    for row in result["rows"]:
        assert row["runs"] == 3 * learning.SMALL.seeds and row["halted"] == 0
        assert row["best_baseline"] in learning.TUNED_BASELINES
        assert row["net_usd"]["few_seeds"] and row["causal_bound_usd"] is not None
    store = tmp_path / "learning_scorecard"
    assert sorted(p.name for p in store.iterdir()) == [f"{c}.json" for c in learning.SMALL.cases]
