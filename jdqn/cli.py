"""Command line: ``jdqn walkforward | sweep | evaluate | data synth | data check | config keys |
bench``; parses only.

A command raises ``ValueError`` (or ``OSError``) for bad input and :func:`main` alone prints it:
one line ``jdqn: error: ...`` naming the problem and the fix, exit 2, no traceback. The exit
statuses (the ``EXIT_*`` constants) are the README's table "Exit codes".
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from jdqn.accel.xla_flags import configure
from jdqn.config import PROFILES, Config, apply_overrides, profile
from jdqn.config.files import load_config_file
from jdqn.config.keys import config_keys, format_keys
from jdqn.evaluation.instruments import apply_instrument
from jdqn.run import console_log

EXIT_USER_ERROR = 2
EXIT_HALTED = 3
EXIT_DEBUG_FAILURE = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM (jdqn.run.termination: the run stops as for a Ctrl-C)
DEFAULT_PROFILE = "default"
# The flags that choose a run's config; --resume refuses them (the run has its own).
CONFIG_FLAGS = (
    "config", "profile", "data", "instrument", "out", "folds", "epochs", "seeds", "seed",
)  # fmt: skip
SMOKETEST_ON_USER_BARS = (
    "jdqn: notice: --profile smoketest is the CI-sized learner (batch 64, buffer 256, 4 epochs): "
    "its numbers on your bars say little; for a real run use --profile default"
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one ``jdqn: error:`` line with exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USER_ERROR, f"jdqn: error: {message}; see `{self.prog} --help`\n")


class _VersionAction(argparse.Action):
    """Prints ``jdqn X.Y.Z (git SHA)`` and exits 0; the commit is read only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from jdqn.run.provenance import version_line

        print(version_line())
        parser.exit(0)


def _build_parser() -> argparse.ArgumentParser:
    # -v / -q, accepted before or after the command (``jdqn -q walkforward ...``): a plain parent
    # parser (add_parser's stub wants a _Parser).
    common: Any = argparse.ArgumentParser(add_help=False)
    levels = common.add_mutually_exclusive_group()
    levels.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,  # a subcommand's default must not reset the top level's
        help="more console output: how the bars were read, the memory plan, compile and chunk "
        "times",
    )
    levels.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="warnings, errors, halts and where the results went; no progress bar",
    )
    parser = _Parser(
        prog="jdqn",
        description="Train a distributional (C51) DQN to trade futures and judge it walk-forward. "
        "A command's --help lists its options.",
        parents=[common],
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    commands = _subcommands(parser, "command")

    def command(group: Any, name: str, help: str) -> argparse.ArgumentParser:  # -v, -q in each
        return group.add_parser(name, help=help, parents=[common])

    _add_walkforward(command(commands, "walkforward", "train and judge the agent walk-forward"))
    _add_sweep(command(commands, "sweep", "train many settings, choose each fold's on validation"))

    config = _subcommands(command(commands, "config", "configuration tools"), "config_command")
    keys = command(config, "keys", "list the --set keys: type, value, description")
    keys.add_argument("--profile", default=DEFAULT_PROFILE, choices=sorted(PROFILES))
    keys.add_argument("--instrument", help="show the values with this instrument preset")
    about = "judge a run's saved policies on new bars, as a walk-forward test window"
    ev = command(commands, "evaluate", about)
    ev.add_argument("run_dir", metavar="RUN_DIR", help="a finished walk-forward run directory")
    ev.add_argument("--data", required=True, help="bar file (CSV/Parquet) to judge them on")
    ev.add_argument("--fold", type=int, help="whose policies (default: the run's last fold)")
    ev.add_argument("--out", help="parent of the output directory (default: RUN_DIR/evaluations)")
    _add_set(
        ev,
        "data.FIELD=VALUE",
        "read the file otherwise than the run read its own: data.columns, data.timezone "
        "or data.timestamp_format, e.g. --set data.timezone=UTC (default: the run's)",
    )

    data = _subcommands(command(commands, "data", "bar-file tools"), "data_command")
    synth = command(data, "synth", "write synthetic ES-like 1-minute bars")
    synth.add_argument("--bars", type=int, default=60_000)
    synth.add_argument("--out", required=True, help="output file (.csv or .parquet)")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument(
        "--signal", type=float, default=0.0, help="planted signal strength (0 = none)"
    )
    check = command(data, "check", "load and validate a bar file")
    check.add_argument("path")
    check.add_argument("--instrument", default="ES", help="preset whose calendar and scale apply")
    _add_set(
        check,
        "data.FIELD=VALUE",
        "read the file as a run would, e.g. --set data.columns=time:ts --set data.timezone=UTC",
    )

    bench = command(commands, "bench", "jit-compiled benchmarks; prints a table")
    bench.add_argument("--json", help="also write the results as JSON to this file")
    bench.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only these sections (repeatable); default: all but learning (the scorecard)",
    )
    bench.add_argument("--quick", action="store_true", help="fewer repeats and sizes")
    return parser


