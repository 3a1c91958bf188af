"""scripts/choose_default.py: its rule on hand-made sweep rows (the sweeps themselves are
``jdqn sweep``'s, tested in tests/run/test_sweep.py)."""

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from jdqn import bench

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "choose_default.py"
_SPEC = importlib.util.spec_from_file_location("choose_default", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
choose_default = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(choose_default)


def _row(net: float, exposure: float, trades: int, status: str = "ok") -> dict[str, str]:
    return {"validation_status": status, "validation_net_pnl_usd": str(net),
            "validation_exposure": str(exposure), "validation_n_trades": str(trades),
            "validation_n_bars": "6000"}  # fmt: skip


def test_summarise_counts_halted_runs_as_failures() -> None:
    rows = [_row(100.0, 0.0, 0), _row(-2_000.0, 0.5, 30), _row(0.0, 0.0, 0, status="halted")]
    summary = choose_default.summarise(rows)
    assert summary["runs"] == 3
    assert summary["net_usd"] == pytest.approx(-950.0)
    assert summary["exposure"] == pytest.approx(0.25)
    assert summary["changes_per_bar"] == pytest.approx(15 / 6000)
    # -2,000 over 6,000 bars is -4,000 per 12,000: outside the band; the halted run fails it
    assert summary["share_within_flat_band"] == pytest.approx(1 / 3)


def test_summarise_reads_the_test_windows_when_asked() -> None:
    rows = [{k.replace("validation_", "test_"): v for k, v in _row(300.0, 0.1, 2).items()}]
    rows[0] |= _row(-1.0, 0.9, 50)  # the validation columns of the same runs
    assert choose_default.summarise(rows, "test")["net_usd"] == pytest.approx(300.0)
    assert choose_default.summarise(rows, "test")["exposure"] == pytest.approx(0.1)
    assert choose_default.summarise(rows)["net_usd"] == pytest.approx(-1.0)


def _case(net: float, exposure: float, within_band: float = 1.0) -> dict[str, float]:
    return {"net_usd": net, "exposure": exposure, "share_within_flat_band": within_band}


def test_choose_takes_the_best_planted_net_among_settings_that_sit_out() -> None:
    table = {
        ("a",): {"planted_0.3": _case(9_000.0, 0.9), "martingale": _case(0.0, 0.60)},
        ("b",): {"planted_0.3": _case(5_000.0, 0.5), "martingale": _case(0.0, 0.08)},
        ("c",): {"planted_0.3": _case(4_000.0, 0.5), "martingale": _case(0.0, 0.00)},
    }
    assert choose_default.choose(table) == ("b",)
    table[("b",)]["planted_0.3"]["net_usd"] = 0.0  # a net of 0 still beats a loss
    table[("c",)]["planted_0.3"]["net_usd"] = -500.0
    table[("c",)]["martingale"]["exposure"] = 0.08
    assert choose_default.choose(table) == ("b",)
    table[("b",)]["planted_0.3"]["net_usd"] = None  # every run halted
    assert choose_default.choose(table) == ("c",)
    table[("c",)]["martingale"]["exposure"] = 0.0
    # none sits out: the lowest martingale exposure decides which settings are eligible
    for cases in table.values():
        cases["martingale"]["exposure"] += 0.5
    assert choose_default.choose(table) == ("c",)


def test_choose_judges_each_setting_by_its_worst_martingale_path() -> None:
    table = {
        ("blend",): {
            "planted_0.3": _case(23_940.0, 0.75),
            "martingale": _case(0.0, 0.0),
            "martingale_0": _case(0.0, 0.0),
        },
        ("mse",): {
            "planted_0.3": _case(27_567.0, 0.95),
            "martingale": _case(0.0, 0.0),
            "martingale_0": _case(0.0, 0.18),  # sat out path 1, not path 0
        },
    }
    assert choose_default.choose(table) == ("blend",)
    del table[("blend",)]["martingale_0"], table[("mse",)]["martingale_0"]
    assert choose_default.choose(table) == ("mse",)  # on path 1 alone both sit out
    # sitting out is also staying within the flat band: 92 % of seed-folds there is not enough
    table[("mse",)]["martingale"]["share_within_flat_band"] = 0.92
    assert choose_default.choose(table) == ("blend",)


def test_case_flags_name_one_martingale_a_path() -> None:
    flags = choose_default.case_flags(1, (0, 1, 2))
    assert list(flags) == ["planted_0.3", "martingale", "martingale_0", "martingale_2", "es_sample"]
    assert flags["martingale_0"][-1] == "--set=data.synthetic_seed=0"
    assert list(choose_default.case_flags(1)) == ["planted_0.3", "martingale", "es_sample"]


def test_an_evaluation_or_unreadable_martingale_path_is_refused_before_anything_is_written(
    tmp_path, monkeypatch, capsys
) -> None:
    out = tmp_path / "choice"
    argv = ["choose_default.py", "--out", str(out), "--martingale-paths", "0,100"]
    monkeypatch.setattr("sys.argv", argv)
    assert choose_default.main() == 2
    assert capsys.readouterr().out.startswith("path 100 is an evaluation path; fix:")
    monkeypatch.setattr("sys.argv", [*argv[:-1], "0,a"])
    with pytest.raises(SystemExit) as exited:
        choose_default.main()
    assert exited.value.code == 2
    assert "--martingale-paths: invalid paths value: '0,a'" in capsys.readouterr().err
    assert not out.exists()


def test_several_edges_rank_by_the_sum_of_their_nets() -> None:
    edges = ("planted_0.3", "cost_2x")
    table = {
        ("a",): {"planted_0.3": _case(9_000.0, 0.9), "cost_2x": _case(1_000.0, 0.2)},
        ("b",): {"planted_0.3": _case(8_000.0, 0.9), "cost_2x": _case(3_000.0, 0.4)},
    }
    for cases in table.values():
        cases["martingale"] = _case(0.0, 0.0)
    assert choose_default.choose(table) == ("a",)  # planted 0.3 alone
    assert choose_default.choose(table, edges) == ("b",)
    table[("b",)]["cost_2x"]["net_usd"] = None  # every run of one edge halted: last
    assert choose_default.choose(table, edges) == ("a",)
    flags = choose_default.case_flags(1, (0,), edges)
    assert list(flags) == ["planted_0.3", "cost_2x", "martingale", "martingale_0", "es_sample"]
    assert "--set=env.slippage_ticks=2.0" in flags["cost_2x"]
    assert flags["cost_2x"][-1] == "--set=data.synthetic_seed=1"


def test_an_edge_that_is_no_edge_case_is_refused(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "choice"
    for bad in ("planted_0.3,martingale", "planted_9", ","):
        monkeypatch.setattr("sys.argv", ["choose_default.py", "--out", str(out), "--edges", bad])
        with pytest.raises(SystemExit) as exited:
            choose_default.main()
        assert exited.value.code == 2
        assert "--edges: invalid edges value" in capsys.readouterr().err
    assert not out.exists()


def test_jobs_below_one_are_refused(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(
        "sys.argv", ["choose_default.py", "--out", str(tmp_path / "c"), "--jobs", "0"]
    )
    with pytest.raises(SystemExit) as exited:
        choose_default.main()
    assert exited.value.code == 2
    assert "--jobs: invalid jobs value: '0'" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_finished_sweeps_are_ranked_without_running_again(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "choice"

    def sweep_csv(case: str, by_risk: dict[str, tuple[float, float]]) -> None:
        rows = [{"train.act_risk": risk, **_row(net, exposure, 2)}
                for risk, (net, exposure) in by_risk.items() for _ in range(3)]  # fmt: skip
        (out / case).mkdir(parents=True)
        with (out / case / "sweep.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)

    sweep_csv("planted_0.3", {"0": (9_000.0, 0.9), "1": (7_000.0, 0.6)})
    sweep_csv("martingale", {"0": (-3_000.0, 0.8), "1": (0.0, 0.0)})  # risk 0 holds a position
    sweep_csv("es_sample", {"0": (0.0, 0.1), "1": (0.0, 0.0)})
    monkeypatch.setattr(bench.subprocess, "run", None)  # no sweep may run
    argv = ["choose_default.py", "--out", str(out), "--martingale-paths", "1"]
    argv += ["--edges", "planted_0.3", "--grid", "train.act_risk=0,1", "--jobs", "2"]
    monkeypatch.setattr("sys.argv", argv)
    assert choose_default.main() == 0
    assert capsys.readouterr().out.endswith("chosen: {'train.act_risk': '1'}\n")
    assert json.loads((out / "choice.json").read_text())["chosen"] == {"train.act_risk": "1"}
