"""Thin wrapper: ``python scripts/debug_run.py [args]`` == ``jdqn walkforward --debug [args]``."""

import sys

from jdqn.cli import main

if __name__ == "__main__":
    sys.exit(main(["walkforward", "--debug", *sys.argv[1:]]))
