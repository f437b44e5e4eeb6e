"""One dialect per source type, asked by the whole house: no module outside a database's own
package (`sources/<db>/`) imports it, so none can test a database's class either, nor spells a
source type (it asks `sources.factory` for the types and the default); the factory finds each
type's dialect by name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from airflow_provider_dblog.sources.base import SourceError
from airflow_provider_dblog.sources.factory import DIALECTS, dialect

REPO = Path(__file__).resolve().parents[3]
SHIPPED = ("airflow_provider_dblog", "spark_jobs")
"""The code that ships (tests and benches name databases on purpose)."""
SERVERS = (
    "airflow_provider_dblog/devservices/",
    "airflow_provider_dblog/demo/",
    "airflow_provider_dblog/cli/demo.py",
    "airflow_provider_dblog/cli/dev_services.py",
)
"""Code beside the shipped package that stands for one database (the dev services' servers,
the demo's backend of each database, which reads its log's position as that source spells
it): it may name them and import their packages."""


def databases(repo: Path) -> list[str]:
    """The database packages: those under `sources/` with a dialect."""
    return sorted(
        p.parent.name for p in (repo / "airflow_provider_dblog/sources").glob("*/dialect.py")
    )


def imported(repo: Path, path: Path) -> list[str]:
    """Every module an import statement of `path` names, relative imports resolved, `from a
    import b` counted as both `a` and `a.b`."""
    parts = path.relative_to(repo).with_suffix("").parts
    package = parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return found


def offenders(repo: Path) -> list[str]:
    """`path: module` for each import of a database package from outside it (and outside
    `SERVERS`)."""
    sources = repo / "airflow_provider_dblog" / "sources"
    known = databases(repo)
    found = []
    for root in SHIPPED:
        for path in sorted((repo / root).rglob("*.py")):
            if path.relative_to(repo).as_posix().startswith(SERVERS):
                continue
            home = path.relative_to(sources).parts[0] if path.is_relative_to(sources) else None
            for name in imported(repo, path):
                for db in known:
                    package = f"airflow_provider_dblog.sources.{db}"
                    if db != home and (name == package or name.startswith(package + ".")):
                        found.append(f"{path.relative_to(repo)}: {name}")
    return found


def spelled_types(repo: Path) -> list[str]:
    """`path:line: 'type'` for each string constant that is a source type, outside `sources/`
    and the code naming servers: a type switch (`== "mysql"`, `choices=`, a default) that
    should ask the factory. Only whole strings count: docstrings and f-strings do not."""
    found = []
    for root in SHIPPED:
        for path in sorted((repo / root).rglob("*.py")):
            name = path.relative_to(repo).as_posix()
            if name.startswith(("airflow_provider_dblog/sources/", *SERVERS)):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and node.value in DIALECTS:
                    found.append(f"{name}:{node.lineno}: {node.value!r}")
    return found


def test_no_module_outside_a_database_package_imports_it() -> None:
    assert databases(REPO) == ["mysql", "postgres"]
    assert offenders(REPO) == []


def test_no_module_outside_sources_spells_a_source_type() -> None:
    assert spelled_types(REPO) == []


def test_the_spelling_rule_finds_switches_and_spares_servers_and_prose(tmp_path: Path) -> None:
    files = {
        "airflow_provider_dblog/sources/factory.py": 'DEFAULT_TYPE = "postgres"\n',
        "airflow_provider_dblog/devservices/stack.py": 'SERVICES = ("postgres", "mariadb")\n',
        "airflow_provider_dblog/cli/demo.py": 'p.add_argument("--source", default="postgres")\n',
        "airflow_provider_dblog/lake/schema.py": (
            '"""Maps postgres and mysql types."""\n'
            'label = f"postgres {x}"\n'
            'if source_type == "mysql":\n    pass\n'
        ),
        "spark_jobs/compact.py": 'p.add_argument("--type", choices=("postgres", "mysql"))\n',
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert spelled_types(tmp_path) == [
        "airflow_provider_dblog/lake/schema.py:3: 'mysql'",
        "spark_jobs/compact.py:1: 'postgres'",
        "spark_jobs/compact.py:1: 'mysql'",
    ]


def test_the_rule_finds_plain_from_and_relative_imports(tmp_path: Path) -> None:
    """A tree that breaks the rule each way is refused, and a database's own package may
    import itself."""
    sources = "airflow_provider_dblog.sources"
    files = {
        "airflow_provider_dblog/sources/postgres/dialect.py": "from . import chunks\n",
        "airflow_provider_dblog/sources/mysql/dialect.py": f"import {sources}.mysql.chunks\n",
        "airflow_provider_dblog/lake/direct.py": "from ..sources import postgres\n",
        "airflow_provider_dblog/lake/__init__.py": "from .schema import x\n",
        "airflow_provider_dblog/cli/tail.py": f"import {sources}.mysql.binlog\n",
        "spark_jobs/dump.py": f"from {sources}.postgres.chunks import C\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert offenders(tmp_path) == [
        "airflow_provider_dblog/cli/tail.py: airflow_provider_dblog.sources.mysql.binlog",
        "airflow_provider_dblog/lake/direct.py: airflow_provider_dblog.sources.postgres",
        "spark_jobs/dump.py: airflow_provider_dblog.sources.postgres.chunks",
        "spark_jobs/dump.py: airflow_provider_dblog.sources.postgres.chunks.C",
    ]


def test_every_database_package_has_its_dialect_in_the_factory() -> None:
    assert sorted(DIALECTS) == databases(REPO)
    for source_type in DIALECTS:
        found = dialect(source_type)
        assert found.type == source_type
        assert found.lake_type("bigint")[1] == "int"


def test_an_unknown_source_type_names_the_known_ones() -> None:
    with pytest.raises(SourceError, match=r"'oracle' is unknown; known types: postgres, mysql"):
        dialect("oracle")
