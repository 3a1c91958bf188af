"""``python -m jdqn`` is the ``jdqn`` command."""

import sys

from jdqn.cli import main

sys.exit(main())
