"""What made a run: jdqn's version, the git commit of its source, the data file's digest.

``results.json`` carries :func:`run_record` (``"provenance"`` and the layout's ``schema_version``),
so a result can be traced to code and data. The commit is read with ``git`` from the directory
holding the package, when that is a work tree; ``dirty``: tracked files differed from it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import subprocess
from pathlib import Path
from typing import Any

# Version 2: results.json gained "provenance" (version 1 had none).
RESULTS_SCHEMA_VERSION = 2
_PACKAGE_DIR = Path(__file__).resolve().parent


def jdqn_version() -> str:
    """The installed distribution's version (pyproject.toml's ``version``)."""
    try:
        return importlib.metadata.version("jdqn")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def git_commit() -> dict[str, Any] | None:
    """``{"commit": sha, "dirty": bool}`` of the source tree, or None outside a git checkout."""
    try:
        sha = _git("rev-parse", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": sha, "dirty": dirty}


def _git(*args: str) -> str:
    command = ["git", "-C", str(_PACKAGE_DIR.parent), *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()


def version_line() -> str:
    """``jdqn 0.1.0 (git 2acb85d1)``, as ``jdqn --version`` prints it."""
    commit = git_commit()
    if commit is None:
        return f"jdqn {jdqn_version()}"
    modified = ", modified" if commit["dirty"] else ""
    return f"jdqn {jdqn_version()} (git {commit['commit'][:8]}{modified})"


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes (as stored: a .gz file's compressed bytes)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def run_record(data_path: str | None, n_bars: int) -> dict[str, Any]:
    """``results.json``'s ``schema_version`` and ``provenance`` entries; ``data_path`` None =
    synthetic bars (no file to hash: the config's data section says how they were made)."""
    commit = git_commit()
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "provenance": {
            "jdqn_version": jdqn_version(),
            "git_commit": None if commit is None else commit["commit"],
            "git_dirty": None if commit is None else commit["dirty"],
            "data": {
                "path": data_path,
                "sha256": None if data_path is None else file_sha256(data_path),
                "bars": n_bars,
            },
        },
    }
