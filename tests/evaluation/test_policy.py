"""Saved policies (issue 35): bundles in the run directory, ``load_policy``, ``act`` and ``q``
reproduce the walk-forward's greedy test-window actions; ``jdqn evaluate`` on the run's own test
window reproduces its results."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest
from es_sample import ES_SAMPLE

import jdqn
from jdqn.agent.networks import param_layout
from jdqn.cli import main
from jdqn.config import SMOKETEST, apply_overrides
from jdqn.data import load_bars, prepare_walkforward
from jdqn.data.calendars import CALENDARS
from jdqn.evaluation import policy as policy_module
from jdqn.evaluation import policy_bundle
from jdqn.evaluation.policy import PolicyError, load_policy, saved_policies
from jdqn.evaluation.saved import evaluate_saved
from jdqn.run import report, rundir, termination
from jdqn.run.walkforward import run_walkforward

# Two rolling folds of 300 train / 60 purge / 150 test bars of the real ES sample, two seeds, a
# network small enough to compile fast.
TINY_RUN = [
    f"data.path={ES_SAMPLE}",
    "walkforward.n_folds=2",
    "walkforward.train_bars=300",
    "walkforward.test_bars=150",
    "walkforward.purge_bars=60",
    "train.n_slices=8",
    "train.batch_size=8",
    "replay.capacity=16",
    "train.epochs=1",
    "train.seeds=2",
    "network.hidden=[8]",
    "network.n_atoms=11",
    "network.v_min=-10",
    "network.v_max=10",
    "output.tensorboard=false",
    "output.checkpoints=false",
    "output.plots=false",  # drawn by the evaluate test (and the walk-forward tests)
    "output.compilation_cache=false",
    "output.settings_tried=3",  # as a sweep of three settings reports it
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    cfg = apply_overrides(SMOKETEST, [f"output.out_dir={out}", *TINY_RUN])
    outcome = run_walkforward(cfg, progress=False, name="tiny", log=lambda _: None)
    assert not outcome.halted
    return outcome


def _curve(run_dir: Path, fold: int, seed: int) -> pd.DataFrame:
    return pd.read_csv(run_dir / "curves" / f"fold{fold}_seed{seed}_equity.csv")


@pytest.mark.slow
def test_every_run_saves_a_bundle_in_the_documented_format(tiny_run):
    run_dir = tiny_run.run_dir
    assert saved_policies(run_dir) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    bundle = run_dir / "policies" / "fold1_seed0"
    meta = json.loads((bundle / "policy.json").read_text())
    assert (meta["format"], meta["version"], meta["fold"], meta["seed"]) == ("jdqn-policy", 2, 1, 0)
    row = tiny_run.results["folds"][2]
    assert meta["window"] == row["window"]
    assert meta["config"] == tiny_run.results["config"]
    assert meta["instrument"]["tick_size"] == 0.25 and meta["instrument"]["bar_seconds"] == 60
    assert meta["features"]["lookback_bars"] == 60 and "ret_60" in meta["features"]["names"]
    cfg = jdqn.Config.from_dict(meta["config"])
    n_features = len(meta["features"]["names"])
    layout = param_layout(cfg, n_features + 1)
    assert meta["param_layout"] == layout.record()
    with np.load(bundle / "arrays.npz") as arrays:
        assert arrays["params/torso_0/kernel"].shape == (n_features + 1, 8)
        assert arrays["params/head/kernel"].shape == (3 * 11, 8)  # [out, in]
        assert arrays["masks/head/bias"].shape == (3 * 11,)
        assert arrays["sn_u/torso_0"].shape == (8,)
        assert arrays["normaliser/mean"].shape == (n_features,)
        assert np.all(arrays["normaliser/std"] > 0)
        # The seeds trained apart: their parameters differ.
        other = np.load(run_dir / "policies" / "fold1_seed1" / "arrays.npz")
        assert not np.array_equal(arrays["params/torso_0/kernel"], other["params/torso_0/kernel"])
    assert not list((run_dir / "policies").glob(".*"))  # no staging directory left


@pytest.mark.slow
def test_act_reproduces_the_walk_forward_test_actions(tiny_run):
    bars = load_bars(ES_SAMPLE)
    for row in tiny_run.results["folds"]:
        policy = load_policy(tiny_run.run_dir, row["fold"], row["seed"])
        start, end = row["window"]["test"]
        positions = policy.act(bars, start=start)
        assert positions.shape == (len(bars),)
        assert np.all(np.isnan(positions[:start]))
        expected = _curve(tiny_run.run_dir, row["fold"], row["seed"])["agent_position"]
        np.testing.assert_array_equal(positions[start : end - 1], expected.to_numpy())
        assert set(np.unique(positions[start:])) <= {-1.0, 0.0, 1.0}


@pytest.mark.slow
def test_act_on_the_test_window_with_only_its_warm_up_before_it(tiny_run):
    """Features need only the lookback: the window's own bars plus the warm-up act the same."""
    frame = pd.read_csv(ES_SAMPLE)
    row = tiny_run.results["folds"][1]  # fold 0, seed 1
    policy = load_policy(tiny_run.run_dir, 0, 1)
    start, end = row["window"]["test"]
    positions = policy.act(frame.iloc[start - policy.warmup_bars : end])
    assert np.all(np.isnan(positions[: policy.warmup_bars]))
    expected = _curve(tiny_run.run_dir, 0, 1)["agent_position"].to_numpy()
    np.testing.assert_array_equal(positions[policy.warmup_bars : -1], expected)
    # The last bar gets a decision too (the position to take now).
    assert not np.isnan(positions[-1])


