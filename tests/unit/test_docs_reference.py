"""The docs and the code name the same things: every `dblog` flag, TOML key and error type that
exists is documented, and every one the docs name exists.

Flags come from the real argparse parsers (`dblog`'s, built by `cli.build_parser`) and, for the
scripts the docs also show (`spark_jobs/`, `bench/`), from their `add_argument` calls. TOML keys
come from the configuration dataclasses and the loader's own lists of known keys. Error types
are the exception classes defined in the package and the Spark applications. Code names (a
backticked `Class.method`, `module.name`, `dump/runner.run_table`) are resolved by importing
the code they name; backticked paths with a folder must be files of the repository.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_dblog.cli import build_parser
from airflow_provider_dblog.config import _LAKE_KEYS, ConfigError, load_config
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig
from airflow_provider_dblog.tailer.settings import TailerSettings
from airflow_provider_dblog.targets import _OUTPUTS

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
OPERATIONS = REPO / "docs" / "operations.md"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
OTHER_TOOLS = {
    "--endpos": "pg_recvlogical",
    "--scan": "redis-cli",
    "--pattern": "redis-cli",
    "--read-from-remote-server": "mariadb-binlog",
    "--durations": "pytest",
}
"""Flags the docs show on other programs' command lines."""


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, set[str]]]:
    """('dump', {'--table', ...}), ('dev-services up', {...}): every `dblog` command that runs."""
    flags = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    flags.discard("--help")
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield " ".join(path), flags
    for action in subcommands:
        for name, sub in action.choices.items():
            yield from _commands(sub, (*path, name))


DBLOG = dict(_commands(build_parser()))


