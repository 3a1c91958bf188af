"""Thin wrapper: ``python scripts/bench.py [args]`` == ``jdqn bench [args]``."""

import sys

from jdqn.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
