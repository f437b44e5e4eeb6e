"""The package's layers, as its imports show them: every import in a module, those inside
functions and under `TYPE_CHECKING` too, relative ones resolved.

A part of the package is a subpackage or a module at its top (`dump`, `config`; `__init__` the
package itself). `LAYERS` lists them from the bottom up; a part imports only itself and parts
of the layers below its own, never a part beside it in its layer or above it. Every part is in
one layer, so a new one fails here until it is placed. And no module imports, through any
chain, itself: importing a module loads the packages above it (their `__init__`), so an import
of `tailer.settings` counts as one of `tailer`'s `__init__` too."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_provider_dblog"
ROOT = PACKAGE.name

LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("settings", "outage", "libpq_tls", "spark_package", "__init__"),
    ("state", "sources"),
    ("config", "leased_service", "devservices"),
    ("direct_target",),
    ("lake", "outputs", "dump"),
    ("targets", "compaction", "verify", "hooks"),
    ("tailer", "triggers"),
    ("sensors", "assets", "demo"),
    ("operators", "queues", "ui", "get_provider_info"),
    ("cli",),
)
"""From the bottom up: the pure core; the settings types and the leaf helpers, which import
nothing of the package; the state store and the sources; the configuration, which parses the
`[source]` and `[redis]` sections through them, the lease loop the tailer and the compaction
follower share (and the throwaway servers); the direct target
protocol; the lake, the outputs and the dump, which know each other only through that
protocol; the module that opens targets, the compaction, verify and the Airflow hook; the
tailer and the triggers; the Airflow sensors and assets and the demo; the operators, the
queue, the live view and the provider's metadata; the command line."""

LAYER_OF = {part: n for n, layer in enumerate(LAYERS) for part in layer}


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its `__init__.py`)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = [ROOT, *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def imported_names(module: str, source: str, *, is_package: bool) -> Iterator[str]:
    """The dotted names `source` (the text of `module`) imports, anywhere in it; for
    `from a import b` both `a` and `a.b` (`b` may be a module)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            yield origin
            yield from (f"{origin}.{alias.name}" for alias in node.names)


def _part(module: str) -> str:
    """`dump` for `airflow_provider_dblog.dump.request`, `__init__` for the package itself."""
    return module.split(".")[1] if module.count(".") else "__init__"


NAMED = {
    module: {
        name
        for name in imported_names(module, path.read_text(), is_package=path.stem == "__init__")
        if name in MODULES
    }
    for module, path in MODULES.items()
}
"""Per module, the package's modules its imports name."""


def _loads(module: str) -> set[str]:
    """The package's modules importing `module` loads: each it names and the packages above
    that, but not the packages above `module` itself (loaded before it runs)."""
    own = {".".join(module.split(".")[:n]) for n in range(1, module.count(".") + 2)}
    loads = set()
    for name in NAMED[module]:
        pieces = name.split(".")
        loads |= {".".join(pieces[:n]) for n in range(1, len(pieces) + 1)}
    return (loads & set(MODULES)) - own


GRAPH = {module: _loads(module) for module in MODULES}
IMPORTS = sorted(
    {(_part(module), _part(name)) for module, names in NAMED.items() for name in names}
)
"""(importing part, imported part) for every import of the package in the package."""


def test_every_part_is_in_one_layer() -> None:
    parts = {p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    listed = [part for layer in LAYERS for part in layer]
    assert len(listed) == len(set(listed)), "a part is in two layers"
    assert set(listed) == parts, (
        f"not placed: {sorted(parts - set(listed))}; gone: {sorted(set(listed) - parts)}"
    )


def test_the_scan_sees_imports_in_functions_under_type_checking_and_relative() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from airflow_provider_dblog.lake.table import LakeTable\n"
        "def f():\n"
        "    import airflow_provider_dblog.outputs.base\n"
        "from ..state import keys\n"
        "from . import request\n"
    )
    names = set(imported_names("airflow_provider_dblog.dump.runner", source, is_package=False))
    assert {
        "airflow_provider_dblog.lake.table",
        "airflow_provider_dblog.outputs.base",
        "airflow_provider_dblog.state.keys",
        "airflow_provider_dblog.dump.request",
    } <= names
    assert ("targets", "outputs") in IMPORTS and ("get_provider_info", "__init__") in IMPORTS


@pytest.mark.parametrize("part", [part for layer in LAYERS for part in layer])
def test_a_part_imports_only_the_layers_below_it(part: str) -> None:
    wrong = sorted(
        f"{b} (layer {LAYER_OF[b]})"
        for a, b in IMPORTS
        if a == part and b != part and LAYER_OF.get(b, len(LAYERS)) >= LAYER_OF[part]
    )
    assert wrong == [], f"{part} (layer {LAYER_OF[part]}) imports {wrong}"


def test_no_module_imports_itself_through_others() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        # Tarjan's strongly connected components.
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(GRAPH[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1 or module in GRAPH[module]:
                cycles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert cycles == [], f"modules that import each other: {cycles}"