def _subcommands(parser: argparse.ArgumentParser, dest: str) -> Any:
    return parser.add_subparsers(dest=dest, required=True, parser_class=_Parser)


def _add_set(parser: argparse.ArgumentParser, metavar: str, help: str) -> None:
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar=metavar, help=help
    )


def _add_config_flags(wf: argparse.ArgumentParser) -> None:
    """The flags that choose the config of ``walkforward`` and ``sweep`` (:data:`CONFIG_FLAGS`)."""
    wf.add_argument("--config", help="rerun a saved config.json (flags and --set apply on top)")
    wf.add_argument("--data", help="bar file (CSV/Parquet); default: built-in synthetic ES bars")
    wf.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        help="default: default (the profile that learns); smoketest: the CI-sized run",
    )
    wf.add_argument(
        "--instrument",
        help="instrument preset (ES, NQ, CL, GC, ZN, 6E, EURUSD, BTCUSD; default ES, the "
        "profiles' values): tick size, point value, costs, calendar; with "
        "env.reward_unit=points also the reward scale and C51 support",
    )
    wf.add_argument("--out", help="parent directory of the run directory (default: runs)")
    wf.add_argument("--folds", type=int, help="number of walk-forward folds")
    wf.add_argument("--epochs", type=int, help="training epochs per fold")
    wf.add_argument("--seeds", type=int, help="seeds per fold (vmapped with the folds)")
    wf.add_argument("--seed", type=int, help="base seed")
    wf.add_argument("--name", help="run directory name (default: run-<UTC timestamp>)")
    wf.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_set(
        wf,
        "SECTION.FIELD=VALUE",
        "override a config value, e.g. --set optim.learning_rate=3e-4 (repeatable)",
    )


def _add_walkforward(wf: argparse.ArgumentParser) -> None:
    """The ``walkforward`` command's flags."""
    _add_config_flags(wf)
    wf.add_argument("--print-config", action="store_true", help="print the resolved config, exit")
    wf.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run (.incomplete dir)")
    wf.add_argument(
        "--resume-changed",
        action="store_true",
        help="with --resume: continue although config.json or the data file changed since the "
        "run started (recorded in results.json)",
    )
    wf.add_argument("--debug", action="store_true", help="chex checks at component boundaries")
    wf.add_argument(
        "--devices",
        type=int,
        metavar="N",
        help="local devices that share the learners (default: all of them)",
    )
    # One run over several processes (jdqn.run.processes); under SLURM or Open MPI read from the
    # launch.
    wf.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="process 0's address, for a run of several processes (with the next two flags)",
    )
    wf.add_argument(
        "--num-processes", type=int, metavar="N", help="processes that share the learners"
    )
    wf.add_argument("--process-id", type=int, metavar="I", help="this process's number, 0 to N - 1")


def _add_sweep(sweep: argparse.ArgumentParser) -> None:
    """The ``sweep`` command's flags: the settings, the rule, and walk-forward's config flags."""
    _add_config_flags(sweep)
    sweep.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="a key and its values (repeatable; all combinations); a tuple key's values are "
        "separated by /; with --samples also lo..hi or log:lo..hi",
    )
    sweep.add_argument("--samples", type=int, help="N random settings instead of the whole grid")
    sweep.add_argument("--rule", default="median", help="median (default) or lcb")
    sweep.add_argument("--validation-bars", type=int, help="default: 30 %% of the train window")
    sweep.add_argument("--resume", metavar="SWEEP_DIR", help="continue a killed sweep")


def resolve_config(args: argparse.Namespace) -> Config:
    """Profile, then the convenience flags, then ``--set`` overrides (validated once)."""
    overrides: list[str] = []
    if args.data:
        overrides.append(f"data.path={args.data}")
    if args.out:
        overrides.append(f"output.out_dir={args.out}")
    for flag, key in (
        ("folds", "walkforward.n_folds"),
        ("epochs", "train.epochs"),
        ("seeds", "train.seeds"),
        ("seed", "train.seed"),
    ):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}")
    base = base_config(args.config, args.profile)
    if args.instrument is not None:
        base = apply_instrument(base, args.instrument)
    return apply_overrides(base, overrides + list(args.overrides))


