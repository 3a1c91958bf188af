"""``python -c code`` in a fresh process, shared by tests that need a clean interpreter (what a
module imports, how a process ends)."""

from __future__ import annotations

import subprocess
import sys


def run_child(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in a fresh process, its output captured; the caller checks the status."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=False
    )
