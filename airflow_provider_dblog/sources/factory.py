"""Sources chosen by `[source] type`: the one place that knows which types exist.

Each type's package has one `Dialect` (`sources/<db>/dialect.py`): how to parse its `[source]`
section, how to build its `Source`, how its types map into the lake. The registry names each
dialect's module and loads it when the type is first asked for (as SQLAlchemy's dialect
registry does), so a deployment loads only its own database's driver, and nothing outside
`sources/<db>/` imports a database package (`tests/unit/sources/test_source_dialects.py`
checks). Callers ask here and never name a type's classes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.base import Source, SourceConfig, SourceError
from airflow_provider_dblog.sources.dialect import Dialect

DIALECTS: Mapping[str, str] = {
    "postgres": "airflow_provider_dblog.sources.postgres.dialect",
    "mysql": "airflow_provider_dblog.sources.mysql.dialect",
}
"""Each source type's dialect module, which defines `DIALECT`."""
TARGET_VALUES: Mapping[str, str] = {
    "mysql": "airflow_provider_dblog.sources.mysql.target_rows",
}
"""Source types whose values a PostgreSQL target holds in other types than the source's: the
module whose `TargetValues` reads them back as the source's converters give them."""
DEFAULT_TYPE = "postgres"
"""The type of a `[source]` section that names none, and of lake tables created without one."""


def dialect(source_type: object) -> Dialect[Any]:
    """The dialect of a source type (`[source] type`, or the one a lake table recorded);
    `SourceError` naming the known types for another."""
    module = DIALECTS.get(source_type) if isinstance(source_type, str) else None
    if module is None:
        known = ", ".join(DIALECTS)
        raise SourceError(f"source type {source_type!r} is unknown; known types: {known}")
    found: Dialect[Any] = importlib.import_module(module).DIALECT
    return found


def dialect_of(config: SourceConfig) -> Dialect[Any]:
    """The dialect that parsed `config`."""
    return dialect(config.type)


def parse_source_config(section: Mapping[str, Any]) -> SourceConfig:
    """The `[source]` section as its type's configuration (`type` defaults to postgres).
    Raises SourceError naming what is wrong."""
    config: SourceConfig = dialect(section.get("type", DEFAULT_TYPE)).parse(section)
    return config


def source_for(config: SourceConfig) -> Source:
    """The `Source` of a parsed configuration; connects to nothing."""
    return dialect_of(config).open(config)


def postgres_target_rows(
    dsn: str,
    target_of: Callable[[TableRef], TableRef],
    source: SourceConfig,
    *,
    connect_timeout: int,
) -> Any:
    """A reader of a PostgreSQL target database's tables with the PostgreSQL source's keyset
    query (`sources/postgres/target_rows.py`), its rows as `source` gives them: `dblog
    verify`'s `TargetReader` of the SQL-apply output, whatever the source's type."""
    values_module = TARGET_VALUES.get(source.type)
    values = None
    if values_module is not None:
        values = importlib.import_module(values_module).TargetValues(source)
    module = importlib.import_module("airflow_provider_dblog.sources.postgres.target_rows")
    return module.TargetRows(dsn, target_of, connect_timeout=connect_timeout, values=values)
