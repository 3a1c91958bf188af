"""A checkpoint is bound to its run (issue 49 item 2): ``--resume`` refuses in one line an edited
config.json (C13, C14), other learners (C15), a changed bar file (DCHG) and a checkpoint copied in
from another run (C9); ``--resume-changed`` takes a deliberate change and records it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from es_sample import ES_SAMPLE
from test_cli import _assert_one_line_error
from test_termination import SMALL, _sigterm_at

from jdqn.cli import EXIT_USER_ERROR, main
from jdqn.config import SMOKETEST, apply_overrides
from jdqn.run import binding, termination, walkforward


def _stopped(out: Path, data: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run stopped by SIGTERM in epoch 1 (checkpoints 4 and 6), with seed ``seed``."""
    cfg = apply_overrides(
        SMOKETEST, [*SMALL, f"data.path={data}", f"train.seed={seed}", f"output.out_dir={out}"]
    )
    with monkeypatch.context() as patch:
        _sigterm_at(patch, epoch=1, chunk=1)
        with pytest.raises(termination.Terminated):
            walkforward.run_walkforward(cfg, name=f"s{seed}", progress=False, log=lambda _: None)
    return out / f"s{seed}.incomplete"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("runs")
    data = out / "bars.csv"
    shutil.copy(ES_SAMPLE, data)
    with pytest.MonkeyPatch.context() as patch:
        return {"data": data, **{f"s{s}": _stopped(out, data, s, patch) for s in (7, 8)}}


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    return copy


def _edit_config(run: Path, section: str, field: str, change) -> None:
    config = json.loads((run / "config.json").read_text())
    config[section][field] = change(config[section][field])
    (run / "config.json").write_text(json.dumps(config))


def _resume(run: Path, *flags: str) -> int:
    return main(["walkforward", "--resume", str(run), "--no-progress", *flags])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("section", "field", "change", "named"),
    [
        ("optim", "learning_rate", lambda lr: lr * 10, "changed since the run started: optim."),
        ("data", "signal_strength", lambda _: 0.3, "data.signal_strength 0.0 -> 0.3"),
        ("train", "seeds", lambda _: 2, "the learners changed since the run started"),
    ],
    ids=["C13-lr", "C14-data-setting", "C15-seeds"],
)
def test_an_edited_config_is_refused_in_one_line(
    runs, tmp_path, capsys, section, field, change, named
):
    run = _copy(runs["s7"], tmp_path)
    _edit_config(run, section, field, change)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert _resume(run) == EXIT_USER_ERROR
    _assert_one_line_error(capsys.readouterr().err, named)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # nothing written
    if section == "train":  # other learners: a flag cannot make the checkpoints theirs
        assert _resume(run, "--resume-changed") == EXIT_USER_ERROR
        _assert_one_line_error(capsys.readouterr().err, "learners.seeds 1 -> 2")


@pytest.mark.slow
def test_a_checkpoint_of_another_seed_is_refused_and_the_run_resumes_from_its_own(
    runs, tmp_path, capsys
):
    """C9: step 6 and its manifest copied in from the seed-8 run."""
    run = _copy(runs["s7"], tmp_path)
    for part in ("group0/6.npz", "group0/sha256/6.json"):
        shutil.copy(runs["s8"] / "checkpoints" / part, run / "checkpoints" / part)
    assert _resume(run) == 0
    out = capsys.readouterr().out
    assert "belongs to another run (config, seeds or data)" in out
    assert "jdqn: resumed group 0 after epoch 1\n" in out  # step 4, its own


def test_differences_name_each_changed_field():
    cfg = apply_overrides(SMOKETEST, ["train.seed=3"])
    recorded = binding.current(cfg, 2, 1, "ab" * 32)
    now = binding.current(apply_overrides(cfg, ["optim.learning_rate=0.5"]), 2, 1, "cd" * 32)
    old_lr = cfg.optim.learning_rate
    assert binding.differences(recorded, now) == [
        f"optim.learning_rate {old_lr!r} -> 0.5",
        "the data file's SHA-256 abababababab -> cdcdcdcdcdcd",
    ]
    assert binding.differences(recorded, recorded) == []
    assert "output" not in recorded["config"]  # where results go does not change them


@pytest.mark.slow
def test_a_changed_bar_file_is_refused_and_taken_with_resume_changed(runs, tmp_path, capsys):
    run = _copy(runs["s7"], tmp_path)  # the last test: the runs' bar file changes
    lines = runs["data"].read_text().splitlines()
    runs["data"].write_text("\n".join(lines[:-1]) + "\n")  # the last bar dropped
    assert _resume(run) == EXIT_USER_ERROR
    _assert_one_line_error(capsys.readouterr().err, "the data file's SHA-256")
    assert _resume(run, "--resume-changed") == 0
    assert "resuming with changes (--resume-changed): the data file's SHA-256" in (
        capsys.readouterr().out
    )
    results = json.loads((run.with_suffix("") / "results.json").read_text())
    changes = results["provenance"]["resumed_with_changes"]
    assert len(changes) == 1 and changes[0].startswith("the data file's SHA-256")
