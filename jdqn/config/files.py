"""Reading a saved configuration: a run's ``config.json`` (or its ``results.json``, whose
``"config"`` is the same resolved tree), for ``jdqn walkforward --config FILE``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from jdqn.config.parse import config_from_dict
from jdqn.config.sections import Config


def load_config_file(path: str | os.PathLike[str]) -> Config:
    """The validated ``Config`` saved in ``path``; every defect raises a one-line ``ValueError``
    naming the file, the problem and the fix."""
    where = f"--config {os.fspath(path)}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file; fix: check the path") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(
            f"{where}: cannot be read ({type(error).__name__}); fix: pass a run's config.json"
        ) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{where}: not JSON (line {error.lineno}: {error.msg}); fix: pass a run's config.json"
        ) from None
    except RecursionError:  # a document nested thousands deep
        raise ValueError(f"{where}: nested too deeply; fix: pass a run's config.json") from None
    if isinstance(raw, dict) and isinstance(raw.get("config"), dict):
        raw = raw["config"]  # a results.json
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: not a JSON object; fix: pass a run's config.json")
    try:
        return config_from_dict(raw)
    except (TypeError, ValueError) as error:
        message = " ".join(str(error).splitlines())
        raise ValueError(f"{where}: {message}") from None
