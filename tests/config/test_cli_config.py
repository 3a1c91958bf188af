"""jdqn --version, -v/-q, config keys, walkforward --config / --print-config, provenance."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from es_sample import ES_FOLDS, ES_SAMPLE
from smoke import SMOKE
from tiny_learner import TINY

from jdqn.cli import SMOKETEST_ON_USER_BARS, main
from jdqn.config import DEFAULT, SMOKETEST, Config, apply_overrides
from jdqn.config.keys import config_keys, field_comments
from jdqn.config.sections import LossConfig
from jdqn.run import console_log, provenance


def _one_line_error(err: str, expected: str) -> None:
    assert err.count("\n") == 1 and err.startswith("jdqn: error: ") and expected in err, err


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert re.fullmatch(r"jdqn \d+\.\d+\.\d+( \(git [0-9a-f]{8}(, modified)?\))?\n", out), out


def test_config_keys_cover_every_field_with_a_description(capsys):
    keys = config_keys(SMOKETEST)
    expected = [
        f"{section.name}.{f.name}"
        for section in dataclasses.fields(Config)
        for f in dataclasses.fields(section.default_factory)  # type: ignore[arg-type]
    ]
    assert [k.key for k in keys] == expected
    assert all(k.description for k in keys), [k.key for k in keys if not k.description]
    by_key = {k.key: k for k in keys}
    assert (by_key["replay.capacity"].type, by_key["replay.capacity"].value) == ("int", 256)
    assert by_key["loss.huber_delta"].type == "float | None"
    assert by_key["network.hidden"].type == "tuple[int, ...]"
    assert by_key["walkforward.mode"].type == "str"
    assert by_key["walkforward.mode"].description.endswith("(one of: rolling, expanding)")
    assert by_key["optim.tau"].description == "Polyak rate; 0 = hard sync every target_every steps"
    assert main(["config", "keys", "--profile", "default", "--instrument", "CL"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(keys) + 1 and lines[0].split() == [
        "key",
        "type",
        "value",
        "description",
    ]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["replay.capacity"][2] == str(DEFAULT.replay.capacity)
    assert rows["env.tick_size"][2] == "0.01" and rows["env.instrument"][2] == '"CL"'


def test_help_opens_with_a_sentence(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    description = capsys.readouterr().out.split("\n\n")[1]
    assert description.startswith("Train a distributional (C51) DQN") and "``" not in description


def _tiny_run(tmp_path, level: str, name: str) -> int:
    settings = [*ES_FOLDS, *TINY, "train.epochs=1", "output.plots=false"]
    argv = [level, *SMOKE, "--data", str(ES_SAMPLE), "--out", str(tmp_path), "--name", name]
    argv += ["--folds", "1", "--no-progress"]
    return main([*argv, *[a for item in settings for a in ("--set", item)]])


@pytest.mark.slow
def test_verbose_and_quiet_runs_say_what_each_promises(tmp_path, capsys):
    """-v: the notices (costs, smoketest on the user's file), how the bars were read, the memory
    plan, compile and chunk times; -q: where the results went, nothing else."""
    assert _tiny_run(tmp_path, "-v", "loud") == 0
    out, err = capsys.readouterr()
    assert err == ""  # notices go to stdout: stderr keeps an error to its one line
    # ES 1-minute bars: a round trip (0.6 points) costs more than the median move (0.25)
    notice = "jdqn: notice: a round trip costs 0.6 points ($30.00 per unit), 2.4x the median"
    assert notice in out and SMOKETEST_ON_USER_BARS in out
    for line in (
        f"jdqn: bars: {ES_SAMPLE}; columns by their headers; naive times read as exchange time; "
        "calendar cme_equity (America/Chicago); 2,264 bars",
        "jdqn: fold 0 train [904, 1904) test [1964, 2264)",
        "jdqn: env: ES, cost 0.3 points ($15.00) per unit and side, reward scale ",
        "jdqn: memory plan: on a device, per learner: learner states",
        "jdqn: run_chunk: ",  # traced and compiled, or loaded: with its time
        "jdqn: group 0 epoch 1 chunk 1: ",
        f"jdqn: results in {tmp_path / 'loud' / 'results.json'}",
    ):
        assert line in out, line
    assert _tiny_run(tmp_path, "-q", "quiet") == 0
    out, err = capsys.readouterr()
    assert (out, err) == (f"jdqn: results in {tmp_path / 'quiet' / 'results.json'}\n", "")


def test_comment_lines_above_a_field_join_its_description():
    comments = field_comments(LossConfig)
    assert comments["edge_mass_limit"] == (
        "guard: mean projected target mass on the two edge atoms above which the fold stops (the "
        "support no longer holds the returns); Q within one atom of an edge stops it too"
    )
    assert comments["gv_beta"] == "EMA rate of phi_hat"


def test_print_config_and_rerun_of_a_saved_config(tmp_path, capsys):
    assert main(["walkforward", "--print-config", "--instrument", "NQ", "--epochs", "3"]) == 0
    printed = Config.from_json(capsys.readouterr().out)
    expected = apply_overrides(DEFAULT, ["train.epochs=3"])  # the profile the command defaults to
    assert printed.train == expected.train and printed.env.instrument == "NQ"
    saved = tmp_path / "config.json"
    saved.write_text(printed.to_json())
    argv = ["walkforward", "--config", str(saved), "--print-config", "--set", "train.seeds=2"]
    assert main(argv) == 0
    again = Config.from_json(capsys.readouterr().out)
    assert again == dataclasses.replace(printed, train=dataclasses.replace(printed.train, seeds=2))
    results = tmp_path / "results.json"  # a run's results.json holds the same config
    results.write_text(json.dumps({"config": json.loads(printed.to_json()), "folds": []}))
    assert main(["walkforward", "--config", str(results), "--print-config"]) == 0
    assert Config.from_json(capsys.readouterr().out) == printed


@pytest.mark.parametrize(
    ("content", "extra", "expected"),
    [
        (None, [], "no such file; fix: check the path"),
        ("{not json", [], "not JSON (line 1"),
        ('{"train": {"epoch": 3}}', [], "unknown key train.epoch"),
        ('{"train": {"epochs": 0}}', [], "train.epochs: must be >= 1"),
        ("{}", ["--profile", "default"], "already holds a whole config; fix: drop --profile"),
        ("{}", ["--resume", "x"], "fix: drop --data, --config, --profile"),
    ],
)
def test_bad_config_files_are_one_line_errors(tmp_path, capsys, content, extra, expected):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    argv = ["walkforward", "--config", str(path), "--out", str(tmp_path / "runs"), *extra]
    assert main(argv) == 2
    _one_line_error(capsys.readouterr().err, expected)
    assert not (tmp_path / "runs").exists()


def test_console_levels(capsys):
    logger = console_log.configure()
    logger.debug("hidden")
    logger.info("shown")
    logger.warning("careful")
    out, err = capsys.readouterr()
    assert (out, err) == ("shown\n", "careful\n")
    console_log.configure(quiet=True).info("quiet")
    console_log.outcome("results in x")  # -q keeps where the results went and halts
    console_log.configure(verbose=1).debug("detail")
    assert capsys.readouterr().out == "results in x\ndetail\n"
    assert sum(type(h).__name__ == "_ConsoleHandler" for h in logger.handlers) == 1
    assert not logger.propagate  # absl's root handler would print every line again
    console_log.configure()


def test_quiet_keeps_the_newest_first_notice(tmp_path, capsys):
    path = tmp_path / "desc.csv"
    rows = "".join(f"2013-09-01 17:0{m},1,2,1,1.5\n" for m in (3, 2, 1, 0))
    path.write_text("timestamp,o,h,l,c\n" + rows)
    assert main(["-q", "data", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == f"{path}: bars are newest first; sorted oldest first\n"
    assert ": 4 valid bars, 2013-09-01T17:00:00.000000000 .. 2013-09-01T17:03:00.000000000\n" in out
    assert main(["data", "check", "-v", str(path)]) == 0
    console_log.configure()


def test_provenance_record(tmp_path):
    path = tmp_path / "bars.csv"
    path.write_bytes(b"abc")
    record = provenance.run_record(str(path), 3)
    assert record["schema_version"] == provenance.RESULTS_SCHEMA_VERSION
    made_by = record["provenance"]
    # SHA-256("abc"), FIPS 180-2 appendix B.1
    assert made_by["data"] == {
        "path": str(path),
        "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        "bars": 3,
    }
    commit = provenance.git_commit()
    assert commit is None or re.fullmatch(r"[0-9a-f]{40}", commit["commit"])
    assert provenance.run_record(None, 60_000)["provenance"]["data"]["sha256"] is None
    assert Path(provenance.__file__).name == "provenance.py"
