"""Bad paths, names, config files and bar files (issue 49 items 6 and 14): the ``jdqn`` command
prints one line and exits 2 (or 0 for a closed pipe), with no traceback and nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from es_sample import ES_SAMPLE
from test_cli import _assert_one_line_error

REPO = Path(__file__).resolve().parents[1]


def _jdqn(*argv: str, stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, "-m", "jdqn", *argv]
    return subprocess.run(command, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env)


def _huge_price_bars(path: Path) -> Path:
    frame = pd.read_csv(ES_SAMPLE).iloc[:3000]
    frame.loc[5, ["open", "high", "low", "close"]] *= 1e300  # beyond float32, still finite
    frame.to_csv(path, index=False)
    return path


CASES = {  # id: (arguments, given tmp_path and the output directory; the error line's words)
    "B18-path-over-the-limit": (
        lambda tmp, out: ["walkforward", "--data", str(tmp) + "/y" * 2100 + "/x.csv"],
        "file name too long; fix: check the path",
    ),
    "B22-newline-in-name": (
        lambda tmp, out: ["walkforward", "--folds", "1", "--epochs", "1", "--name", "a\nb"],
        "holds a control character",
    ),
    "B39-nested-config": (
        lambda tmp, out: ["walkforward", "--config", _write(tmp, "[" * 200000 + "]" * 200000)],
        "nested too deeply",
    ),
    "B39b-nested-section": (
        lambda tmp, out: ["walkforward", "--config", _write(tmp, '{"data":' + "[" * 200000)],
        "nested too deeply",
    ),
    "B40b-section-as-list": (
        lambda tmp, out: ["walkforward", "--config", _write(tmp, '{"train": []}')],
        "section train: expected an object of keys, got []",
    ),
    "B40g-bool-for-a-number": (
        lambda tmp, out: ["walkforward", "--config", _write(tmp, '{"train": {"seeds": true}}')],
        "train.seeds: expected int; got True",
    ),
    "D21-check-huge-price": (
        lambda tmp, out: ["data", "check", str(_huge_price_bars(tmp / "huge.csv"))],
        "is above 1e+09",
    ),
    "D39-walkforward-huge-price": (
        lambda tmp, out: ["walkforward", "--data", str(_huge_price_bars(tmp / "huge.csv"))],
        "is above 1e+09",
    ),
    "SYN-1e10": (
        lambda tmp, out: ["data", "synth", "--bars", "10000000000", "--out", str(out / "x.csv")],
        "--bars 10,000,000,000 needs about",
    ),
}


def _write(tmp: Path, text: str) -> str:
    (tmp / "c.json").write_text(text + "\n")
    return str(tmp / "c.json")


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_a_bad_request_is_one_line_and_exit_2_and_leaves_nothing(tmp_path, case):
    arguments, expected = CASES[case]
    out = tmp_path / "out"
    out.mkdir()
    argv = arguments(tmp_path, out)
    if argv[0] == "walkforward":
        argv += ["--no-progress", "--out", str(out)]
        argv += [] if "--config" in argv else ["--profile", "smoketest"]
    done = _jdqn(*argv)
    assert done.returncode == 2, done.stderr
    _assert_one_line_error(done.stderr, expected)
    assert list(out.iterdir()) == []


@pytest.mark.slow
def test_print_config_into_a_closed_pipe_exits_0_without_a_traceback(tmp_path):
    """B37 (``... --print-config | head -c 100``), made certain: the reader is gone already."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = _jdqn("walkforward", "--profile", "smoketest", "--print-config", stdout=write)
    finally:
        os.close(write)
    assert done.returncode == 0 and done.stderr == ""