def base_config(config_path: str | None, profile_name: str | None) -> Config:
    """What flags and ``--set`` apply to: a saved config, or a profile (default ``default``)."""
    if config_path is not None:
        if profile_name is not None:
            raise ValueError(
                f"--config {config_path} already holds a whole config; fix: drop --profile"
            )
        return load_config_file(config_path)
    return profile(profile_name or DEFAULT_PROFILE)


def _walkforward(args: argparse.Namespace) -> int:
    from jdqn.agent.debug import DebugCheckFailed
    from jdqn.run.processes import start
    from jdqn.run.walkforward import run_walkforward

    flags = (*CONFIG_FLAGS, "name")
    if args.resume and (args.overrides or any(getattr(args, f) is not None for f in flags)):
        raise ValueError(
            "--resume continues a run with its own config.json; fix: drop --data, --config, "
            "--profile, --instrument, --out, --folds, --epochs, --seeds, --seed, --name and --set"
        )
    if args.resume_changed and not args.resume:
        raise ValueError("--resume-changed goes with --resume RUN_DIR")
    try:
        cfg = None if args.resume else resolve_config(args)
        if args.print_config:  # a resumed run's is its config.json
            shown = cfg if cfg is not None else load_config_file(Path(args.resume) / "config.json")
            with contextlib.suppress(BrokenPipeError):  # `| head`: the reader went away
                print(shown.to_json())
            return 0
        logger = logging.getLogger(console_log.LOGGER_NAME)
        # Said once the bars have loaded (with the run's first line): a bad file stays one line.
        on_user_bars = cfg is not None and cfg.data.path is not None
        notices = [SMOKETEST_ON_USER_BARS] if on_user_bars and args.profile == "smoketest" else []

        def log(message: str) -> None:
            while notices:  # on stdout: stderr keeps a later error to its one line
                logger.info(notices.pop())
            logger.info(message)

        # Before any other use of a JAX backend (jax.distributed.initialize).
        processes = start(args.coordinator, args.num_processes, args.process_id, log)
        outcome = run_walkforward(
            cfg,
            resume=args.resume,
            debug=args.debug,
            progress=not args.no_progress and not getattr(args, "quiet", False),
            log=log,
            log_outcome=console_log.outcome,
            name=args.name,
            plot_processes=True,
            devices=args.devices,
            processes=processes,
            resume_changed=args.resume_changed,
        )
    except DebugCheckFailed as failure:
        print(f"jdqn: {failure} (recorded in {failure.record})", file=sys.stderr)
        return EXIT_DEBUG_FAILURE
    return EXIT_HALTED if outcome.halted else 0


def _sweep(args: argparse.Namespace) -> int:
    from jdqn.run.sweep import SweepPlan, grid_settings, run_sweep

    cfg = plan = None
    if args.resume is None:
        cfg = resolve_config(args)
        settings = grid_settings(cfg, args.grid, args.samples, cfg.train.seed)
        plan = SweepPlan(settings, args.rule, args.validation_bars)
    else:
        flags = (*CONFIG_FLAGS, "name", "samples", "validation_bars")
        if args.grid or args.overrides or any(getattr(args, f) is not None for f in flags):
            raise ValueError(
                "--resume continues a sweep with its own plan and config; fix: drop the other flags"
            )
    progress = not args.no_progress and not getattr(args, "quiet", False)
    log = logging.getLogger(console_log.LOGGER_NAME).info
    outcome = run_sweep(cfg, plan, resume=args.resume, name=args.name, progress=progress, log=log)
    return EXIT_HALTED if outcome.halted else 0


def _evaluate(args: argparse.Namespace) -> int:
    from jdqn.evaluation.saved import evaluate_saved

    evaluate_saved(
        args.run_dir, args.data, fold=args.fold, out=args.out, data_overrides=args.overrides
    )
    return 0