@pytest.mark.slow
def test_the_readme_example_runs_as_written(tiny_run, tmp_path, monkeypatch):
    """The README's three lines, verbatim but for the paths."""
    frame = pd.read_csv(ES_SAMPLE).iloc[-400:]
    frame.to_csv(tmp_path / "new_bars.csv", index=False)
    (tmp_path / "runs").symlink_to(tiny_run.run_dir.parent)
    monkeypatch.chdir(tmp_path)
    example = (
        "import jdqn, pandas as pd\n"
        'policy = jdqn.load_policy("runs/tiny")  # the last fold, seed 0\n'
        'positions = policy.act(pd.read_csv("new_bars.csv"))  # contracts per bar\n'
    )
    scope: dict = {}
    exec(example, scope)
    positions = scope["positions"]
    assert scope["policy"].fold == 1 and scope["policy"].seed == 0
    assert positions.shape == (400,) and np.all(np.isnan(positions[:60]))
    assert np.all(np.isin(positions[60:], [-1.0, 0.0, 1.0]))


@pytest.mark.slow
def test_q_gives_the_distributions_act_chose_from(tiny_run):
    policy = load_policy(tiny_run.run_dir)
    frame = pd.read_csv(ES_SAMPLE).iloc[-200:]
    frame = frame.set_index(pd.to_datetime(frame.pop("timestamp")))  # a DatetimeIndex works too
    positions = policy.act(frame)
    probs = policy.q(frame)
    warm = policy.warmup_bars
    assert probs.shape == (200, 3, 11)
    assert np.all(np.isnan(probs[:warm]))
    np.testing.assert_allclose(probs[warm:].sum(-1), 1.0, atol=1e-5)
    expected = probs[warm:] @ policy.atoms  # [T, A]
    if policy.cfg.train.act_risk > 0:  # less act_risk standard deviations of each distribution
        spread = probs[warm:] * (policy.atoms - expected[..., None]) ** 2
        expected = expected - policy.cfg.train.act_risk * np.sqrt(spread.sum(-1))
    if policy.cfg.network.post_trade_values:  # less each trade's cost from the held position
        held = np.concatenate([[0.0], positions[warm:-1]])
        cost = policy.cfg.env.cost_points * policy.cfg.env.reward_scale
        expected = expected - cost * np.abs(policy.positions[None, :] - held[:, None])
    picked = policy.positions[np.argmax(expected, axis=-1)]
    margin = np.sort(expected, -1)[:, -1] - np.sort(expected, -1)[:, -2]
    clear = margin > 1e-5  # away from float32 ties
    np.testing.assert_array_equal(picked[clear], positions[warm:][clear])


