"""One bar loader for every consumer (issue 48): a run records how it read its bars, and
``jdqn evaluate`` on the run's own test window reads it the same way and gives back the agent's
and the untuned baselines' numbers, for UTC timestamps, naive ones read with data.timezone,
renamed columns and another calendar; how bars were read, their interval and gaps; the purge
given in time or following the data's interval."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from es_sample import ES_SAMPLE

from jdqn.cli import main
from jdqn.config import SMOKETEST, apply_overrides
from jdqn.data import Bars, prepare_walkforward, read_bars
from jdqn.data.intervals import describe_reading, reading_lines, resolve_purge
from jdqn.evaluation.policy import load_policy
from jdqn.run.walkforward import run_walkforward

# One fold of 300 train / 60 purge / 150 test bars, one seed, a network that compiles fast.
TINY = [
    "walkforward.n_folds=1",
    "walkforward.train_bars=300",
    "walkforward.test_bars=150",
    "walkforward.purge_bars=60",
    "train.n_slices=8",
    "train.batch_size=8",
    "replay.capacity=16",
    "train.epochs=1",
    "train.seeds=1",
    "network.hidden=[8]",
    "network.n_atoms=11",
    "network.v_min=-10",
    "network.v_max=10",
    "output.tensorboard=false",
    "output.checkpoints=false",
    "output.plots=false",
    "output.compilation_cache=false",
    # plain values, gamma 0.9 and raw returns only: the comparison below needs an agent that
    # trades, and a one-epoch agent of the profile sits these bars out
    "network.post_trade_values=false",
    "loss.gamma=0.9",
    "data.scaled_returns=false",
]
UNTUNED = ("flat", "buy_and_hold", "random")


def _es_in_utc() -> pd.DataFrame:
    """The ES sample (naive Chicago time) with its instants written in UTC."""
    frame = pd.read_csv(ES_SAMPLE)
    stamps = pd.to_datetime(frame["timestamp"]).dt.tz_localize("America/Chicago")
    return frame.assign(timestamp=stamps.dt.tz_convert("UTC"))


# (file layout, run settings): ISO timestamps with "Z", a renamed time column and the FX
# calendar (New York); naive UTC timestamps read with data.timezone=UTC.
CASES = {
    "z_suffix_renamed_fx_calendar": (
        lambda f: f.assign(timestamp=f.timestamp.dt.strftime("%Y-%m-%dT%H:%M:%SZ")).rename(
            columns={"timestamp": "Datum", "close": "Schluss"}
        ),
        ["data.columns=timestamp:Datum,close:Schluss", "data.calendar=fx_24x5"],
    ),
    "naive_utc": (
        lambda f: f.assign(timestamp=f.timestamp.dt.strftime("%Y-%m-%d %H:%M:%S")),
        ["data.timezone=UTC"],
    ),
}


@pytest.fixture(scope="module", params=list(CASES))
def case_run(request, tmp_path_factory):
    layout, settings = CASES[request.param]
    tmp = tmp_path_factory.mktemp(request.param)
    frame = layout(_es_in_utc())
    frame.to_csv(tmp / "bars.csv", index=False)
    cfg = apply_overrides(
        SMOKETEST, [f"data.path={tmp / 'bars.csv'}", f"output.out_dir={tmp}", *TINY, *settings]
    )
    lines: list[str] = []
    outcome = run_walkforward(cfg, progress=False, name="run", log=lines.append)
    return request.param, frame, outcome, tmp, lines


@pytest.mark.slow
def test_evaluate_reads_the_runs_bars_as_the_run_did(case_run, capsys):
    name, frame, outcome, tmp, lines = case_run
    results = outcome.results
    (row,) = results["folds"]
    start, end = row["window"]["test"]
    warmup = load_policy(outcome.run_dir).warmup_bars
    frame.iloc[start - warmup : end].to_csv(tmp / "window.csv", index=False)
    argv = ["evaluate", str(outcome.run_dir), "--data", str(tmp / "window.csv")]
    assert main([*argv, "--out", str(tmp / "ev")]) == 0
    (out_dir,) = (tmp / "ev").iterdir()
    (mine,) = json.loads((out_dir / "results.json").read_text())["folds"]
    assert mine["agent"] == row["agent"] and mine["agent"]["n_trades"] > 0
    for baseline in UNTUNED:
        assert mine["baselines"][baseline] == row["baselines"][baseline]
    assert mine["window"]["test_time"] == row["window"]["test_time"]
    # The run recorded how it read its bars.
    recorded = results["bars"]
    assert recorded["interval_seconds"] == 60.0 and recorded["instrument"] == "ES"
    assert f"jdqn: timestamps: {recorded['timezone']}" in lines  # the run's first lines say it
    if name == "naive_utc":
        assert recorded["timezone"] == "UTC (data.timezone)"
        assert recorded["calendar"] == "cme_equity (America/Chicago)"
        # --set data.* overrides the run's reading: the window in Chicago time, read as such.
        chicago = frame.iloc[start - warmup : end].assign(
            timestamp=pd.read_csv(ES_SAMPLE)["timestamp"].iloc[start - warmup : end].to_numpy()
        )
        chicago.to_csv(tmp / "chicago.csv", index=False)
        argv = ["evaluate", str(outcome.run_dir), "--data", str(tmp / "chicago.csv")]
        zone = ["--set", "data.timezone=America/Chicago", "--out", str(tmp / "ev2")]
        assert main([*argv, *zone]) == 0
        (out_dir,) = (tmp / "ev2").iterdir()
        (again,) = json.loads((out_dir / "results.json").read_text())["folds"]
        assert again["agent"] == row["agent"]
        # The calendar and features are the policy's: refused in one line, nothing written.
        calendar = ["--set", "data.calendar=fx_24x5", "--out", str(tmp / "ev4")]
        assert main([*argv, *calendar]) == 2
        assert "evaluate changes only how the file is read" in capsys.readouterr().err
        assert not (tmp / "ev4").exists()
    else:
        assert recorded["timezone"].startswith("UTC (the file's offsets")
        assert recorded["columns"]["timestamp"] == "Datum"
        assert recorded["columns"]["close"] == "Schluss"
        assert recorded["calendar"] == "fx_24x5 (America/New_York)"
        # Read the old way (no column map, Chicago clock) the file is refused in one line.
        argv = [*argv, "--set", "data.columns=[]", "--out", str(tmp / "ev3")]
        assert main(argv) == 2
        assert "missing required column" in capsys.readouterr().err
        assert load_policy(outcome.run_dir).act(tmp / "window.csv")[-1] in (-1.0, 0.0, 1.0)


def _bars(stamps: list[str]) -> Bars:
    n = len(stamps)
    ones = np.ones(n)
    return Bars(np.array(stamps, "datetime64[ns]"), ones, ones, ones, ones, ones)


def test_interval_gaps_and_notices_by_hand():
    data = SMOKETEST.data  # cme_equity: trading days start at 17:00 Chicago
    hourly = _bars(["2020-01-06T09", "2020-01-06T10", "2020-01-06T11", "2020-01-06T13"])
    reading = describe_reading(hourly, data, "ES")
    assert reading["interval_seconds"] == 3600.0 and "notice" not in reading
    gaps = {"count": 1, "longest_seconds": 7200.0, "after": "2020-01-06T11:00:00"}
    assert reading["gaps"] == gaps
    lines = reading_lines(reading)
    assert "calendar cme_equity (America/Chicago), instrument ES, bar interval 1 h" in lines
    assert "gaps within trading days: 1 (longest 2 h after 2020-01-06T11:00:00)" in lines
    # Steps of 1, 2, 3, 5 and 7 minutes: a median of 3, which one step in five is.
    start = np.datetime64("2020-01-06T09:00")
    minutes = np.cumsum([0, 1, 2, 3, 5, 7])
    irregular = _bars([str(start + np.timedelta64(int(m), "m")) for m in minutes])
    assert describe_reading(irregular, data, "ES")["notice"].startswith(
        "irregular bars: 20% of the steps within a trading day are the median 3 min"
    )
    daily = describe_reading(_bars([f"2020-01-0{d}" for d in range(6, 10)]), data, "ES")
    assert daily["gaps"] == {"count": 0} and daily["notice"].startswith("daily (or coarser)")


@pytest.mark.parametrize(
    ("stamps", "settings", "purge"),
    [
        (["2020-01-06T09:00", "2020-01-06T09:01"], [], 1_380),  # 1-minute bars: as before
        (["2020-01-06T09", "2020-01-06T10"], [], 23),  # the default follows: 23 h of bars
        (["2020-01-06", "2020-01-07"], [], 10),  # one day, raised to the feature lookback
        (["2020-01-06T09:00", "2020-01-06T09:05"], ["walkforward.purge_time=90min"], 18),
        (["2020-01-06T09:00", "2020-01-06T09:05"], ["walkforward.purge_time=10h"], 120),
        (["2020-01-06T09", "2020-01-06T10"], ["walkforward.purge_bars=100"], 100),  # explicit
    ],
)
def test_the_purge_follows_the_interval_or_a_time(stamps, settings, purge):
    lookback_10 = ["data.return_horizons=[1,5]", "data.volume_window=10"]
    cfg = apply_overrides(SMOKETEST, [*lookback_10, *settings])
    assert resolve_purge(cfg, _bars(stamps)).walkforward.purge_bars == purge


def test_a_run_and_data_check_say_how_the_bars_were_read(tmp_path, capsys):
    # Hourly UTC bars: the purge follows the interval in the run's fold layout, and both the
    # run's first lines and data check name the zone, interval, calendar and gaps.
    frame = _es_in_utc().iloc[::60].reset_index(drop=True)
    frame = frame.assign(timestamp=frame.timestamp.dt.strftime("%Y-%m-%d %H:%M:%S"))
    frame.to_csv(tmp_path / "hourly.csv", index=False)
    cfg = apply_overrides(
        SMOKETEST,
        [
            f"data.path={tmp_path / 'hourly.csv'}",
            "data.timezone=UTC",
            "data.return_horizons=[1,2]",
            "data.volume_window=3",
            "walkforward.n_folds=1",
            "walkforward.train_bars=10",
            "walkforward.test_bars=4",
            "train.n_slices=2",
            "train.batch_size=2",
            "replay.capacity=4",
        ],
    )
    data = prepare_walkforward(read_bars(cfg.data, tmp_path / "hourly.csv"), cfg)
    fold = data.folds[0]
    assert data.walkforward.purge_bars == 23 and fold.test_start - fold.train_end == 23
    assert main(["data", "check", str(tmp_path / "hourly.csv"), "--set", "data.timezone=UTC"]) == 0
    out = capsys.readouterr().out
    for expected in (
        "timestamps: UTC (data.timezone)",
        "calendar cme_equity (America/Chicago), instrument ES, bar interval 1 h",
        "gaps within trading days: ",
    ):
        assert expected in out
    lines = reading_lines(data.reading)
    assert "walk-forward purge: 23 bars" in lines and "timestamps: UTC (data.timezone)" in lines