def _data(args: argparse.Namespace) -> int:
    from jdqn.data import synthetic_bars, write_bars
    from jdqn.evaluation.instruments import data_settings, describe_bar_file, instrument
    from jdqn.run.memory import check_synth_request

    try:
        if args.data_command == "synth":
            if args.bars < 1_000:
                raise ValueError(f"--bars {args.bars}: use at least 1000 bars")
            if args.signal < 0:
                raise ValueError(f"--signal {args.signal}: must be >= 0")
            check_synth_request(args.bars)
            bars = synthetic_bars(args.bars, seed=args.seed, signal_strength=args.signal)
            write_bars(bars, args.out)
            print(f"wrote {len(bars):,} bars to {args.out}")
        else:
            preset = instrument(args.instrument)
            print(describe_bar_file(args.path, preset, data_settings(args.overrides, preset)))
    except MemoryError:  # past the estimate: the machine had less than it reported
        print("jdqn: error: out of memory; fix: fewer --bars", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


def _bench(args: argparse.Namespace) -> int:
    from jdqn.bench import json_problem
    from jdqn.bench.suite import run_all

    if args.json and (problem := json_problem(args.json)):
        raise ValueError(problem)
    run_all(sections=args.only, json_path=args.json, quick=args.quick)
    return 0


def _config(args: argparse.Namespace) -> int:
    from jdqn.evaluation.instruments import instrument, unit_descriptions

    units: dict[str, str] = {}
    cfg = profile(args.profile)
    if args.instrument is not None:
        cfg = apply_instrument(cfg, args.instrument)
        units = unit_descriptions(instrument(args.instrument))
    keys = [replace(k, description=units.get(k.key, k.description)) for k in config_keys(cfg)]
    print(format_keys(keys))
    return 0


def main(argv: Sequence[str] | None = None, *, ending: bool = False) -> int:
    """The command of ``argv``; its exit status. ``ending``: the process ends after it
    (:func:`console`), so an interrupted command ignores further signals."""
    configure()  # jdqn's XLA flags, before anything starts a JAX backend
    args = _build_parser().parse_args(argv)
    console_log.configure(getattr(args, "verbose", 0), getattr(args, "quiet", False))
    handlers = {
        "walkforward": _walkforward,
        "sweep": _sweep,
        "evaluate": _evaluate,
        "data": _data,
        "bench": _bench,
        "config": _config,
    }
    from jdqn.run.termination import Terminated

    try:
        return handlers[args.command](args)
    except (ValueError, OSError) as error:  # bad input or a storage failure: the problem, the fix
        print(f"jdqn: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as stop:
        # A walk-forward run has already removed its directory (nothing to resume) or printed
        # the --resume command; no traceback. The process ends now (``ending``): more Ctrl-Cs
        # would only interrupt this handler or print "Exception ignored".
        for signum in (signal.SIGINT, signal.SIGTERM) if ending else ():
            signal.signal(signum, signal.SIG_IGN)
        terminated = isinstance(stop, Terminated)  # SIGTERM: handled as Ctrl-C, its own status
        print("jdqn: terminated" if terminated else "jdqn: interrupted", file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


def end_process(code: int) -> NoReturn:
    """Flushes stdout and stderr and ends the process with ``code`` at once, skipping the
    interpreter's teardown (see :func:`console`); only for a process whose files are closed and
    whose threads are done. A stream that cannot be flushed (a reader that went away, as in
    ``jdqn ... | head``) is skipped: the command's own status stands."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def console() -> int:
    """The ``jdqn`` command (``jdqn.__main__.run``: the console script and ``python -m jdqn``):
    :func:`main`, then the process's end.

    A finished (0, 3), interrupted (130) or terminated (143) command has closed its files and
    joined its threads, so it ends at once (``os._exit``): the interpreter's teardown would add
    a sizeable share of a warm walk-forward's time, or wait for a compile left on a worker
    thread, during which a second Ctrl-C killed the process by the signal (seen in CI). A
    one-line error (2) ends the same way: a library's threads still reading a damaged checkpoint
    would otherwise print tracebacks during the teardown ("Event loop is closed"), past any
    hook, under the line that says what happened; checkpoints are verified by their manifests,
    so nothing they leave is trusted. Other statuses take the usual exit. SIGTERM ends the
    command as Ctrl-C does from its start (its imports included), not only once a run has
    begun."""
    from jdqn.run.termination import sigterm_raises

    with sigterm_raises():
        try:
            code = main(ending=True)
        except KeyboardInterrupt:  # a second Ctrl-C inside main's own handler
            print("jdqn: interrupted", file=sys.stderr)
            code = EXIT_INTERRUPTED
        if code in (0, EXIT_USER_ERROR, EXIT_HALTED, EXIT_INTERRUPTED, EXIT_TERMINATED):
            end_process(code)  # inside the block: no default action between here and the end
    return code


if __name__ == "__main__":
    sys.exit(console())