def test_load_policy_errors_name_the_fix(tiny_run, tmp_path):
    with pytest.raises(PolicyError, match="no such run directory"):
        load_policy(tmp_path / "nope")
    with pytest.raises(PolicyError, match="no saved policies"):
        load_policy(tmp_path)
    with pytest.raises(PolicyError, match="fold 0 seed 0, fold 0 seed 1, fold 1 seed 0"):
        load_policy(tiny_run.run_dir, fold=2)
    with pytest.raises(PolicyError, match="start 500 is outside the 100 bars"):
        load_policy(tiny_run.run_dir).act(pd.read_csv(ES_SAMPLE).iloc[:100], start=500)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.iloc[::5], "300 s apart, the policy's training bars 60 s"),
        (lambda f: f.assign(**{c: f[c] * 4 for c in ("open", "high", "low", "close")}), "another"),
        (
            lambda f: f.assign(**{c: f[c] + 0.1 for c in ("open", "high", "low", "close")}),
            "off the policy's tick grid of 0.25",
        ),
        (lambda f: f.drop(columns="volume"), "the bars have no volume"),
    ],
)
def test_bars_of_another_instrument_or_features_are_refused(tiny_run, change, message):
    frame = pd.read_csv(ES_SAMPLE).iloc[-500:]
    with pytest.raises(PolicyError, match=message):
        load_policy(tiny_run.run_dir).act(change(frame))


