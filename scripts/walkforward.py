"""Thin wrapper: ``python scripts/walkforward.py [args]`` == ``jdqn walkforward [args]``."""

import sys

from jdqn.cli import main

if __name__ == "__main__":
    sys.exit(main(["walkforward", *sys.argv[1:]]))
