"""The code stays readable in pieces (issue 19): no function over 80 lines and no class over 300
in operator/ and sidecar/. A long one is split where its steps are (a helper per step), not by
wrapping lines."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 300


def _oversized(root: Path, base: Path = REPO) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    where = f"{path.relative_to(base)}:{node.lineno} {node.name}"
                    found.append(f"{where}: {lines} lines > {limit}")
    return found


def test_no_function_over_80_lines_and_no_class_over_300_in_the_product_code() -> None:
    oversized = _oversized(REPO / "operator") + _oversized(REPO / "sidecar")
    assert not oversized, "\n".join(oversized)


def test_the_shape_check_sees_an_oversized_function_and_class(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    (tmp_path / "long.py").write_text(f"def long() -> None:\n{body}\n\n\nclass Big:\n{body}\n")
    assert _oversized(tmp_path, tmp_path) == [
        f"long.py:1 long: {MAX_CLASS_LINES + 1} lines > {MAX_FUNCTION_LINES}",
        f"long.py:{MAX_CLASS_LINES + 4} Big: {MAX_CLASS_LINES + 1} lines > {MAX_CLASS_LINES}",
    ]
