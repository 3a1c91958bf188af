"""Walk-forward runs: every fold (and seed) trained, judged out of sample, written to a run dir.

Rolling folds have equal lengths, so all folds x seeds are one vmapped program (one compile);
expanding folds differ in length and run in sequence (docs/design.md §7, §8, §11).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jdqn.accel import choose
from jdqn.accel.executables import ExecutableCache, refuse_untrusted
from jdqn.accel.xla_flags import cache_root, configure
from jdqn.agent import GUARD_REASONS
from jdqn.agent import debug as debug_mode
from jdqn.agent.state import HYPER_KEYS, Hyper, hyper_of
from jdqn.agent.train import FoldData, TrainProgram, TrainState, make_train
from jdqn.config import Config, apply_overrides
from jdqn.data import (
    CALENDARS,
    Bars,
    FoldArrays,
    WalkForwardData,
    describe_source,
    load_source,
    prepare_walkforward,
    stack_folds,
)
from jdqn.data.intervals import reading_lines
from jdqn.evaluation import policy_bundle, stats
from jdqn.evaluation.baselines import fold_baselines
from jdqn.evaluation.env import cost_notices, make_params, resolve_costs, volatility_reward_scale
from jdqn.evaluation.judging import judge_run
from jdqn.evaluation.rollouts import baseline_results, baseline_rollouts
from jdqn.run import (
    background,
    binding,
    console_log,
    faults,
    memory,
    metrics_log,
    placement,
    provenance,
    report,
    rundir,
    termination,
)
from jdqn.run.checkpoint import (
    CheckpointLayoutError,
    GroupCheckpoints,
    NoIntactCheckpointError,
    SaveCadence,
    host,
)
from jdqn.run.faults import UserError, as_user_error
from jdqn.run.metrics_log import TENSORBOARD, MetricsLog
from jdqn.run.processes import ProcessError, Processes

# -v: what a user debugging a run wants (jdqn.run.console_log); off by default.
_debug = logging.getLogger("jdqn.run").debug
# Notices go to stdout with the run's other lines: stderr keeps an error to its one line.
_notice = logging.getLogger("jdqn.run").info


# run_walkforward's ``settings``: K settings, each ``(key, value)`` overrides of SETTING_KEYS (the
# keys a learner carries as values, jdqn.agent.state.HYPER_KEYS, and the seed of its keys), trained
# as learners of the one program (a sweep's settings axis): seed index j trains setting j // S with
# seed j % S, S = train.seeds / K.
# The run's own summary pools them; its rows, curves and policies are each setting's.
Settings = Sequence[Sequence[tuple[str, str]]]
SETTING_KEYS = (*HYPER_KEYS, "train.seed")
# A run's checkpoints (several processes': each its share), what an interrupted run resumes from.
CHECKPOINTS = ("checkpoints/group*/[0-9]*", "checkpoints/group*/process-*/[0-9]*")


def enable_compilation_cache(cfg: Config) -> None:
    """Persist XLA executables across runs (warm starts skip compilation)."""
    if not cfg.output.compilation_cache or refuse_untrusted(cache_root(), "compilation cache"):
        return  # JAX's cache holds machine code: only a directory no one else can write
    jax.config.update("jax_compilation_cache_dir", str(cache_root()))
    # Cache every program, not only slow ones: the many small ones add up.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def source_bars(cfg: Config) -> Bars:
    """``cfg.data``'s bars; every input problem becomes a one-line ``UserError``."""
    try:
        if cfg.data.path and not Path(cfg.data.path).exists():
            raise UserError(f"--data {cfg.data.path}: no such file; fix: check the path")
        with as_user_error(ValueError):  # BarFileError included: one line naming file, row, fix
            return load_source(cfg.data)
    except OSError as error:  # a name over the file system's limit, a file it may not read
        problem = error.strerror or type(error).__name__
        raise UserError(f"--data {cfg.data.path}: {problem}; fix: check the path") from None


def load_data(cfg: Config) -> WalkForwardData:
    """Bars -> features -> folds; every input problem becomes a one-line ``UserError``."""
    bars = source_bars(cfg)
    with as_user_error(ValueError):
        return prepare_walkforward(bars, cfg, source=describe_source(cfg.data))


