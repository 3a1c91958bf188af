"""Sweeps (``jdqn sweep``): many settings over folds x seeds, one chosen per fold on a validation
tail of its train window, never on its test window (docs/design.md §19, issue 46).

Settings that differ only in the values a learner carries (``SETTING_KEYS``) train as learners of
one program, the others as programs of their own. Each program runs twice, as walk-forward runs:
on the folds' inner train parts, judged on their validation tails, and on the whole train windows,
judged on the test windows. The sweep writes ``sweep.csv`` (every setting x fold x seed),
``results.json`` (the selected settings' test results, the deflated Sharpe ratio counting settings
x seeds, the probability of backtest overfitting) and the selected policies (``jdqn evaluate``).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import itertools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from jdqn.config import Config, apply_overrides
from jdqn.config.keys import config_keys
from jdqn.data import WalkForwardData, describe_source, prepare_walkforward, split_folds
from jdqn.data.calendars import CALENDARS
from jdqn.data.features import compute_features
from jdqn.data.folds import validation_folds
from jdqn.evaluation import stats
from jdqn.evaluation.overfitting import DEFAULT_BLOCKS, probability_of_overfitting
from jdqn.evaluation.policy_bundle import bundle_dir
from jdqn.run import background, faults, memory, provenance, report, rundir, termination
from jdqn.run.faults import UserError, as_user_error
from jdqn.run.walkforward import SETTING_KEYS, policy_root, run_walkforward, source_bars

_debug = logging.getLogger("jdqn.run").debug

RULES = ("median", "lcb")
METRIC = "net_pnl_usd"  # what the rules rank, per run, on its validation tail
PLAN_FILE = "sweep.json"
# Each fold's validation tail, by default: the selection runs train on the rest of the train
# window (less the purge), so on most of what the test runs train on. With the test window's
# length instead (12,000 of `default`'s 20,000 train bars) they trained on a third of it, and on
# a planted edge the chosen settings' validation nets were 36 % below their test nets (mean over
# 3 folds; 7 % with a 6,000-bar tail; docs/performance.md, "Sweeps").
VALIDATION_SHARE = 0.3
# What an interrupted sweep resumes from: a sub-run that finished, or one checkpointed.
RESUMES_FROM = ("settings/*/*/results.json", "settings/*/*.incomplete/checkpoints/group*/[0-9]*")
# What a setting cannot vary, and why: the settings must be judged on the same bars, folds,
# costs and number of seeds, and what a run writes or how it computes is no setting.
_FIXED = {
    "data": "every setting must see the same bars and features",
    "walkforward": "every setting must be judged on the same folds",
    "output": "it says what a run writes, not what it learns",
    "accel": "it says how the step is computed, not what it learns",
    "env": "every setting must be judged with the same contract and costs",
    # train.seed may vary: settings that differ only in it are the null case of overfitting.
    "train.seeds": "the seeds are the sweep's other axis (use --seeds)",
}
# training rewards only
_VARIABLE_ENV = ("env.reward_scale", "env.reward_unit", "env.hold_penalty", "env.train_cost_scale")

Setting = tuple[tuple[str, str], ...]  # (key, value) overrides, in the order the grid gives them


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep tries and how it chooses; saved as the run's ``sweep.json``."""

    settings: tuple[Setting, ...]
    rule: str = "median"  # "median": best median over seeds; "lcb": best lower 95 % bound of it
    validation_bars: int | None = None  # each fold's validation tail; None: VALIDATION_SHARE
    cscv_blocks: int = DEFAULT_BLOCKS  # S of the probability of backtest overfitting

    def record(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "settings": [dict(s) for s in self.settings]}

    @classmethod
    def from_record(cls, raw: dict[str, Any]) -> SweepPlan:
        settings = tuple(tuple(s.items()) for s in raw["settings"])
        return cls(**{**raw, "settings": settings})


