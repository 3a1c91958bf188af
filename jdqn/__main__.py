"""``python -m jdqn`` is the ``jdqn`` command."""

import sys

from jdqn.cli import console

sys.exit(console())