def run_walkforward(
    cfg: Config | None,
    *,
    resume: str | os.PathLike[str] | None = None,
    debug: bool = False,
    progress: bool = True,
    name: str | None = None,
    log: Callable[[str], None] = print,
    log_outcome: Callable[[str], None] | None = None,
    plot_processes: bool = False,
    devices: int | None = None,
    processes: Processes | None = None,
    resume_changed: bool = False,
    data: WalkForwardData | None = None,
    settings: Settings = ((),),
) -> rundir.RunOutcome:
    """Train and judge every fold; returns the finished run directory and its results.

    ``plot_processes``: draw the plots in spawned worker processes where cores are spare
    (``report.plot_processes``): a script that turns this on must keep its top-level code under
    ``if __name__ == "__main__":``. ``devices``: local devices that share the learners (default
    all; ``jdqn.run.placement``). ``processes``: this process's place in a run of several
    (``jdqn.run.processes``; default jax's count and index). ``log_outcome`` (default ``log``)
    takes the lines a quiet console still shows: where the results went, halts, how to resume.
    ``data``: the folds, when the caller prepared them (a sweep's validation folds; default:
    loaded as ``cfg.data`` says). Process 0 writes the run directory and returns the results; the
    others return its path, no results and whether a run halted. ``resume_changed``: resume
    although config.json or the data file changed (jdqn.run.binding)."""
    configure()  # jdqn's XLA flags, where no JAX backend has started yet
    started = time.perf_counter()
    processes = processes or Processes(jax.process_count(), jax.process_index())
    log_outcome = log_outcome or log
    # SIGTERM stops the run as Ctrl-C does; the run directory this call locks is unlocked at exit.
    with contextlib.ExitStack() as unlocks, termination.sigterm_raises():
        run: rundir.RunDir | None = None
        if not processes.writer:  # process 0 reports for all of them
            log, progress, plot_processes = (lambda _: None), False, False
            log_outcome = log
        if name is not None:
            with as_user_error(ValueError):
                rundir.check_name(name)
        if resume is not None:
            run, cfg = _open_resumed(resume, unlocks, processes)
        assert cfg is not None
        if resume is None:  # recorded in config.json: a resume may start in another directory
            cfg = _absolute_paths(cfg)
        cfg = metrics_log.without_missing_tensorboard(cfg, log)
        enable_compilation_cache(cfg)
        # Before any memory is taken and any directory exists: a request too large, or bad input,
        # leaves nothing behind (the second check, with the data's own feature count).
        memory.check_request(cfg, n_bars=None if cfg.data.path else cfg.data.synthetic_bars)
        data = load_data(cfg) if data is None else data
        windows = dataclasses.replace(cfg.walkforward, purge_bars=data.walkforward.purge_bars)
        cfg = dataclasses.replace(cfg, walkforward=windows)  # purge: from the bars' interval
        memory.check_request(cfg, n_bars=None, features=data.train[0].features.shape[-1])
        cfg = resolve_reward_unit(cfg, data)
        _debug(console_log.reading_record(cfg, data))
        made_by = provenance.run_record(cfg.data.path, data.n_bars)  # hashed before training
        now, seal = _seal(cfg, data, processes, run, resume_changed, log, made_by, settings)
        layout = _layout(cfg, data, devices, debug, run, processes)  # may refuse, leaving nothing
        _debug(console_log.memory_record(cfg, data, layout))
        writes: report.BackgroundWrites | None = None
        # The new directory, known here even when a stop lands before ``run`` is assigned (a
        # Ctrl-C re-raised after a garbage-collector callback can arrive on any later call).
        made: list[rundir.RunDir] = []
        try:
            if resume is None:
                run = _new_run(cfg, name, layout, processes, unlocks, made)
            assert run is not None
            if processes.writer:
                binding.write(run.path, now, seal)
            _announce(cfg, data, layout, run, processes, log)
            # Plots and CSVs, done before results.json; the plotting library is imported meanwhile.
            preload = report.PLOT_MODULES if cfg.output.plots and processes.writer else ()
            usable = background.usable_cores()
            cores = report.plot_processes(usable) if cfg.output.plots and plot_processes else 0
            series: list[stats.RunSeries] = []  # each run's test-window PnL, for the summary
            summary: dict[str, Any] = {}
            with report.BackgroundWrites(preload, cores, report.file_threads(usable)) as writes:
                job = _Job(
                    cfg,
                    data,
                    run,
                    writes,
                    series,
                    processes,
                    debug,
                    progress,
                    log,
                    seal,
                    log_outcome,
                    _setting_configs(cfg, settings),
                    SaveCadence(),
                )
                _debug("jdqn: set up in %.1f s", time.perf_counter() - started)
                fold_results = _run_all_folds(job, layout)
                ran = time.perf_counter()
                if processes.writer:
                    summary = report.write_summary(
                        writes, run.path, fold_results, series, cfg, cfg.output.plots
                    )
            _debug("jdqn: summary and every file written in %.1f s", time.perf_counter() - ran)
            if not processes.writer:
                ended = json.loads(processes.broadcast_text(""))  # once process 0 renamed the run
                return rundir.RunOutcome(Path(ended["run_dir"]), {}, halted=ended["halted"])
            # In this block: a signal before the rename leaves the run resumable (it judges again).
            return _finish(job, fold_results, summary, made_by)
        except debug_mode.DebugCheckFailed as failure:
            # Keep the .incomplete directory: it holds the failure record and the metrics so far.
            log_outcome(f"jdqn: {failure}; recorded in {failure.record}")
            raise
        except (CheckpointLayoutError, NoIntactCheckpointError):
            raise  # resuming cannot help (the error says to start again); the directory stays
        except BaseException as error:
            run = run or (made[0] if made else None)
            if run is None or not processes.writer:
                raise  # no directory was made, or process 0 owns it
            _stopped(error, run, writes, log_outcome)
            raise


def _stopped(
    error: BaseException,
    run: rundir.RunDir,
    writes: report.BackgroundWrites | None,
    log_outcome: Callable[[str], None],
) -> None:
    """Process 0's clean-up of a run stopped by ``error``: its writes finished, its directory
    kept when there is a checkpoint to resume from (and the command to resume said), else
    removed; ``error`` raised as a user error when it is one (a storage failure)."""
    if writes is not None:  # a signal on the writes block's last line left them running
        writes.finish()
    resumable = rundir.left_to_resume(run, CHECKPOINTS)
    # A storage failure's line, or a final name taken, says how to resume instead.
    say = faults.io_problem(error) is None and not isinstance(error, rundir.FinalNameTaken)
    if resumable and say:
        command = f"jdqn walkforward --resume {run.path}"
        log_outcome(f"jdqn: run interrupted; resume with: {command}")
    faults.raise_as_user_error(error, run.path if resumable else None, where=run.path)


def _announce(
    cfg: Config,
    data: WalkForwardData,
    layout: placement.RunLayout,
    run: rundir.RunDir,
    processes: Processes,
    log: Callable[[str], None],
) -> None:
    """The run's first lines: what it trains on, how a user's file was read, where it runs."""
    log(f"jdqn: {len(data.folds)} folds x {cfg.train.seeds} seed(s) on {data.source}")
    if cfg.data.path:  # how the user's file was read
        for line in reading_lines(data.reading):
            log(f"jdqn: {line}")
    if processes.count > 1:
        log(f"jdqn: {processes.count} processes share the learners")
    layout.announce(log)
    log(f"jdqn: writing {run.path} (renamed to {run.final_path.name} when complete)")