def grid_settings(
    base: Config, grid: Sequence[str], samples: int | None = None, seed: int = 0
) -> tuple[Setting, ...]:
    """The settings of ``--grid key=v1,v2 ...``: every combination, or with ``samples`` that many
    random ones (each key a value of its list, or uniform in ``lo..hi``, log-uniform in
    ``log:lo..hi``; drawn from ``numpy.random.default_rng(seed)``). A tuple-valued key separates
    its values with ``/`` (``network.hidden=64,64/128,128``). ValueError (one line) for an unknown
    key, a key that cannot vary, an empty grid or a range without ``samples``."""
    if not grid:
        raise ValueError("jdqn sweep needs at least one --grid key=v1,v2; fix: add one")
    if samples is not None and samples < 1:
        raise ValueError(f"--samples {samples}: must be >= 1")
    types = {k.key: k.type for k in config_keys(base)}
    axes: dict[str, list[str]] = {}
    for item in grid:
        key, sep, values = (part.strip() for part in item.partition("="))
        if not sep:
            raise ValueError(f"--grid {item!r}: use key=v1,v2, e.g. optim.learning_rate=1e-3,3e-4")
        _check_key(key, types, axes)
        split = [v.strip() for v in values.split("/" if "tuple" in types[key] else ",")]
        if not values.strip() or not all(split):
            raise ValueError(f"--grid {item!r}: an empty value; fix: list values as {key}=v1,v2")
        if any(".." in v for v in split) and samples is None:
            raise ValueError(f"--grid {item!r}: a range lo..hi needs --samples N")
        axes[key] = split
    if samples is None:
        return tuple(
            tuple(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())
        )
    rng = np.random.default_rng(seed)
    return tuple(
        tuple((key, _draw(rng, key, values, types[key])) for key, values in axes.items())
        for _ in range(samples)
    )


def _check_key(key: str, types: dict[str, str], seen: dict[str, list[str]]) -> None:
    if key not in types:
        raise ValueError(f"--grid {key}: unknown key; fix: pick one of `jdqn config keys`")
    if key in seen:
        raise ValueError(f"--grid {key}: given twice; fix: list all its values in one --grid")
    section = key.partition(".")[0]
    why = _FIXED.get(key) or (_FIXED.get(section) if key not in _VARIABLE_ENV else None)
    if why is not None:
        raise ValueError(f"--grid {key}: cannot vary in a sweep ({why}); fix: set it with --set")


def _draw(rng: np.random.Generator, key: str, values: list[str], kind: str) -> str:
    """One sampled value: a listed one, or from a range (the first value that is one)."""
    value = values[int(rng.integers(len(values)))]
    if ".." not in value:
        return value
    log = value.startswith("log:")
    low_text, _, high_text = value.removeprefix("log:").partition("..")
    try:
        low, high = float(low_text), float(high_text)
    except ValueError:
        raise ValueError(f"--grid {key}={value}: a range is lo..hi of two numbers") from None
    if kind not in ("int", "float") or not low < high or (log and low <= 0):
        raise ValueError(
            f"--grid {key}={value}: a range needs a number key and lo < hi (lo > 0 for log:)"
        )
    if log:
        drawn = float(np.exp(rng.uniform(np.log(low), np.log(high))))
    else:
        drawn = float(rng.uniform(low, high))
    return str(round(drawn)) if kind == "int" else format(drawn, ".6g")


def setting_configs(base: Config, plan: SweepPlan) -> list[Config]:
    """Each setting's config (ValueError naming the setting, the field and the fix)."""
    if not plan.settings:
        raise ValueError("the sweep has no settings; fix: give --grid key=v1,v2")
    if plan.rule not in RULES:
        raise ValueError(f"--rule {plan.rule}: use one of {', '.join(RULES)}")
    configs = []
    for setting in plan.settings:
        try:
            configs.append(apply_overrides(base, [f"{k}={v}" for k, v in setting]))
        except ValueError as error:
            raise ValueError(f"setting {_describe(setting)}: {error}") from None
    return configs


