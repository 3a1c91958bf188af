"""The command line's configuration and console flags: ``jdqn --version``, ``-v`` / ``-q``,
``jdqn config keys``, the flags of a run of several processes, and the base config of
``jdqn walkforward`` (``--config FILE`` or ``--profile NAME``). Parsing only; the work is in
:mod:`jdqn.config`, :mod:`jdqn.processes` and :mod:`jdqn.provenance`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from jdqn.config import PROFILES, Config, profile
from jdqn.config.files import load_config_file
from jdqn.config.keys import config_keys, format_keys

DEFAULT_PROFILE = "smoketest"


def console_flags() -> argparse.ArgumentParser:
    """``-v`` / ``-q``, accepted before or after the command (``jdqn -q walkforward ...``)."""
    flags = argparse.ArgumentParser(add_help=False)
    group = flags.add_mutually_exclusive_group()
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,  # a subcommand's default must not reset the top level's
        help="more console output (debug records)",
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="warnings and errors only, no progress bar",
    )
    return flags


class _VersionAction(argparse.Action):
    """Prints ``jdqn X.Y.Z (git SHA)`` and exits 0; the commit is read only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from jdqn.provenance import version_line

        print(version_line())
        parser.exit(0)


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")


def add_process_flags(walkforward: argparse.ArgumentParser) -> None:
    """``--coordinator``, ``--num-processes`` and ``--process-id``: one run over several
    processes (``jdqn.processes``); under SLURM or Open MPI they are read from the launch."""
    walkforward.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="process 0's address, for a run of several processes (with the next two flags)",
    )
    walkforward.add_argument(
        "--num-processes", type=int, metavar="N", help="processes that share the learners"
    )
    walkforward.add_argument(
        "--process-id", type=int, metavar="I", help="this process's number, 0 to N - 1"
    )


def add_config_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """``jdqn config keys [--profile NAME] [--instrument NAME]``."""
    config = commands.add_parser("config", help="configuration tools", parents=[common])
    config_commands = config.add_subparsers(
        dest="config_command", required=True, parser_class=type(config)
    )
    keys = config_commands.add_parser(
        "keys", help="list the --set keys: type, value, description", parents=[common]
    )
    keys.add_argument("--profile", default=DEFAULT_PROFILE, choices=sorted(PROFILES))
    keys.add_argument("--instrument", help="show the values with this instrument preset")


def config_command(args: argparse.Namespace) -> int:
    from jdqn.instruments import apply_instrument

    try:
        cfg = profile(args.profile)
        if args.instrument is not None:
            cfg = apply_instrument(cfg, args.instrument)
    except ValueError as error:
        print(f"jdqn: error: {error}", file=sys.stderr)
        return 2
    print(format_keys(config_keys(cfg)))
    return 0


def base_config(config_path: str | None, profile_name: str | None) -> Config:
    """What flags and ``--set`` apply to: a saved config, or a profile (default smoketest)."""
    if config_path is not None:
        if profile_name is not None:
            raise ValueError(
                f"--config {config_path} already holds a whole config; fix: drop --profile"
            )
        return load_config_file(config_path)
    return profile(profile_name or DEFAULT_PROFILE)


def resumed_config_text(run_dir: str | os.PathLike[str]) -> str:
    """The config.json of a run being resumed, as ``--print-config`` shows it."""
    path = Path(run_dir) / "config.json"
    return load_config_file(path).to_json()
