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