def program_groups(plan: SweepPlan) -> list[list[int]]:
    """The settings trained as one program: those whose overrides differ only in the keys the
    learner carries as values or in the seed of its keys (``SETTING_KEYS``), in the order of their
    first setting."""
    groups: dict[Setting, list[int]] = {}
    for i, setting in enumerate(plan.settings):
        groups.setdefault(tuple(o for o in setting if o[0] not in SETTING_KEYS), []).append(i)
    return list(groups.values())


def group_config(base: Config, plan: SweepPlan, members: list[int]) -> Config:
    """The config of a group's program: ``base`` with the overrides its settings share and a
    seed index for every setting x seed (``run_walkforward``'s ``settings``)."""
    shared = [f"{k}={v}" for k, v in plan.settings[members[0]] if k not in SETTING_KEYS]
    seeds = f"train.seeds={base.train.seeds * len(members)}"
    risks = [v for i in members for k, v in plan.settings[i] if k == "train.act_risk"]
    try:
        # Acting's std is compiled only where the program's act_risk is above 0
        # (jdqn.agent.acting): the largest of its settings' (each learner carries its own).
        if risks:
            shared.append(f"train.act_risk={max(map(float, risks))}")
        return apply_overrides(base, [*shared, seeds])
    except ValueError as error:
        raise UserError(f"setting {_describe(plan.settings[members[0]])}: {error}") from None


def validation_length(base: Config, plan: SweepPlan) -> int:
    """Bars of each fold's validation tail: ``plan.validation_bars``, or VALIDATION_SHARE of the
    train window."""
    if plan.validation_bars is not None:
        return plan.validation_bars
    return round(VALIDATION_SHARE * base.walkforward.train_bars)


def _describe(setting: Setting) -> str:
    return " ".join(f"{k}={v}" for k, v in setting)


def prepare_data(cfg: Config, validation_bars: int) -> tuple[WalkForwardData, WalkForwardData]:
    """The folds, and the same folds with each train window split into an inner train part
    (the train windows of the selection runs) and a validation tail (their test windows)."""
    bars = source_bars(cfg)
    with as_user_error(ValueError):
        data = prepare_walkforward(bars, cfg, source=describe_source(cfg.data))
        purge = data.walkforward.purge_bars  # resolved from the bars' interval
        folds = validation_folds(list(data.folds), validation_bars, purge)
        values = compute_features(bars, cfg.data).values
        train, test, normalisers = split_folds(values, bars.close, folds, cfg.data.feature_clip)
    stamps = tuple(bars.timestamp[f.test_start : f.test_end] for f in folds)
    validation = dataclasses.replace(
        data,
        folds=tuple(folds),
        train=train,
        test=test,
        test_timestamps=stamps,
        normalisers=normalisers,
    )
    return data, validation


def validation_config(cfg: Config, validation: WalkForwardData) -> Config:
    """``cfg`` for the selection runs, with their windows' lengths and no policy bundles (the
    sweep keeps the test runs' policies only). (A reward unit of the train volatility is
    resolved by the run from the first fold's inner train part, which precedes every validation
    tail.)"""
    first = validation.folds[0]
    train_bars, test_bars = first.train_end - first.train_start, first.test_end - first.test_start
    output = dataclasses.replace(cfg.output, policies=False)
    try:
        windows = dataclasses.replace(cfg.walkforward, train_bars=train_bars, test_bars=test_bars)
        return dataclasses.replace(cfg, walkforward=windows, output=output)
    except ValueError as error:
        raise UserError(f"the validation runs' {train_bars}-bar train windows: {error}") from None