def test_a_failed_save_leaves_no_bundle_and_no_staging_directory(tiny_run, tmp_path, monkeypatch):
    policy = load_policy(tiny_run.run_dir)

    def failing(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(policy_bundle.np, "savez", failing)
    with pytest.raises(OSError, match="disk full"):
        policy_bundle.save_policy(
            tmp_path,
            fold=0,
            seed=0,
            network=policy.network,
            normaliser=policy.normaliser,
            meta={},
        )
    assert list((tmp_path / "policies").iterdir()) == []


def test_results_carry_the_summary_across_seeds_and_the_stitched_curve(tiny_run):
    results, run_dir = tiny_run.results, tiny_run.run_dir
    summary = results["summary"]
    nets = [row["agent"]["net_pnl_usd"] for row in results["folds"]]
    overall = summary["overall"]["agent"]["net_pnl_usd"]
    assert overall["median"] == pytest.approx(np.median(nets)) and overall["n"] == 4
    assert overall["median_ci"][0] <= overall["median"] <= overall["median_ci"][1]
    fold1 = [row["agent"] for row in results["folds"] if row["fold"] == 1]
    by_fold = summary["folds"]["1"]["agent"]
    assert by_fold["sharpe"]["iqm"] == pytest.approx(np.mean([a["sharpe"] for a in fold1]))
    # A daily Sharpe ratio needs two trading days; a 150-bar window may lie inside one.
    daily = [a["sharpe_daily"] for a in fold1 if a["sharpe_daily"] is not None]
    assert by_fold["sharpe_daily"]["n"] == len(daily)
    flat = summary["overall"]["agent_minus"]["flat"]["net_pnl_usd"]
    assert flat["median"] == pytest.approx(np.median(nets))  # the flat baseline earns nothing
    dsr = summary["overall"]["deflated_sharpe"]
    assert 0.0 <= dsr["dsr"] <= 1.0 and dsr["n_trials"] == 3 * 2 and dsr["n_bars"] == 2 * 149
    assert summary["settings_tried"] == 3 and summary["few_seeds"]  # 2 seeds < 5
    assert all("sharpe_daily" in b for row in results["folds"] for b in row["baselines"].values())

    stitched = pd.read_csv(run_dir / "curves" / "stitched_equity.csv")
    assert len(stitched) == 2 * 149
    for seed in (0, 1):
        total = sum(r["agent"]["net_pnl_points"] for r in results["folds"] if r["seed"] == seed)
        assert stitched[f"seed{seed}_equity_points"].iloc[-1] == pytest.approx(total)
    both = stitched[["seed0_equity_points", "seed1_equity_points"]].to_numpy()
    np.testing.assert_allclose(stitched["agent_median_equity_points"], both.mean(axis=1))
    assert {"flat_equity_points", "buy_and_hold_equity_points"} <= set(stitched)
    table = report.summary_text(summary)
    assert "deflated Sharpe" in table and "agent - flat $" in table and "fold 1" in table
    assert "6 trials = 3 setting(s) x seeds" in table and "* from fewer than 5 seeds" in table
    assert "agent - random $" in report.summary_text(summary, show_random=True)


def _test_window_file(run_dir: Path, results: dict, fold: int, path: Path) -> Path:
    """The bars of a fold's test window with the features' warm-up before them."""
    start, end = next(r for r in results["folds"] if r["fold"] == fold)["window"]["test"]
    warmup = load_policy(run_dir, fold).warmup_bars
    pd.read_csv(ES_SAMPLE).iloc[start - warmup : end].to_csv(path, index=False)
    return path


@pytest.mark.slow
def test_evaluate_on_the_runs_own_test_window_gives_back_its_results(tiny_run, tmp_path, capsys):
    results, run_dir = tiny_run.results, tiny_run.run_dir
    bars = _test_window_file(run_dir, results, 1, tmp_path / "fold1.csv")
    assert main(["evaluate", str(run_dir), "--data", str(bars), "--out", str(tmp_path / "ev")]) == 0
    assert "deflated Sharpe" in capsys.readouterr().out
    (out_dir,) = (tmp_path / "ev").iterdir()
    evaluated = json.loads((out_dir / "results.json").read_text())
    expected = [r for r in results["folds"] if r["fold"] == 1]  # no --fold: the last fold
    assert [(r["fold"], r["seed"]) for r in evaluated["folds"]] == [(1, 0), (1, 1)]
    # evaluate judges the untuned baselines; momentum, MACD and ridge are tuned on a train
    # window, which new bars do not come with.
    untuned = {"flat", "buy_and_hold", "random"}
    for mine, theirs in zip(evaluated["folds"], expected, strict=True):
        assert mine["agent"] == theirs["agent"]
        assert set(mine["baselines"]) == untuned
        for name in untuned:  # the random one keyed as the run's
            assert mine["baselines"][name] == theirs["baselines"][name]
        assert mine["window"]["test_time"] == theirs["window"]["test_time"]
    mine_summary = evaluated["summary"]["folds"]["1"]
    their_summary = results["summary"]["folds"]["1"]
    for key in set(mine_summary) - {"agent_minus"}:
        assert mine_summary[key] == their_summary[key]
    for name in untuned:
        assert mine_summary["agent_minus"][name] == their_summary["agent_minus"][name]
    for name in ("curves/fold1_seed1_equity.csv", "curves/stitched_equity.csv"):
        assert (out_dir / name).is_file()
    for name in ("fold1_seed0_equity.png", "stitched_equity.png", "summary.png"):
        assert (out_dir / "plots" / name).stat().st_size > 1000
    own = _curve(run_dir, 1, 1)
    curve = pd.read_csv(out_dir / "curves" / "fold1_seed1_equity.csv")
    pd.testing.assert_frame_equal(curve, own[curve.columns])

    # An earlier fold through the API: its policies, its window, its numbers.
    bars = _test_window_file(run_dir, results, 0, tmp_path / "fold0.csv")
    outcome = evaluate_saved(run_dir, bars, fold=0, out=tmp_path, plots=False, log=lambda _: None)
    assert [r["agent"] for r in outcome.results["folds"]] == [
        r["agent"] for r in results["folds"] if r["fold"] == 0
    ]


@pytest.mark.slow
def test_evaluate_annualises_the_daily_sharpe_by_the_runs_calendar(tiny_run, tmp_path, monkeypatch):
    # The same saved policies on the same four days of bars, judged as runs of a 252-day and of
    # a 365-day calendar (as crypto's): the daily Sharpe is annualised by the run's calendar,
    # as the walk-forward annualises it, not by a fixed 252.
    bars = tmp_path / "days.csv"
    assert main(["data", "synth", "--bars", "6000", "--out", str(bars), "--seed", "3"]) == 0

    def judged(out: str) -> list[dict]:
        outcome = evaluate_saved(
            tiny_run.run_dir, bars, fold=0, out=tmp_path / out, plots=False, log=lambda _: None
        )
        rows = outcome.results["folds"]
        return [r["agent"] for r in rows] + [b for r in rows for b in r["baselines"].values()]

    calendar = CALENDARS["cme_equity"]
    usual = judged("usual")
    monkeypatch.setitem(
        CALENDARS, "cme_equity", dataclasses.replace(calendar, trading_days_per_year=365)
    )
    scale = math.sqrt(365 / calendar.trading_days_per_year)
    assert any(m["sharpe_daily"] for m in usual)  # several days, some spread
    for mine, theirs in zip(judged("crypto_days"), usual, strict=True):
        assert mine["sharpe_daily"] == pytest.approx(theirs["sharpe_daily"] * scale, rel=1e-9)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--fold", "5"], "no policy for fold 5 seed 0 .* fix: pick one of: fold 0 seed 0"),
        (["--every-fifth-bar"], "the bars are 300 s apart, the policy's training bars 60 s"),
        (["--short"], "61 bars, but the policies need 60 bars of feature warm-up"),
        (["--no-run"], "no such run directory"),
    ],
)
def test_evaluate_refuses_bad_input_in_one_line_and_writes_nothing(
    tiny_run, tmp_path, capsys, argv, message
):
    frame = pd.read_csv(ES_SAMPLE).iloc[-400:]
    if "--every-fifth-bar" in argv:
        frame = frame.iloc[::5]
    if "--short" in argv:
        frame = frame.iloc[:61]
    frame.to_csv(tmp_path / "bars.csv", index=False)
    run_dir = tmp_path / "missing" if "--no-run" in argv else tiny_run.run_dir
    flags = [a for a in argv if a.startswith("--fold") or a.isdigit()]
    out = tmp_path / "ev"
    command = ["evaluate", str(run_dir), "--data", str(tmp_path / "bars.csv"), "--out", str(out)]
    assert main([*command, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jdqn: error: ") and err.count("\n") == 1
    assert re.search(message, err)
    assert not out.exists()


def test_a_growing_feed_acts_causally_and_compiles_once(tiny_run):
    """The decision at a bar never changes when later bars arrive (past-only features, a
    sequential pass), and bars arriving one at a time reuse one compiled pass."""
    policy = load_policy(tiny_run.run_dir)
    frame = pd.read_csv(ES_SAMPLE).iloc[-300:]
    full = policy.act(frame)
    compiled = policy_module._greedy_rollout._cache_size()
    for n in (290, 291, 292, 297):
        np.testing.assert_array_equal(policy.act(frame.iloc[:n]), full[:n])
    assert policy_module._greedy_rollout._cache_size() == compiled


def test_bundles_hold_each_runs_parameter_tree_and_halted_runs_save_none(tiny_run, tmp_path):
    """The learner state's trees (leaves [R, ...]) give each run's own tree in its bundle; a
    halted run saves no bundle."""
    cfg = jdqn.Config.from_dict(tiny_run.results["config"])
    data = prepare_walkforward(load_bars(ES_SAMPLE), cfg)
    saved = [load_policy(tiny_run.run_dir, 1, seed) for seed in (0, 1)]
    layout = param_layout(cfg, data.n_features + 1)

    def stacked(trees):
        return jax.tree.map(lambda *leaves: np.stack([np.asarray(x) for x in leaves]), *trees)

    network = stacked([p.network for p in saved])
    rows = [dict(r) for r in tiny_run.results["folds"] if r["fold"] == 1]
    rows[0]["status"] = "halted: loss at epoch 1 step 3"
    runs = [(1, 0), (1, 1)]
    policy_bundle.save_run_policies(tmp_path, cfg, data, layout, network, runs, rows, lambda f: f())
    assert saved_policies(tmp_path) == [(1, 1)]
    again = load_policy(tmp_path, 1, 1)
    for a, b in zip(jax.tree.leaves(again.network), jax.tree.leaves(saved[1].network), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(again.normaliser.mean, saved[1].normaliser.mean)
    assert again.meta == saved[1].meta


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["as its directory is made", "while it writes"])
def test_a_sigterm_during_evaluate_ends_it_as_ctrl_c_and_leaves_nothing(
    tiny_run, tmp_path, monkeypatch, moment
):
    """Case EV-T: without the walk-forward's handling, SIGTERM killed `jdqn evaluate` by the
    signal and left `eval-*.incomplete`; a signal held while the directory is made was raised
    after it, outside the clean-up."""
    bars = _test_window_file(tiny_run.run_dir, tiny_run.results, 1, tmp_path / "fold1.csv")
    module, name = (rundir, "new_run_dir") if moment.startswith("as") else (report, "plot_equity")
    original = getattr(module, name)

    sent = []

    def signalled(*args, **kwargs):
        if not sent:  # one SIGTERM, as a scheduler sends (a plot is drawn per seed)
            sent.append(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, signalled)
    out = tmp_path / "ev"
    with pytest.raises(termination.Terminated):
        evaluate_saved(tiny_run.run_dir, bars, out=out, log=lambda _: None)
    assert list(out.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.slow
def test_a_stop_that_leaves_the_writes_block_before_its_wait_still_leaves_nothing(
    tiny_run, tmp_path, monkeypatch
):
    """Case EV-T at its narrowest (CI, 2026-12-06): a SIGTERM handled on the first line of
    ``BackgroundWrites.__exit__`` leaves it before its wait, and a plot written after the
    directory's removal made it again (a plot makes its parent directory)."""
    bars = _test_window_file(tiny_run.run_dir, tiny_run.results, 1, tmp_path / "fold1.csv")
    slow_plot, drawn = _slow_plot()

    def stopped_on_entry(self, *exc_info):
        raise termination.Terminated

    monkeypatch.setattr(report, "plot_equity", slow_plot)
    monkeypatch.setattr(report.BackgroundWrites, "__exit__", stopped_on_entry)
    out = tmp_path / "ev"
    with pytest.raises(termination.Terminated):
        evaluate_saved(tiny_run.run_dir, bars, out=out, log=lambda _: None)
    assert drawn.wait(60)  # a plot left running would have made the directory again by now
    time.sleep(0.2)
    assert list(out.iterdir()) == []


@pytest.mark.slow
def test_a_stop_while_the_writer_thread_starts_still_waits_for_its_plot(
    tiny_run, tmp_path, monkeypatch
):
    """Case EV-T as CI met it (2026-12-06, three runs): the first plot's SIGTERM was handled in
    the main thread inside ``Thread.start`` of the writer thread, before the pool records the
    thread, so the clean-up's wait did not join it and the plot made the directory again."""
    bars = _test_window_file(tiny_run.run_dir, tiny_run.results, 1, tmp_path / "fold1.csv")
    slow_plot, drawn = _slow_plot()

    start = threading.Thread.start

    def start_then_stop(thread):
        start(thread)
        if thread.name.startswith("jdqn-writes"):
            signal.raise_signal(signal.SIGTERM)  # handled here, before start() returns

    monkeypatch.setattr(report, "plot_equity", slow_plot)
    monkeypatch.setattr(threading.Thread, "start", start_then_stop)
    out = tmp_path / "ev"
    with pytest.raises(termination.Terminated):
        evaluate_saved(tiny_run.run_dir, bars, out=out, log=lambda _: None)
    assert drawn.wait(60)  # a plot left running would have made the directory again by now
    time.sleep(0.2)
    assert list(out.iterdir()) == []


def _slow_plot():
    """``report.plot_equity`` slowed so that it is still drawing when a stop reaches the
    clean-up, and the event it sets when done."""
    plot, drawn = report.plot_equity, threading.Event()

    def slow_plot(*args, **kwargs):
        time.sleep(0.3)
        try:
            return plot(*args, **kwargs)
        finally:
            drawn.set()

    return slow_plot, drawn


def _forge(bundle: Path, arrays: dict[str, np.ndarray] | None = None, **meta) -> None:
    """Rewrite a bundle's arrays or policy.json and its manifest's digests to match, as a
    consistent but wrong bundle (the checks beyond the digests must catch it)."""
    if arrays is not None:
        np.savez(bundle / "arrays.npz", **arrays)
    if meta:
        record = json.loads((bundle / "policy.json").read_text())
        (bundle / "policy.json").write_text(json.dumps({**record, **meta}))
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["sha256"] = {n: policy_bundle._sha256(bundle / n) for n in manifest["sha256"]}
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def _arrays(bundle: Path, change) -> dict[str, np.ndarray]:
    with np.load(bundle / "arrays.npz") as stored:
        return change({name: stored[name] for name in stored.files})


def _swap(a: Path, b: Path) -> None:
    a.rename(a.with_name("swap"))
    b.rename(a)
    a.with_name("swap").rename(b)


def _flip(path: Path, truncate: bool = False) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(x ^ 0xFF for x in data[middle : middle + 16])
    path.write_bytes(bytes(data[:middle] if truncate else data))


def _set_nan_bias(arrays):
    arrays["params/head/bias"] = np.full_like(arrays["params/head/bias"], np.nan)
    return arrays


def _zero_std(arrays):
    arrays["normaliser/std"] = np.zeros_like(arrays["normaliser/std"])
    return arrays


POLICY_DAMAGE = {  # (case id, damage to run/policies, message of the refusal)
    "P1-flipped": (lambda p: _flip(p / "fold1_seed0/arrays.npz"), "does not match its SHA-256"),
    "P2-truncated": (
        lambda p: _flip(p / "fold1_seed0/arrays.npz", truncate=True),
        "does not match its SHA-256",
    ),
    "P5-no-policy-json": (
        lambda p: (p / "fold1_seed0/policy.json").unlink(),
        "fold1_seed0: not a readable policy bundle",
    ),
    "P6-arrays-swapped": (
        lambda p: _swap(p / "fold0_seed0/arrays.npz", p / "fold1_seed0/arrays.npz"),
        "fold1_seed0/arrays.npz does not match",
    ),
    "P7-hidden-changed": (
        lambda p: _forge(p / "fold1_seed0", config={**_config(p), "network": _hidden(p, [32, 32])}),
        "not the network its policy.json describes",
    ),
    "P9-nan-bias": (
        lambda p: _forge(p / "fold1_seed0", _arrays(p / "fold1_seed0", _set_nan_bias)),
        "params/head/bias holds NaN",
    ),
    "P10-zero-std": (
        lambda p: _forge(p / "fold1_seed0", _arrays(p / "fold1_seed0", _zero_std)),
        "normaliser/std is missing or not positive",
    ),
    "P12-leaf-missing": (
        lambda p: _forge(
            p / "fold1_seed0",
            _arrays(
                p / "fold1_seed0", lambda a: {k: v for k, v in a.items() if k != "masks/head/bias"}
            ),
        ),
        "its masks are not the network",
    ),
    "P14-bundles-swapped": (
        lambda p: _swap(p / "fold0_seed0", p / "fold1_seed0"),
        "fold1_seed0 holds the policy of fold 0 seed 0",
    ),
}


def _config(policies: Path) -> dict:
    return json.loads((policies / "fold1_seed0/policy.json").read_text())["config"]


def _hidden(policies: Path, hidden: list[int]) -> dict:
    return {**_config(policies)["network"], "hidden": hidden}


@pytest.mark.parametrize("case", POLICY_DAMAGE)
def test_a_damaged_or_swapped_bundle_is_refused_in_one_line(tiny_run, tmp_path, capsys, case):
    """Issue 49 item 4: load_policy and jdqn evaluate verify the manifest and the values, and
    never fall back to another fold (the default fold is the run's last, fold 1)."""
    run = tmp_path / "tiny"
    shutil.copytree(tiny_run.run_dir, run)
    damage, message = POLICY_DAMAGE[case]
    damage(run / "policies")
    with pytest.raises(PolicyError, match=re.escape(message)):
        load_policy(run)
    frame = pd.read_csv(ES_SAMPLE).iloc[-400:]
    frame.to_csv(tmp_path / "bars.csv", index=False)
    out = tmp_path / "ev"
    command = ["evaluate", str(run), "--data", str(tmp_path / "bars.csv"), "--out", str(out)]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.startswith("jdqn: error: ") and err.count("\n") == 1 and message in err, err
    assert not out.exists()
    load_policy(run, fold=0, seed=1)  # the untouched bundles still load


def test_evaluate_refuses_an_unfinished_run(tiny_run, tmp_path, capsys):
    """E01: an .incomplete run (no results.json) is refused before anything is written."""
    run = tmp_path / "inc.incomplete"
    shutil.copytree(tiny_run.run_dir, run)
    (run / "results.json").unlink()
    shutil.rmtree(run / "policies" / "fold1_seed0")
    command = ["evaluate", str(run), "--data", str(ES_SAMPLE)]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "an unfinished run (no results.json)" in err, err
    assert not (run / "evaluations").exists()