def _seal(
    cfg: Config,
    data: WalkForwardData,
    processes: Processes,
    run: rundir.RunDir | None,
    resume_changed: bool,
    log: Callable[[str], None],
    made_by: dict[str, Any],
    settings: Settings,
) -> tuple[dict[str, Any], binding.Seal]:
    """What this run is bound to (config, learners and their settings, data) and the seal its
    checkpoints carry; a resumed run's must match its own, or be accepted as changed
    (``resume_changed``, then recorded in ``made_by``'s provenance)."""
    data_sha256 = made_by["provenance"]["data"]["sha256"]
    now = binding.current(cfg, len(data.folds), processes.count, data_sha256)
    if len(settings) > 1:  # a run of one setting is bound as before
        now["learners"]["settings"] = [dict(setting) for setting in settings]
    seal = binding.fresh(now)
    if run is not None:  # resumed: the same config, learners and data, or refused
        with as_user_error(binding.BindingError):
            seal = binding.check_resume(run.path, now, resume_changed, log) or seal
        if seal.changes:
            made_by["provenance"]["resumed_with_changes"] = list(seal.changes)
    return now, seal


def _absolute_paths(cfg: Config) -> Config:
    """``cfg`` with its bar file and output directory as absolute paths."""
    data = cfg.data
    if data.path is not None:
        data = dataclasses.replace(data, path=os.path.abspath(data.path))
    output = dataclasses.replace(cfg.output, out_dir=os.path.abspath(cfg.output.out_dir))
    return dataclasses.replace(cfg, data=data, output=output)


def _open_resumed(
    resume: str | os.PathLike[str], unlocks: contextlib.ExitStack, processes: Processes
) -> tuple[rundir.RunDir, Config]:
    """A killed run's directory (locked by process 0) and its config, for ``--resume``."""
    with as_user_error(ValueError):
        run = rundir.open_incomplete_run_dir(resume, lock=processes.writer)
    unlocks.callback(rundir.unlock, run)
    with as_user_error(ProcessError):
        processes.check_resume(run.path)
    try:
        return run, Config.from_json(run.config_path.read_text())
    except (OSError, ValueError) as error:
        raise UserError(
            f"--resume {run.path}: cannot read its config.json ({error}); fix: start a new run"
        ) from None


def _new_run(
    cfg: Config,
    name: str | None,
    layout: placement.RunLayout,
    processes: Processes,
    unlocks: contextlib.ExitStack,
    made: list[rundir.RunDir],
) -> rundir.RunDir:
    """A new run directory: process 0 makes it and writes the config, the waves and the process
    count; the other processes are told its path. Process 0's is put in ``made`` before a
    Ctrl-C held meanwhile is let through (:func:`rundir.create`)."""
    run = None
    if processes.writer:

        def fill(run: rundir.RunDir) -> None:
            layout.record(run)
            processes.record(run.path)

        run = rundir.create(cfg.output.out_dir, name, cfg.to_json(), fill, made)
        unlocks.callback(rundir.unlock, run)
    path = Path(processes.broadcast_text(str(run.path) if run is not None else ""))
    final = path.with_name(path.name.removesuffix(rundir.INCOMPLETE_SUFFIX))
    return run or rundir.RunDir(path=path, final_path=final)


def _finish(
    job: _Job, fold_results: list[dict[str, Any]], summary: dict[str, Any], made_by: dict[str, Any]
) -> rundir.RunOutcome:
    """Process 0 writes results.json, renames the run into place and reports it."""
    cfg, run, log = job.cfg, job.run, job.log
    data = job.data  # "bars": how the bars were read
    results = report.results_record(
        cfg, data.source, data.bars_per_year, fold_results, summary, bars=data.reading, **made_by
    )
    show_random = cfg.output.show_random
    try:
        rundir.write_json(run.results_path, results)
        # From the rename on the run is complete: a SIGTERM or Ctrl-C is held and then said, not
        # raised, so the report, the status and the directory (no .lock) say so.
        with rundir.interrupts_held() as received:
            final = rundir.finalize(run)
            halted = [r for r in fold_results if r["status"] != "ok"]
            ended = {"run_dir": str(final), "halted": bool(halted)}
            job.processes.broadcast_text(json.dumps(ended))
            log(report.summary_table(fold_results, show_random))
            log(report.summary_text(summary, show_random))
            plots = f"; plots in {final / 'plots'}" if cfg.output.plots else ""
            job.log_outcome(f"jdqn: results in {final / 'results.json'}{plots}")
            for row in halted:
                job.log_outcome(f"jdqn: fold {row['fold']} seed {row['seed']} {row['status']}")
    except OSError as error:  # every epoch is checkpointed: a resume only judges again
        resume_dir = run.path if cfg.output.checkpoints else None
        faults.raise_as_user_error(error, resume_dir, where=run.path)
        raise
    for signum in dict.fromkeys(received):
        job.log_outcome(
            f"jdqn: {signal.Signals(signum).name} arrived as the run completed; it is complete"
        )
    return rundir.RunOutcome(run_dir=final, results=results, halted=bool(halted))


def resolve_reward_unit(cfg: Config, data: WalkForwardData) -> Config:
    """The config with ``env.reward_unit`` resolved to points (``env.volatility_reward_scale``)
    and the notional commission's price set (``env.resolve_costs``) from the first fold's train
    window, which precedes every test window; costs that swamp the moves get a notice."""
    train_close = data.train[0].close
    with as_user_error(ValueError):
        env = volatility_reward_scale(resolve_costs(cfg.env, train_close), train_close)
    for notice in cost_notices(env, train_close, [fold.close for fold in data.test]):
        _notice(notice)
    return dataclasses.replace(cfg, env=env)


