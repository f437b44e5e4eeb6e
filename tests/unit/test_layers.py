"""The package's layers, as its imports show them (every import in a module, those inside
functions too): the target protocol below `dump/`, `outputs/` and `lake/`, the module that
opens targets (`targets.py`) above them, the pure core importing only itself, and the live
view apart from the command line."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_provider_dblog"

MUST_NOT_IMPORT = {
    "direct_target": {"dump", "outputs", "lake", "targets"},
    "dump": {"outputs", "lake", "targets"},
    "outputs": {"dump", "lake", "targets"},
    "lake": {"dump", "outputs", "targets"},
    "ui": {"cli"},
}
"""Per part of the package (a subpackage, or a module at its top), the parts it may not
import."""


def _part(module: str) -> str:
    """`dump` for `airflow_provider_dblog.dump.request`, `targets` for `...targets`."""
    return module.split(".")[1] if module.count(".") else module


def _imports() -> Iterator[tuple[str, str]]:
    """(importing file's part, imported part) for every import of the package in the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        part = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.startswith(f"{PACKAGE.name}."):
                    yield part, _part(name)


IMPORTS = sorted(set(_imports()))


def test_the_rules_name_parts_that_exist_and_see_their_imports() -> None:
    parts = {p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    named = set(MUST_NOT_IMPORT) | set().union(*MUST_NOT_IMPORT.values())
    assert named <= parts, f"rules name parts that do not exist: {sorted(named - parts)}"
    assert ("targets", "outputs") in IMPORTS and ("dump", "direct_target") in IMPORTS


@pytest.mark.parametrize("part", sorted(MUST_NOT_IMPORT))
def test_a_layer_imports_nothing_above_it(part: str) -> None:
    wrong = sorted(b for a, b in IMPORTS if a == part and b in MUST_NOT_IMPORT[part])
    assert wrong == [], f"{part} imports {wrong}"


def test_the_core_imports_only_the_core() -> None:
    assert sorted({b for a, b in IMPORTS if a == "core"}) == ["core"]
