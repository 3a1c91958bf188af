"""The product's shape, as issue 33 set it: every function short enough to read at once."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONGEST_FUNCTION = 120  # lines, docstring included


def _product_files() -> list[Path]:
    files = [*(ROOT / "jdqn").rglob("*.py"), *(ROOT / "pallas_kernels").rglob("*.py")]
    return [f for f in files if "bench" not in f.relative_to(ROOT).parts]


def test_no_product_function_is_longer_than_the_bound() -> None:
    long = []
    for path in _product_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length})")
    assert len(_product_files()) > 50 and not long, long


FIRST_IMPORTS = """
import importlib, pkgutil, sys
import jdqn, pallas_kernels
packages = (jdqn, pallas_kernels)
names = [m.name for p in packages for m in pkgutil.walk_packages(p.__path__, p.__name__ + ".")]
failed = []
for name in sorted(names):
    for loaded in [m for m in sys.modules if m.split(".")[0] in ("jdqn", "pallas_kernels")]:
        del sys.modules[loaded]  # jdqn's modules load afresh; jax and the rest stay loaded
    try:
        importlib.import_module(name)
    except ImportError as error:
        failed.append(f"{name}: {error}")
print("\\n".join(failed))
"""


def test_every_module_imports_as_the_first_jdqn_module_of_a_process() -> None:
    """A package's __init__ runs before any of its modules: `import jdqn.agent.networks` first
    once failed because jdqn/accel/__init__.py (run for jdqn.accel.pieces) imported it back."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FIRST_IMPORTS], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "", done.stdout