@dataclass(frozen=True)
class _Job:
    """A walk-forward run in progress, as each of its groups sees it: config, data, directory,
    writer thread, this process's place among the processes, and how the run reports."""

    cfg: Config
    data: WalkForwardData
    run: rundir.RunDir
    writes: report.BackgroundWrites
    series: list[stats.RunSeries]  # each run's test-window PnL, for the summary (process 0)
    processes: Processes
    debug: bool
    progress: bool
    log: Callable[[str], None]
    seal: binding.Seal  # what its checkpoints carry and accept (jdqn.run.binding)
    log_outcome: Callable[[str], None]  # lines a quiet console keeps (results path, halts)
    settings: tuple[Config, ...]  # the configs of the settings the learners carry as values
    save_cadence: SaveCadence  # when the next checkpoint may be taken, over all groups

    def setting_of(self, seed_index: int) -> int:
        """Which setting a run's seed index trains (``run_walkforward``'s ``settings``)."""
        return seed_index // (self.cfg.train.seeds // len(self.settings))

    def own_ids(self, run_ids: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Each run's fold and seed within its setting: its (fold, seed) in its own run."""
        return [(f, s % (self.cfg.train.seeds // len(self.settings))) for f, s in run_ids]

    def key_seeds(self, run_ids: Sequence[tuple[int, int]]) -> tuple[np.ndarray, ...]:
        """Each run's config seed, fold and seed within its setting, [R] int32 each
        (:func:`run_keys`'s arguments): a setting's runs get the keys of its own run."""
        folds, seeds = np.asarray(self.own_ids(run_ids), np.int32).T
        bases = [self.settings[self.setting_of(seed)].train.seed for _, seed in run_ids]
        return np.asarray(bases, np.int32), folds, seeds

    def hypers(self, run_ids: Sequence[tuple[int, int]]) -> Hyper:
        """Each run's values of the settings, leaves [R, ...]."""
        values = [jax.tree.map(np.asarray, hyper_of(c)) for c in self.settings]
        per_run = [values[self.setting_of(seed)] for _, seed in run_ids]
        return jax.tree.map(lambda *x: np.stack(x), *per_run)


def _setting_configs(cfg: Config, settings: Settings) -> tuple[Config, ...]:
    """Each setting's config: ``cfg`` with its overrides of :data:`SETTING_KEYS`."""
    keys = {k for setting in settings for k, _ in setting}
    if not settings or cfg.train.seeds % len(settings) or not keys <= set(SETTING_KEYS):
        raise UserError(
            f"settings {sorted(keys)} x {len(settings)}: must be {', '.join(SETTING_KEYS)} only, "
            f"and divide train.seeds={cfg.train.seeds}"
        )
    seeds = f"train.seeds={cfg.train.seeds // len(settings)}"  # as its own run's
    with as_user_error(ValueError):
        configs = [apply_overrides(cfg, [seeds, *(f"{k}={v}" for k, v in s)]) for s in settings]
    if cfg.train.act_risk == 0 and any(c.train.act_risk > 0 for c in configs):
        raise UserError(  # acting's std is compiled only then (jdqn.agent.acting)
            "settings of train.act_risk > 0 need the run's train.act_risk > 0; fix: set it to "
            "one of theirs"
        )
    return tuple(configs)


def _run_all_folds(job: _Job, layout: placement.RunLayout) -> list[dict[str, Any]]:
    """Every group's result rows (process 0's; the others train their share and return none).
    A group whose learners do not fit at once runs in waves, each a group of its own."""
    # One group's runs are judged on the host while the next group trains (one thread: the
    # rows and test-window series keep their order).
    judged: list[Future[list[dict[str, Any]]]] = []
    with background.Overlap(workers=1) as judging:
        for index, (fold_ids, wave) in enumerate(layout.groups(_fold_groups(job.cfg, job.data))):
            for rows in judged:  # a group whose judging failed stops the run before the next
                if rows.done() and rows.exception() is not None:
                    rows.result()
            preparing = time.perf_counter()
            programs = _group_programs(job, index, fold_ids, wave, layout.devices)
            _debug("jdqn: group %d prepared in %.1f s", index, time.perf_counter() - preparing)
            judged.append(_run_group(job, programs, judging))
        return [row for rows in judged for row in rows.result()]


def _fold_groups(cfg: Config, data: WalkForwardData) -> list[list[int]]:
    """Folds trained together: all of them (rolling windows, one vmapped program) or one at a
    time (expanding windows differ in length)."""
    folds = range(len(data.folds))
    return [list(folds)] if cfg.walkforward.mode == "rolling" else [[k] for k in folds]


def _layout(
    cfg: Config,
    data: WalkForwardData,
    devices: int | None,
    debug: bool,
    run: rundir.RunDir | None,
    processes: Processes,
) -> placement.RunLayout:
    """Devices and waves of the run (a resumed run keeps the waves it started with); every
    process runs the smallest waves any of them can hold, so that their shares stay in step."""
    groups = _fold_groups(cfg, data)
    with as_user_error(placement.PlacementError):
        layout = placement.run_layout(
            cfg, data, groups, devices, debug=debug, resumed=run, processes=processes.count
        )
    return dataclasses.replace(layout, wave_sizes=tuple(processes.smallest(layout.wave_sizes)))


class RunKeys(NamedTuple):
    """Each run's keys, [R, 2] uint32 (R = folds x seeds of a group)."""

    training: jax.Array  # fold_in(fold_in(PRNGKey(seed), fold), seed index): init and training
    evaluation: jax.Array  # fold_in(training, 2**20): the greedy test-window pass
    baselines: jax.Array  # fold_in(training, 2**21): the random baseline of the run's fold


@jax.jit
def run_keys(base: int | jax.Array, folds: jax.Array, seeds: jax.Array) -> RunKeys:
    """Every key of a group's runs from the config seed (``base``, or one per run) and each run's
    (fold, seed index), in one small program (op-by-op derivation compiled a program per
    operation on a cold start)."""
    training = jax.vmap(
        lambda b, f, s: jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(b), f), s)
    )(jnp.broadcast_to(jnp.asarray(base, jnp.int32), jnp.shape(folds)), folds, seeds)
    fold_in = jax.vmap(jax.random.fold_in, (0, None))
    return RunKeys(training, fold_in(training, 2**20), fold_in(training, 2**21))


def _executable_cache(cfg: Config, debug: bool) -> ExecutableCache:
    """Compiled programs on disk next to the compilation cache, on the GPU. Off with that cache,
    for debug runs (their checked programs are compiled in each process) and on CPU: XLA:CPU
    shares the machine code of identical small kernels between the executables of one process,
    so an executable compiled after another is not whole when serialised."""
    on = cfg.output.compilation_cache and not debug and jax.default_backend() == "gpu"
    # accel.pieces=executables=off: to time them (benchmarks)
    on = on and choose(cfg, backend=jax.default_backend(), debug=debug, learners=1).executables
    return ExecutableCache(cache_root() / "executables" if on else None)


def _stack(arrays: Sequence[FoldArrays]) -> FoldData:
    """Folds of equal length on a leading axis, on the device."""
    stacked = stack_folds(arrays)
    return FoldData(features=jnp.asarray(stacked.features), close=jnp.asarray(stacked.close))


def _take(stacked: FoldData, index: jax.Array) -> FoldData:
    return jax.tree.map(lambda a: a[index], stacked)


class RunOutputs(NamedTuple):
    """What judging and the policy bundles read of a group's trained runs: host arrays
    ``[R, ...]``, the form process 0 gathers from every process (``jdqn.run.processes``)."""

    rollouts: Any  # jdqn.evaluation.env.Rollout of the greedy test-window pass, leaves [R, T]
    guard: Any  # the learner's GuardRecord, leaves [R]
    learner_steps: np.ndarray  # [R] int32
    iterations: np.ndarray  # [R] int32
    halted_epoch: np.ndarray  # [R] int32, the epoch in which a run halted; -1: it did not
    network: policy_bundle.Network  # the trained parameters, masks and spectral-norm vectors


@dataclass(frozen=True)
class GroupPrograms:
    """A group's runs, placement, fold data and programs: the vmapped init, chunk and evaluation
    of its runs, compiled on demand (each over the placement's devices, ``jdqn.run.placement``)."""

    index: int  # the group's number (checkpoints/group<index>)
    fold_ids: list[int]
    wave: list[tuple[int, int]]  # its (fold, seed) runs, over every process
    run_ids: list[tuple[int, int]]  # this process's share of them (jdqn.run.processes)
    place: placement.Placement
    train: FoldData  # [G, ...] the group's train windows, on every device
    test: FoldData  # [G, ...] its test windows
    program: TrainProgram
    local_fold: jax.Array  # [padded] int32: run r trains the group's fold local_fold[r]
    local_hyper: Hyper  # leaves [padded, ...]: run r's values of the settings
    compile_program: Callable[..., Any]  # ExecutableCache.compile with the group's context
    init_all: Callable[..., Any]  # jit(vmap(init)) over the runs
    init_types: tuple[Any, ...]  # the init program's argument types
    stored_init: Any  # a warm start's stored init program, or None
    run_chunk: Callable[..., Any]  # one run's chunk (checked in debug mode)
    evaluate_run: Callable[..., Any]  # one run's greedy test-window pass

    def init(self, training_keys: jax.Array) -> TrainState:
        """Every run's initial state."""
        args = (training_keys, self.local_fold, self.local_hyper, self.train)
        init_all = self.stored_init or self.compile_program("init_run", self.init_all, *args)
        return init_all(*args)

    def compile_chunk(self) -> Callable[..., Any]:
        """The chunk program, compiled for the state's type, from the stored init program or
        traced from init without running it; it runs any epoch and chunk number and any
        restored state of that type."""
        state_type = (
            _abstract(self.stored_init.out_info)
            if self.stored_init is not None
            else jax.eval_shape(self.init_all, *self.init_types)
        )
        chunk_all = self.place.vmap(self.run_chunk, (0, 0, None, None, None), donate_argnums=0)
        zero = jnp.int32(0)
        return self.compile_program(
            "run_chunk", chunk_all, state_type, self.local_fold, zero, zero, self.train
        )

    def compile_evaluate(self, state_type: Any, evaluation_keys: jax.Array) -> Callable[..., Any]:
        evaluate_all = self.place.vmap(self.evaluate_run, (0, 0, 0, None))
        args = (state_type, self.local_fold, evaluation_keys, self.place.shared(self.test))
        return self.compile_program("evaluate_run", evaluate_all, *args)


def _group_programs(
    job: _Job,
    index: int,
    fold_ids: list[int],
    wave: list[tuple[int, int]],
    devices: tuple[Any, ...],
) -> GroupPrograms:
    """The placement, data and programs of this process's share of the runs ``wave`` of folds
    ``fold_ids``."""
    cfg, data, debug = job.cfg, job.data, job.debug
    non_causal = tuple(data.feature_groups.get(cfg.loss.non_causal_group, ()))
    run_ids = job.processes.share(wave)
    place = placement.Placement(devices[: len(run_ids)], len(run_ids))  # no idle device
    train = place.shared(_stack([data.train[k] for k in fold_ids]))
    program = make_train(
        cfg,
        train.features.shape[-1],
        train.features.shape[1],
        non_causal,
        debug=debug,
        learners=place.per_device,  # what each device's kernels see
    )
    # Run r trains fold run_ids[r][0] with seed run_ids[r][1]; the padding repeats the last.
    local_fold = place.learner_arrays(np.asarray([fold_ids.index(f) for f, _ in run_ids], np.int32))
    local_hyper = place.learner_arrays(job.hypers(run_ids))

    # The programs take the folds' data as an argument (not a closure), so that a compiled
    # program depends only on what ``context`` and the arguments' types say
    # (jdqn.accel.executables):
    # every config section but output, the permuted feature columns, debug mode, each speed
    # piece's implementation and the mesh (a stored program runs on the devices it was built for).
    executables = _executable_cache(cfg, debug)
    sections = {k: v for k, v in json.loads(cfg.to_json()).items() if k != "output"}
    pieces = choose(cfg, backend=jax.default_backend(), debug=debug, learners=place.per_device)
    context = json.dumps([sections, non_causal, debug, repr(pieces)], sort_keys=True)
    if len(place.devices) > 1:
        context += f"|devices={len(place.devices)}"

    # Named functions: the compile events and the stored programs carry these names.
    def init_run(key: jax.Array, i: jax.Array, hyper: Hyper, data: FoldData) -> TrainState:
        return program.init(key, _take(data, i), hyper)

    def run_chunk(s: TrainState, i: jax.Array, e: jax.Array, c: jax.Array, data: FoldData) -> Any:
        return program.run_chunk(s, _take(data, i), e, c)

    def evaluate_run(s: TrainState, i: jax.Array, key: jax.Array, data: FoldData) -> Any:
        return program.evaluate(s, _take(data, i), key)

    key_type = place.padded_type(jax.eval_shape(run_keys, *job.key_seeds(run_ids)))
    init_types = (key_type.training, local_fold, local_hyper, train)
    return GroupPrograms(
        index=index,
        fold_ids=fold_ids,
        wave=wave,
        run_ids=run_ids,
        place=place,
        train=train,
        test=_stack([data.test[k] for k in fold_ids]),
        program=program,
        local_fold=local_fold,
        local_hyper=local_hyper,
        compile_program=functools.partial(executables.compile, context=context),
        init_all=place.vmap(init_run, (0, 0, 0, None)),
        init_types=init_types,
        # A warm start's stored init program; its output type is the state's (no tracing).
        stored_init=executables.load("init_run", *init_types, context=context),
        # Debug: checkify inside the vmap keeps one error entry per run (fold, seed).
        run_chunk=debug_mode.checked(run_chunk) if debug else run_chunk,
        evaluate_run=evaluate_run,
    )


def _run_group(
    job: _Job, programs: GroupPrograms, judging: Executor
) -> Future[list[dict[str, Any]]]:
    """Train this process's share of a group's runs as one vmapped program, sharded over its
    placement's devices, and evaluate them; process 0 judges the whole wave on ``judging``
    (``jdqn.run.processes``): its result rows, the others none. The last checkpoint's write goes
    on while the runs are evaluated and judged (a sweep wave's is 11 GiB)."""
    processes, wave = job.processes, programs.wave
    started = time.perf_counter()
    with background.Overlap() as overlap, _group_checkpoints(job, programs) as checkpoints:
        # The training program compiles on a worker thread meanwhile (docs/design.md §13).
        compiling_chunk = overlap.submit(programs.compile_chunk)
        keys = programs.place.learner_arrays(run_keys(*job.key_seeds(programs.run_ids)))
        baselines = _submit_baselines(overlap, job, programs) if processes.writer else None
        state = programs.init(keys.training)
        # For the state's type, not its buffers: the first chunk donates them while the
        # evaluation program may still be compiling.
        compiling_evaluate = overlap.submit(
            programs.compile_evaluate, _abstract(state), keys.evaluation
        )
        chunk_all = compiling_chunk.result()
        state, halted_epoch = _train_group(job, programs, checkpoints, state, chunk_all)
        trained = time.perf_counter()
        outputs = _evaluate_group(programs, compiling_evaluate.result(), state, keys, halted_epoch)
        by_fold = None if baselines is None else baselines()
        evaluated = time.perf_counter()
        outputs = processes.gather(outputs, len(wave))
        rows = judging.submit(_judge_and_keep, job, programs, outputs, by_fold)
        gathered = time.perf_counter()
    message = "jdqn: group %d of %d runs: trained in %.1f s, evaluated %.1f s, "
    message += "the checkpoint written %.1f s after"
    waits = (trained - started, evaluated - trained, time.perf_counter() - gathered)
    _debug(message, programs.index, len(wave), *waits)
    return rows


def _judge_and_keep(
    job: _Job,
    programs: GroupPrograms,
    outputs: RunOutputs,
    by_fold: dict[int, dict[str, Any]] | None,
) -> list[dict[str, Any]]:
    """Process 0: the wave's result rows, and its policies saved by setting; the other processes
    (no baselines ``by_fold``): none."""
    if by_fold is None:
        return []
    started, wave = time.perf_counter(), programs.wave
    rows = _judge_group(job, outputs, wave, by_fold)
    kept = job.settings if job.cfg.output.policies else ()  # a sweep's selection runs: none
    for k, setting_cfg in enumerate(kept):  # each policy with its setting's config
        runs = [r for r, (_, seed) in enumerate(wave) if job.setting_of(seed) == k]
        policy_bundle.save_run_policies(
            policy_root(job.run.path, k, len(job.settings)),
            setting_cfg,
            job.data,
            programs.program.learner.layout,
            jax.tree.map(lambda x, runs=runs: x[np.asarray(runs, int)], outputs.network),
            job.own_ids([wave[r] for r in runs]),
            [rows[r] for r in runs],
            job.writes.submit,
        )
    _debug("jdqn: group %d judged in %.1f s", programs.index, time.perf_counter() - started)
    return rows


def policy_root(run_dir: Path, setting: int, settings: int) -> Path:
    """Where a run's policies of ``setting`` lie, numbered by their seeds within it: the run
    directory itself, or with several settings its ``setting<k>``."""
    return run_dir if settings == 1 else run_dir / f"setting{setting}"


def _submit_baselines(
    overlap: Any, job: _Job, programs: GroupPrograms
) -> Callable[[], dict[int, dict[str, Any]]]:
    """Start each fold's baselines on ``overlap``'s threads (seeded by the keys of the whole
    wave's runs, as in one process); returns the function that waits for them."""
    # Each fold's seed-0 key, whichever wave (and setting) holds the fold's first run.
    keys = run_keys(*job.key_seeds([(f, 0) for f, _ in programs.wave]))
    baselines = overlap.submit(_baselines, job, programs, np.asarray(keys.baselines))
    extras = overlap.submit(_extra_baselines, job.cfg, job.data, programs.fold_ids)

    def by_fold() -> dict[int, dict[str, Any]]:
        return {fold: rows | extras.result()[fold] for fold, rows in baselines.result().items()}

    return by_fold


def _evaluate_group(
    programs: GroupPrograms,
    evaluate_all: Callable[..., Any],
    state: TrainState,
    keys: RunKeys,
    halted_epoch: dict[int, int],
) -> RunOutputs:
    """The trained runs' greedy test-window pass and what judging reads of their state, on the
    host, without the padding."""
    learners = len(programs.run_ids)
    rollouts = evaluate_all(
        state, programs.local_fold, keys.evaluation, programs.place.shared(programs.test)
    )
    learner = state.learner
    network = policy_bundle.Network(learner.params, learner.masks, learner.sn_u)
    rollouts, guard, steps, iterations, network = host(
        (rollouts, learner.guard, learner.step, state.iteration, network), learners
    )
    halted = np.asarray([halted_epoch.get(r, -1) for r in range(learners)], np.int32)
    return RunOutputs(rollouts, guard, steps, iterations, halted, network)


def _abstract(tree: Any) -> Any:
    """The type of every array leaf (shape, dtype, weak type, placement), without its buffer."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=x.sharding, weak_type=jax.typeof(x).weak_type
        ),
        tree,
    )


@contextlib.contextmanager
def _group_checkpoints(job: _Job, programs: GroupPrograms) -> Iterator[GroupCheckpoints]:
    """The group's checkpoints; on leaving, the last write is waited for (and its error raised)."""
    checkpoints = GroupCheckpoints(
        job.run.checkpoint_dir / f"group{programs.index}",
        enabled=job.cfg.output.checkpoints,
        processes=job.processes,
        seal=job.seal,
        place=programs.place,
        runs=len(programs.wave),
        chunks_per_epoch=programs.program.chunks_per_epoch,
        param_layout=programs.program.learner.layout.record(),
        cadence=job.save_cadence,
    )
    try:
        yield checkpoints
    finally:  # also on failure: no thread or file left open behind the one-line error
        checkpoints.close()


def _train_group(
    job: _Job,
    programs: GroupPrograms,
    checkpoints: GroupCheckpoints,
    state: TrainState,
    chunk_all: Callable[..., Any],
) -> tuple[TrainState, dict[int, int]]:
    """Every epoch of this process's share of a group, from its initial (or last checkpointed)
    state; returns the trained state and the epoch in which each halted run halted (by this
    process's run index). Process 0 logs the metrics of the whole wave."""
    cfg, run, writes, processes, log = job.cfg, job.run, job.writes, job.processes, job.log
    program, local_fold, train = programs.program, programs.local_fold, programs.train
    group_index, run_ids, wave = programs.index, programs.run_ids, programs.wave
    start_epoch, start_chunk, halted_epoch = 0, 0, {}
    resumed = checkpoints.resume(state, log)
    if resumed is not None:
        state, meta = resumed
        start_epoch = int(meta["epochs_done"])
        start_chunk = int(meta.get("chunks_done", 0))  # > 0: saved mid-epoch, at a SIGTERM
        halted_epoch = meta["halted_epoch"]
        within = f", chunk {start_chunk} of epoch {start_epoch + 1}" if start_chunk else ""
        log(f"jdqn: resumed group {group_index} after epoch {start_epoch}{within}")
    metrics_log = None  # process 0 logs the whole wave's metrics
    if processes.writer:
        metrics_log = MetricsLog(run, cfg, wave, group_index, start_epoch, writes, start_chunk)
    # Imported at its first use, not before training (jdqn.run.metrics_log).
    later_imports = [TENSORBOARD] if cfg.output.tensorboard else []

    total = (cfg.train.epochs - start_epoch) * program.chunks_per_epoch - start_chunk
    bar: Any = None
    if job.progress and total > 0:
        from tqdm.auto import tqdm

        label = f"folds {programs.fold_ids} x {cfg.train.seeds} seed(s)"
        # Counted in iterations, so the rate reads lock-step iterations/s (x slices x runs).
        bar = tqdm(total=total, desc=label, unit="it", unit_scale=program.chunk_length, leave=False)
    completed = False
    try:
        # A SIGTERM or Ctrl-C lets the chunk on the device end; its state is checkpointed, then
        # the run stops (jdqn.run.termination).
        with termination.ChunkBoundaries() as boundaries:
            for epoch in range(start_epoch, cfg.train.epochs):
                first_chunk = start_chunk if epoch == start_epoch else 0
                for chunk in range(first_chunk, program.chunks_per_epoch):
                    started = time.perf_counter()
                    result = chunk_all(state, local_fold, jnp.int32(epoch), jnp.int32(chunk), train)
                    if epoch == start_epoch and chunk == first_chunk:
                        # The chunk is queued and this thread now waits on the device: the
                        # writer thread imports what the metrics need.
                        writes.prefetch(later_imports)
                    error, (state, chunk_metrics) = result if job.debug else (None, result)
                    record = host((state.learner.step, chunk_metrics), len(run_ids))
                    elapsed = time.perf_counter() - started  # _host waited for the chunk
                    message = "jdqn: group %d epoch %d chunk %d: %.2f s"
                    _debug(message, group_index, epoch + 1, chunk + 1, elapsed)
                    steps, metrics = processes.gather(record, len(wave))  # [R], [R, L] of the wave
                    summary = metrics_log.add(epoch, chunk, steps, metrics) if metrics_log else {}
                    if error is not None:  # fetched once per chunk, with the chunk's metrics
                        debug_mode.raise_if_failed(
                            error, run_ids=run_ids, epoch=epoch, chunk=chunk, run_dir=run.path
                        )
                    halted = np.asarray(state.learner.guard.halted)[: len(run_ids)]
                    for r in np.flatnonzero(halted):
                        halted_epoch.setdefault(int(r), epoch)
                    if bar is not None:
                        epochs = f"{epoch + 1}/{cfg.train.epochs}"
                        bar.set_postfix({"epoch": epochs, **summary}, refresh=False)
                        bar.update(1)
                    # Every process stops at the chunk where any of them saw a SIGTERM (a
                    # checkpoint gathers from all of them).
                    stop = processes.any_of(boundaries.requested)
                    if stop and chunk + 1 < program.chunks_per_epoch:
                        checkpoints.save(epoch, chunk + 1, state, halted_epoch, required=True)
                        raise boundaries.interruption()
                stop = processes.any_of(boundaries.requested)
                checkpoints.save(epoch + 1, 0, state, halted_epoch, required=stop)
                if stop:
                    raise boundaries.interruption()
        completed = True
    finally:  # also on failure: no thread or file left open behind the one-line error
        if bar is not None:
            bar.close()
        if metrics_log is not None:
            metrics_log.close(write_plots=completed)
    return state, halted_epoch


def _baselines(job: _Job, programs: GroupPrograms, keys: np.ndarray) -> dict[int, dict[str, Any]]:
    """Each fold's baselines on its test window, seeded by ``keys`` (one per run of the wave,
    each its fold's seed-0 key): one program for the group's folds
    (``evaluate.baseline_rollouts`` vmapped)."""
    cfg, test = job.cfg, programs.test
    wave_folds = [fold for fold, _ in programs.wave]
    folds = list(dict.fromkeys(wave_folds))  # each once, in the order of its first run
    local = np.asarray([programs.fold_ids.index(fold) for fold in folds], np.int32)
    fold_keys = keys[[wave_folds.index(fold) for fold in folds]]

    def baselines_run(i: jax.Array, key: jax.Array, data: FoldData) -> Any:
        fold = _take(data, i)
        params = make_params(fold.features, fold.close, cfg.env)
        return baseline_rollouts(params, key, cfg.env)

    program = programs.compile_program(
        "baselines_run", jax.jit(jax.vmap(baselines_run, (0, 0, None))), local, fold_keys, test
    )
    records = jax.device_get(program(local, fold_keys, test))
    n_steps = test.close.shape[-1] - 1  # the whole window is one episode
    return {
        fold: baseline_results(
            jax.tree.map(lambda x, j=j: x[j], records),
            n_steps,
            point_value_usd=cfg.env.point_value_usd,
            bars_per_year=job.data.bars_per_year,
        )
        for j, fold in enumerate(folds)
    }


def _extra_baselines(
    cfg: Config, data: WalkForwardData, fold_ids: list[int]
) -> dict[int, dict[str, Any]]:
    """Each fold's momentum, MACD, ridge and (synthetic data) informed baselines, tuned on its
    train window (``jdqn.evaluation.baselines``), on the host."""
    return {fold: fold_baselines(cfg, data, fold) for fold in fold_ids}


def _judge_group(
    job: _Job,
    outputs: RunOutputs,
    run_ids: list[tuple[int, int]],
    baselines_by_fold: dict[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    """Each run's result row from its test-window rollout, with its fold's baselines; the
    equity CSVs and plots are handed to the writer thread; each run's per-bar net PnL is added
    to ``job.series``."""
    cfg, data, run, writes = job.cfg, job.data, job.run, job.writes
    guard, rollouts = outputs.guard, outputs.rollouts
    calendar = CALENDARS[cfg.data.calendar]
    rows: list[dict[str, Any]] = []
    for r, (fold, seed) in enumerate(run_ids):
        fold_window = data.folds[fold]
        timestamps = data.test_timestamps[fold]
        halted = bool(guard.halted[r])
        status = "ok"
        if halted:
            reason, epoch = GUARD_REASONS[int(guard.reason[r])], int(outputs.halted_epoch[r])
            status = f"halted: {reason} at epoch {max(epoch, 0) + 1} step {int(guard.step[r])}"
        judged = judge_run(
            fold,
            seed,
            jax.tree.map(lambda x, r=r: np.asarray(x[r]), rollouts),
            baselines_by_fold[fold],
            timestamps,
            halted=halted,
            point_value_usd=cfg.env.point_value_usd,
            bars_per_year=data.bars_per_year,
            calendar=calendar,
        )
        job.series.append(judged.series)
        what = f"out-of-sample equity ({status})"
        report.write_judged(writes, run.path, judged, timestamps, what, cfg, cfg.output.plots)
        rows.append(
            {
                "fold": fold,
                "seed": seed,
                "status": status,
                "window": {
                    "train": [fold_window.train_start, fold_window.train_end],
                    "test": [fold_window.test_start, fold_window.test_end],
                    "test_time": [str(timestamps[0]), str(timestamps[-1])],
                },
                "agent": judged.agent,
                "baselines": judged.baselines,
                "training": {
                    "learner_steps": int(outputs.learner_steps[r]),
                    "iterations": int(outputs.iterations[r]),
                },
            }
        )
    return rows