def _script_flags() -> set[str]:
    """The flags of `spark_jobs/*.py` and `bench/*.py`, from their add_argument calls."""
    found = set()
    for path in [*(REPO / "spark_jobs").glob("*.py"), *(REPO / "bench").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                found |= {
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and str(a.value).startswith("--")
                }
    return found


def _synopses(text: str) -> Iterator[tuple[list[str], set[str]]]:
    """Each backticked `dblog ...` span: the commands it names and the flags it shows."""
    for span in re.findall(r"`(dblog [^`]+)`", text.replace("\\|", "|")):
        words = span.split()
        names = words[1].split("|")
        if len(words) > 2 and any(c.startswith(f"{words[1]} ") for c in DBLOG):
            names = [f"{words[1]} {n}" for n in words[2].split("|")]  # `dblog lake maintain`
        yield [n for n in names if n in DBLOG], set(FLAG.findall(span))


def test_every_flag_the_docs_name_exists() -> None:
    known = set().union(*DBLOG.values()) | _script_flags() | set(OTHER_TOOLS)
    for doc in DOCS:
        unknown = set(FLAG.findall(doc.read_text())) - known
        assert not unknown, f"{doc.name} names flags no parser has: {sorted(unknown)}"


def test_every_dblog_synopsis_shows_only_its_command_s_flags() -> None:
    for doc in DOCS:
        for names, flags in _synopses(doc.read_text()):
            for name in names:
                wrong = flags - DBLOG[name]
                assert not wrong, f"{doc.name}: `dblog {name}` has no {sorted(wrong)}"


def test_the_command_reference_shows_every_command_with_all_its_flags() -> None:
    shown: dict[str, set[str]] = {}
    for names, flags in _synopses(OPERATIONS.read_text()):
        for name in names:
            shown.setdefault(name, set()).update(flags)
    assert set(shown) == set(DBLOG), "commands missing from docs/operations.md"
    for name, flags in DBLOG.items():
        assert shown[name] == flags, f"dblog {name}: undocumented {sorted(flags - shown[name])}"


def _known_redis_keys(tmp_path: Path) -> set[str]:
    """The `[redis]` keys, as the loader lists them when refusing an unknown one."""
    path = tmp_path / "probe.toml"
    path.write_text('[source]\nname = "s"\ndsn = "host=h"\ntables = ["t"]\n[redis]\nzz = 1\n')
    path.write_text(path.read_text() + '[output]\ntype = "ndjson"\n')
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    listed = str(refused.value).rpartition("known: ")[2]
    return set(listed.split(", "))


def _documented_toml_keys() -> dict[str, set[str]]:
    """Keys per section in the docs' ```toml blocks, commented-out ones included."""
    keys: dict[str, set[str]] = {}
    for doc in DOCS:
        for block in re.findall(r"```toml\n(.*?)```", doc.read_text(), re.S):
            section = None
            for line in block.splitlines():
                header = re.match(r"\s*\[(\w+)\]", line)
                if header:
                    section = header[1]
                    continue
                unquoted = re.sub(r"\"[^\"]*\"|'[^']*'", '""', line)
                names = re.findall(r"(?<![\w.])([a-z_]+)\s*=", unquoted)
                assert section is not None or not names, f"{doc.name}: key outside a section"
                if section is not None:
                    keys.setdefault(section, set()).update(names)
    return keys


def test_every_toml_key_is_documented_and_every_documented_key_exists(tmp_path: Path) -> None:
    def fields(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    known = {
        "source": {"type"} | fields(PostgresSourceConfig) | fields(MysqlSourceConfig),
        "redis": _known_redis_keys(tmp_path),
        "output": {"type"}.union(*(names for _, names in _OUTPUTS.values())),
        "tailer": fields(TailerSettings),
        "lake": set(_LAKE_KEYS),
    }
    assert _documented_toml_keys() == known


def _error_classes() -> dict[str, Path]:
    """Public exception classes defined in the package and the Spark applications."""
    classes: list[tuple[str, set[str], Path]] = []
    for path in [
        *(REPO / "airflow_provider_dblog").rglob("*.py"),
        *(REPO / "spark_jobs").glob("*.py"),
    ]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
                }
                classes.append((node.name, bases, path))
    errors = {"Exception", "RuntimeError", "ValueError", "OSError"}
    found: dict[str, Path] = {}
    while True:
        new = {n: p for n, bases, p in classes if bases & errors and n not in found}
        if not new:
            break
        found.update(new)
        errors |= set(new)
    return {n: p for n, p in found.items() if not n.startswith("_")}


def test_every_error_type_is_in_the_operations_guide() -> None:
    guide = OPERATIONS.read_text()
    errors = _error_classes()
    assert {"SourceError", "FencedOut", "DumpFailed", "CompactionLocked"} <= set(errors)
    missing = {n: str(p.relative_to(REPO)) for n, p in errors.items() if f"`{n}`" not in guide}
    assert not missing, f"error types missing from docs/operations.md: {missing}"


# --- code names --------------------------------------------------------------------------------

CODE_NAME = re.compile(r"`([A-Za-z_][\w/]*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")
"""A backticked dotted name: `Reconciler.chunk_events`, `core.event.Event`,
`dump/runner.run_table`."""
FILE_SUFFIXES = (".py", ".md", ".toml", ".yaml", ".json", ".sql", ".conf", ".log", ".sh", ".env")
NOT_CODE = {
    "public.orders": "a source table in the examples",
    "dblog.watermark": "the watermark table",
    "source.origin": "a field of the event's JSON",
    "spark.pyspark.python": "a Spark setting",
    "dblog_positions.deleted": "a column of the SQL target's positions table",
    "delta.targetFileSize": "a Delta table property",
    "delta.deletedFileRetentionDuration": "a Delta table property",
    "delta.logRetentionDuration": "a Delta table property",
    "delta.checkpointInterval": "a Delta table property",
    "delta.enableDeletionVectors": "a Delta table property",
    "max._dblog_commit": "a Delta file statistic (the log's maximum of a column)",
    "cpu.weight": "a cgroup v2 control file",
}
"""Dotted names the docs show that are not Python: each says what it is instead."""
EXTERNAL = {"DeltaTable": "deltalake", "dag": "airflow.sdk.DAG"}
"""Other projects' names the docs use without their module."""
OUR_ROOTS = ("airflow_provider_dblog", "spark_jobs", "tests")


def _our_modules() -> dict[str, Path]:
    """Every module of the package, the Spark applications and the test support, by name."""
    modules = {}
    for root in OUR_ROOTS:
        for path in (REPO / root).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = _our_modules()


def _top_level_names() -> dict[str, list[str]]:
    """Each name a module of ours defines at its top level: the modules that define it."""
    defined: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                continue
            for name in names:
                defined.setdefault(name, []).append(module)
    return defined


DEFINED = _top_level_names()


def _has(owner: object, attributes: list[str]) -> bool:
    """`owner.a.b...` exists: as an attribute, or as a field a class declares (a dataclass field
    without a default is no class attribute)."""
    for index, attribute in enumerate(attributes):
        if hasattr(owner, attribute):
            owner = getattr(owner, attribute)
            continue
        declared = isinstance(owner, type) and any(
            attribute in vars(cls).get("__annotations__", {}) for cls in owner.__mro__
        )
        return declared and index == len(attributes) - 1
    return True


def _resolves(name: str) -> bool | None:
    """Whether `name` names something of ours (or of a library it names): None when it names
    nothing Python this test knows of."""
    parts = name.replace("/", ".").split(".")
    for end in range(len(parts), 0, -1):
        written = ".".join(parts[:end])
        modules = [m for m in MODULES if m == written or m.endswith(f".{written}")]
        if modules:
            rest = parts[end:]
            return any(_has(importlib.import_module(m), rest) for m in modules)
    if parts[0] in DEFINED:
        return any(_has(importlib.import_module(m), parts) for m in DEFINED[parts[0]])
    if parts[0] in EXTERNAL:
        module, _, attribute = EXTERNAL[parts[0]].partition(".")
        owner = importlib.import_module(module)
        return _has(owner, [*attribute.split("."), *parts[1:]] if attribute else parts)
    if _importable(parts[0]):
        return _has(importlib.import_module(parts[0]), parts[1:]) or any(
            _importable(".".join(parts[:end])) for end in range(2, len(parts) + 1)
        )
    return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent that is a module, not a package
        return False


def _code_names() -> dict[str, set[str]]:
    """{name: the docs that name it} for every backticked dotted name that is not a file."""
    found: dict[str, set[str]] = {}
    for doc in DOCS:
        for name in CODE_NAME.findall(doc.read_text()):
            if not name.endswith(FILE_SUFFIXES):
                found.setdefault(name, set()).add(doc.name)
    return found


def test_every_code_name_the_docs_cite_exists() -> None:
    """`Reconciler.chunk_events`, `core.event.Event`, `dump/runner.run_table`: each dotted name
    in backticks resolves against the code, so a rename or a removal updates the docs too. A
    `dblog.*` name is a table property or metadata key, spelled as a literal in the package."""
    literals = {
        node.value
        for path in (REPO / "airflow_provider_dblog").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    names = _code_names()
    assert {"Reconciler.chunk_events", "hooks.dblog.DBLogHook"} <= set(names)
    unknown, missing = {}, {}
    for name, docs in sorted(names.items()):
        if name in NOT_CODE:
            continue
        if name.startswith("dblog.") and name not in MODULES:
            if name not in literals:
                missing[name] = sorted(docs)
            continue
        resolved = _resolves(name)
        if resolved is None:
            unknown[name] = sorted(docs)
        elif not resolved:
            missing[name] = sorted(docs)
    assert not missing, f"the docs name code that does not exist: {missing}"
    assert not unknown, (
        f"not code this test knows (add them to NOT_CODE with what they are): {unknown}"
    )


FILE_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)+\.(?:py|md|toml|yaml|sql|sh))`")


def test_every_file_path_the_docs_cite_exists() -> None:
    """`core/event.py`, `tests/unit/core/test_event.py`: a backticked path with a folder names a
    file of the repository, of the package, or of the tests."""
    roots = [REPO, REPO / "airflow_provider_dblog", REPO / "tests"]
    missing: dict[str, set[str]] = {}
    for doc in DOCS:
        for path in FILE_PATH.findall(doc.read_text()):
            if not any((root / path).exists() for root in roots):
                missing.setdefault(path, set()).add(doc.name)
    assert not missing, f"the docs name files that do not exist: {missing}"