def run_sweep(
    base: Config | None,
    plan: SweepPlan | None,
    *,
    resume: str | os.PathLike[str] | None = None,
    name: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> rundir.RunOutcome:
    """Run every setting's selection and test runs (or those a killed sweep, ``resume``, had not
    finished), choose each fold's setting, write the results; returns the finished directory.
    Bad input raises ``UserError`` (one line) before anything is written."""
    with contextlib.ExitStack() as unlocks, termination.sigterm_raises():
        run: rundir.RunDir | None = None
        if resume is not None:
            run, base, plan = _open_resumed(resume)
            unlocks.callback(rundir.unlock, run)
        assert base is not None and plan is not None
        with as_user_error(ValueError):
            if name is not None:
                rundir.check_name(name)
            configs = setting_configs(base, plan)
        validation_bars = validation_length(base, plan)
        data, validation = prepare_data(base, validation_bars)
        groups = program_groups(plan)
        group_configs = [group_config(base, plan, members) for members in groups]
        selection_configs = [validation_config(c, validation) for c in group_configs]
        features = data.train[0].features.shape[-1]
        for cfg in (*group_configs, *selection_configs):  # every program's, before any is run
            with as_user_error(ValueError):
                memory.check_request(cfg, n_bars=None, features=features)
        # The new directory, known here even when a stop lands before ``run`` is assigned.
        made: list[rundir.RunDir] = []
        try:
            if run is None:
                run = _new_run(base, plan, name, made)
                unlocks.callback(rundir.unlock, run)
            log(
                f"jdqn: sweep of {len(configs)} settings x {len(data.folds)} folds x "
                f"{base.train.seeds} seed(s) on {data.source} as {len(groups)} program(s); "
                f"writing {run.path}"
            )
            tried: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
            for members, cfg, selection_cfg in zip(
                groups, group_configs, selection_configs, strict=True
            ):
                for i in members:  # numbered as in sweep.csv and results.json
                    log(f"jdqn: setting {i}: {_describe(plan.settings[i])}")
                runs = run.path / "settings" / f"s{members[0]:03d}"
                values = [
                    tuple(o for o in plan.settings[i] if o[0] in SETTING_KEYS) for i in members
                ]
                chosen_on = _sub_run(
                    runs, "validation", selection_cfg, validation, progress, values
                )
                test = _sub_run(runs, "test", cfg, data, progress, values)
                for k, i in enumerate(members):
                    tried[i] = (_one_setting(chosen_on, k, values), _one_setting(test, k, values))
            return _finish(run, base, plan, data, [tried[i] for i in sorted(tried)], log)
        except BaseException as error:
            run = run or (made[0] if made else None)
            if run is None:
                raise  # no directory was made
            resumable = rundir.left_to_resume(run, RESUMES_FROM)
            if resumable and faults.io_problem(error) is None:
                log(f"jdqn: sweep interrupted; resume with: jdqn sweep --resume {run.path}")
            resume_dir = run.path if resumable else None
            faults.raise_as_user_error(error, resume_dir, where=run.path, command="jdqn sweep")
            raise


def _open_resumed(path: str | os.PathLike[str]) -> tuple[rundir.RunDir, Config, SweepPlan]:
    with as_user_error(ValueError):
        run = rundir.open_incomplete_run_dir(path)
    try:
        base = Config.from_json(run.config_path.read_text())
        plan = SweepPlan.from_record(json.loads((run.path / PLAN_FILE).read_text()))
    except (OSError, ValueError, TypeError, KeyError) as error:
        rundir.unlock(run)
        raise UserError(
            f"--resume {run.path}: cannot read its plan ({error}); fix: start again"
        ) from None
    return run, base, plan


def _new_run(
    base: Config, plan: SweepPlan, name: str | None, made: list[rundir.RunDir]
) -> rundir.RunDir:
    """The sweep's directory with its config and plan (removed again if they cannot be written),
    put in ``made`` before a Ctrl-C held meanwhile is let through (:func:`rundir.create`)."""
    name = name or datetime.now(UTC).strftime("sweep-%Y%m%d-%H%M%S")
    write_plan = lambda run: rundir.write_json(run.path / PLAN_FILE, plan.record())  # noqa: E731
    return rundir.create(base.output.out_dir, name, base.to_json(), write_plan, made)


def _sub_run(
    parent: Path,
    name: str,
    cfg: Config,
    data: WalkForwardData,
    progress: bool,
    settings: list[Setting],
) -> dict[str, Any]:
    """A walk-forward run of ``cfg`` with ``settings`` as its learners' values on ``data`` in
    ``parent/name``: its results.json when it finished, else resumed when it was checkpointed,
    else run."""
    finished = parent / name / rundir.COMPLETE_MARKER
    if finished.is_file():
        return {**json.loads(finished.read_text()), "run_dir": str(finished.parent)}
    started = time.perf_counter()
    quiet: Callable[[str], None] = lambda _: None  # noqa: E731  # the sweep reports instead
    kwargs: dict[str, Any] = dict(progress=progress, log=quiet, data=data, settings=settings)
    incomplete = parent / f"{name}{rundir.INCOMPLETE_SUFFIX}"
    if incomplete.is_dir():
        outcome = run_walkforward(None, resume=incomplete, **kwargs)
    else:
        # No plot or TensorBoard log for each of a sweep's runs: thousands of them cost more
        # than the training (docs/performance.md, "Sweeps"); the sweep's table and plot stand.
        output = dataclasses.replace(cfg.output, out_dir=str(parent), plots=False)
        cfg = dataclasses.replace(cfg, output=dataclasses.replace(output, tensorboard=False))
        outcome = run_walkforward(cfg, name=name, **kwargs)
    # Finished, it resumes from its results.json: its checkpoints (22 GiB a save at the issue's
    # 1,536 default learners) would only fill the disk.
    removing = time.perf_counter()
    shutil.rmtree(outcome.run_dir / "checkpoints", ignore_errors=True)
    removed = time.perf_counter() - removing
    message = "jdqn: %s/%s finished in %.1f s (its checkpoints removed in %.1f s)"
    _debug(message, parent.name, name, time.perf_counter() - started, removed)
    return {**outcome.results, "run_dir": str(outcome.run_dir)}


def _one_setting(results: dict[str, Any], k: int, settings: list[Setting]) -> dict[str, Any]:
    """Setting ``k``'s runs of a program of ``settings``: its rows with their seeds as in its
    own run, ``seed_offset`` to the seed index that names their curves, and where its policies
    lie."""
    seeds = results["config"]["train"]["seeds"] // len(settings)
    offset = k * seeds
    rows = [
        {**row, "seed": row["seed"] - offset}
        for row in results["folds"]
        if offset <= row["seed"] < offset + seeds
    ]
    policies = policy_root(Path(results["run_dir"]), k, len(settings))
    return {**results, "folds": rows, "seed_offset": offset, "policies": str(policies)}


def select(scores: np.ndarray, rule: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Each fold's setting from validation scores [settings, folds, seeds] (-inf: halted):
    (chosen [folds] int, rule value [settings, folds]). "median": the median over seeds;
    "lcb": the lower end of its 95 % bootstrap interval over seeds (``jdqn.evaluation.stats``,
    drawn from ``seed``). Ties go to the earlier setting."""
    if rule == "median":
        value = np.median(scores, axis=-1)
    else:
        tail = (1.0 - stats.CONFIDENCE) / 2.0 * 100.0
        value = np.asarray(
            [
                [
                    np.percentile(
                        stats.bootstrap_distribution([runs], stats.median, seed=seed),
                        tail,
                        method="lower",  # a value drawn, also where a halted run's -inf is
                    )
                    for runs in setting
                ]
                for setting in scores
            ]
        )
    return np.argmax(value, axis=0), value


def _scores(results: dict[str, Any], n_folds: int, n_seeds: int) -> np.ndarray:
    """[folds, seeds] validation ``METRIC`` of one setting's selection runs; -inf: halted."""
    scores = np.full((n_folds, n_seeds), -np.inf)
    for row in results["folds"]:
        if row["agent"] is not None:
            scores[row["fold"], row["seed"]] = row["agent"][METRIC]
    return scores


def _series(results: dict[str, Any], row: dict[str, Any]) -> stats.RunSeries:
    """A test run's per-bar net PnL, read back from its equity CSV (the cumulative sums)."""
    stem = f"fold{row['fold']}_seed{row['seed'] + results['seed_offset']}"
    realised_at, curves = report.read_equity_csv(
        Path(results["run_dir"]) / "curves" / f"{stem}_equity.csv"
    )
    nets = {name: np.diff(curve, prepend=0.0) for name, curve in curves.items()}
    agent = nets.pop("agent") if row["agent"] is not None else None
    nets.pop("agent", None)
    return stats.RunSeries(row["fold"], row["seed"], agent, nets, realised_at)


def overfitting(tests: Sequence[dict[str, Any]], blocks: int) -> dict[str, Any]:
    """The probability of backtest overfitting over the settings (``jdqn.evaluation.overfitting``)
    on their test windows stitched in time, and on each fold's alone; each bar the mean over
    seeds (a halted run: flat)."""
    by_fold: dict[int, list[list[np.ndarray]]] = {}  # fold -> setting -> [n] per seed
    runs_of = [(i, results, row) for i, results in enumerate(tests) for row in results["folds"]]
    # Thousands of CSVs: read on threads (pyarrow parses off the GIL), taken in order.
    with ThreadPoolExecutor(background.usable_cores()) as pool:
        agents = pool.map(lambda run: _series(run[1], run[2]).agent, runs_of)
        for (i, _, row), net in zip(runs_of, agents, strict=True):
            length = row["window"]["test"][1] - row["window"]["test"][0] - 1
            runs = by_fold.setdefault(row["fold"], [[] for _ in tests])[i]
            runs.append(np.zeros(length) if net is None else net)
    means = {k: np.stack([np.mean(runs, axis=0) for runs in f], 1) for k, f in by_fold.items()}
    stitched = np.concatenate([means[k] for k in sorted(means)])  # [T, settings]
    return {
        "method": "CSCV over the settings' test windows (stitched, and each fold's), mean over "
        "seeds, per-bar Sharpe ratio (Bailey, Borwein, Lopez de Prado & Zhu, 2017)",
        **_cscv(stitched, blocks),
        "folds": {str(k): _cscv(means[k], blocks) for k in sorted(means)},
    }


def _cscv(matrix: np.ndarray, blocks: int) -> dict[str, Any]:
    """PBO of a [T, settings] matrix with at most ``blocks`` blocks; None for a lone setting, or
    where every setting's returns are the same (all sat out, say): there was no choice to make."""
    blocks = min(blocks, len(matrix) - len(matrix) % 2)
    if matrix.shape[1] < 2 or blocks < 2:
        return {"pbo": None, "why_none": "CSCV needs at least 2 settings and 2 bars"}
    if np.all(matrix == matrix[:, :1]):
        return {"pbo": None, "why_none": "every setting's test returns are the same"}
    result = probability_of_overfitting(matrix, blocks)
    return {
        "pbo": result.pbo,
        "blocks": result.blocks,
        "splits": len(result.logits),
        "logit_median": float(np.median(result.logits)),
        "bars_used": result.rows_used,
    }


def _finish(
    run: rundir.RunDir,
    base: Config,
    plan: SweepPlan,
    data: WalkForwardData,
    tried: list[tuple[dict[str, Any], dict[str, Any]]],
    log: Callable[[str], None],
) -> rundir.RunOutcome:
    """Choose each fold's setting, write sweep.csv, the selected policies and results.json, and
    rename the sweep into place."""
    t0, n_folds, n_seeds = time.perf_counter(), len(data.folds), base.train.seeds
    scores = np.stack([_scores(chosen_on, n_folds, n_seeds) for chosen_on, _ in tried])
    chosen, value = select(scores, plan.rule, base.train.seed)
    tests = [test for _, test in tried]
    test_median = np.median([_scores(test, n_folds, n_seeds) for test in tests], axis=-1)
    if base.output.plots:
        plot_ranks(run.plots_dir / "validation_vs_test_rank.png", value, test_median, chosen)
    selected_rows, selected_series = [], []
    for fold, setting in enumerate(chosen):
        for row in (r for r in tests[setting]["folds"] if r["fold"] == fold):
            selected_rows.append({**row, "setting": int(setting)})
            selected_series.append(_series(tests[setting], row))
            bundle = bundle_dir(tests[setting]["policies"], fold, row["seed"])
            if bundle.is_dir():
                shutil.copytree(bundle, bundle_dir(run.path, fold, row["seed"]), dirs_exist_ok=True)
    _write_table(run.path / "sweep.csv", plan, tried, chosen)
    held_up = [_held_up(tried[setting], fold, base) for fold, setting in enumerate(chosen)]
    summary = stats.summarise(
        selected_rows, selected_series, seed=base.train.seed, settings_tried=len(tried)
    )

    def finite(x: float) -> float | None:
        return float(x) if np.isfinite(x) else None

    results = report.results_record(
        base,
        data.source,
        data.bars_per_year,
        selected_rows,
        summary,
        sweep=plan.record(),
        selection={
            "rule": plan.rule,
            "metric": METRIC,
            "validation_bars": validation_length(base, plan),
            "chosen": [int(s) for s in chosen],  # by fold
            "held_up": held_up,  # by fold: the chosen setting's validation net against its test
        },
        settings=[
            {
                "overrides": dict(setting),
                "runs": str(Path(tests[i]["run_dir"]).parent.relative_to(run.path)),
                "seed_offset": tests[i]["seed_offset"],  # its seeds' indices there
                "validation_rule_value": [finite(v) for v in value[i]],  # by fold
                "test_median_" + METRIC: [finite(v) for v in test_median[i]],  # by fold
            }
            for i, setting in enumerate(plan.settings)
        ],
        n_trials=len(tried) * n_seeds,  # settings x seeds, as the deflated Sharpe counts
        overfitting=overfitting(tests, plan.cscv_blocks),
        **provenance.run_record(base.data.path, data.n_bars),
    )
    rundir.write_json(run.results_path, results)
    _debug("jdqn: choice, table, policies and results written in %.1f s", time.perf_counter() - t0)
    final = rundir.finalize(run, "jdqn sweep")
    for fold, setting in enumerate(chosen):
        chosen_line = f"jdqn: fold {fold}: setting {setting} ({_describe(plan.settings[setting])})"
        log(f"{chosen_line}; {_held_up_line(held_up[fold])}")
    pbo = results["overfitting"]["pbo"]
    log(f"jdqn: probability of backtest overfitting: {'n/a' if pbo is None else f'{pbo:.2f}'}")
    log(f"jdqn: results in {final / 'results.json'}; every run in {final / 'sweep.csv'}")
    halted = any(row["status"] != "ok" for row in selected_rows)
    return rundir.RunOutcome(run_dir=final, results=results, halted=halted)


def _held_up(
    tried: tuple[dict[str, Any], dict[str, Any]], fold: int, base: Config
) -> dict[str, Any]:
    """Whether a fold's chosen setting held up on its test window: its validation estimate of
    the test net (median over seeds; a tail shorter than the test window scaled to its length)
    with the prediction interval of ``stats.window_interval`` (the validation tail's trading days
    resampled for the estimate's error, then as many as a window of the test window's length
    holds for that window's own price noise, then seeds), and its test net."""
    chosen_on, test = tried
    series = [_series(chosen_on, r) for r in chosen_on["folds"] if r["fold"] == fold]
    kept = [s.agent * base.env.point_value_usd for s in series if s.agent is not None]  # not halted
    tests = [r["agent"][METRIC] for r in test["folds"] if r["fold"] == fold and r["agent"]]
    if not kept or not tests:
        return {"validation_net_usd": None, "why_none": "every run of the setting halted"}
    day_open = CALENDARS[base.data.calendar].day_open
    tail_days = stats.daily_sums(kept[0], series[0].realised_at, day_open).shape[-1]
    scale = _bars(test, fold) / _bars(chosen_on, fold)  # 1 where the tail is as long
    days = max(1, round(tail_days * scale))
    low, high = stats.window_interval(
        np.stack(kept), series[0].realised_at, day_open=day_open, seed=base.train.seed, days=days
    )
    validation = float(np.median(np.sum(kept, axis=1))) * (days / tail_days)
    tested = float(np.median(tests))
    return {
        "validation_net_usd": validation,
        "validation_ci": [low, high],
        "ci_covers": f"the validation tail's {tail_days} trading days resampled (the estimate's "
        f"error), then {days} of them (a test window's price noise), then the seeds",
        "few_seeds": len(kept) < stats.MIN_SEEDS_FOR_CI,
        "test_net_usd": tested,
        "test_within_ci": low <= tested <= high,
    }


def _bars(results: dict[str, Any], fold: int) -> int:
    """Bars of ``fold``'s test window in a sub-run's results (a selection run's: the tail)."""
    start, end = next(r["window"]["test"] for r in results["folds"] if r["fold"] == fold)
    return int(end - start)


def _held_up_line(held: dict[str, Any]) -> str:
    if held["validation_net_usd"] is None:
        return f"validation net n/a ({held['why_none']})"
    low, high = held["validation_ci"]
    where = "within" if held["test_within_ci"] else "outside"
    flag = " (fewer than 5 seeds)" if held["few_seeds"] else ""
    return (
        f"validation net {held['validation_net_usd']:+,.0f} $ [{low:+,.0f}, {high:+,.0f}]{flag}, "
        f"test {held['test_net_usd']:+,.0f} $: {where} the interval"
    )


# exposure and position changes (n_trades of n_bars) tell sitting out from holding one direction
_TABLE_METRICS = (*stats.SUMMARY_METRICS, "n_trades", "n_bars")


def _write_table(
    path: Path,
    plan: SweepPlan,
    tried: list[tuple[dict[str, Any], dict[str, Any]]],
    chosen: np.ndarray,
) -> None:
    """sweep.csv: one row per setting x fold x seed, its validation and test metrics."""
    keys = list(dict.fromkeys(k for setting in plan.settings for k, _ in setting))
    header = ["setting", *keys, "fold", "seed", "selected"]
    for phase in ("validation", "test"):
        header += [f"{phase}_status", *(f"{phase}_{m}" for m in _TABLE_METRICS)]
    lines = []
    for i, ((chosen_on, test), setting) in enumerate(zip(tried, plan.settings, strict=True)):
        values = dict(setting)
        by_run = {(r["fold"], r["seed"]): r for r in test["folds"]}
        for row in chosen_on["folds"]:
            line = [i, *(values.get(k, "") for k in keys), row["fold"], row["seed"]]
            line.append(int(chosen[row["fold"]] == i))
            for phase_row in (row, by_run[(row["fold"], row["seed"])]):
                agent = phase_row["agent"] or {}
                line += [phase_row["status"], *(agent.get(m, "") for m in _TABLE_METRICS)]
            lines.append(line)
    lines.sort(key=lambda line: (line[0], line[len(keys) + 1], line[len(keys) + 2]))
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(lines)


def _ranks(values: np.ndarray) -> np.ndarray:
    """Rank of each setting in each fold, 1 = best; [settings, folds]."""
    return np.argsort(np.argsort(-values, axis=0, kind="stable"), axis=0, kind="stable") + 1


def plot_ranks(path: Path, validation: np.ndarray, test: np.ndarray, chosen: np.ndarray) -> None:
    """Each setting's validation rank against its test rank, per fold ([settings, folds] values,
    higher better); the chosen ones ringed. Points on the diagonal: validation foretold test."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(5, 5))
    ax = fig.subplots()
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True))
    x, y = _ranks(validation), _ranks(test)
    for fold in range(validation.shape[1]):
        ax.scatter(x[:, fold], y[:, fold], s=18, label=f"fold {fold}")
        ax.scatter(
            x[chosen[fold], fold],
            y[chosen[fold], fold],
            s=90,
            facecolors="none",
            edgecolors="black",
        )
    ax.plot([1, len(x)], [1, len(x)], color="grey", linewidth=0.5)
    ax.set_xlabel("validation rank (1 = best)")
    ax.set_ylabel("test rank (median net $ over seeds)")
    ax.set_title("settings: validation against test (chosen ringed)")
    ax.legend(loc="lower right", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
