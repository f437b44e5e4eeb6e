"""Sources chosen by `[source] type`: the one place that knows which types exist.

Each type registers how to parse its `[source]` section into its configuration and how to
build its `Source` from that; everything that differs between databases stays in the type's
package (as Airflow's common.sql keeps each database's dialect apart). Callers ask here and
never name a type's classes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from airflow_provider_dblog.sources.base import Source, SourceConfig, SourceError
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.mysql.source import MysqlSource
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig
from airflow_provider_dblog.sources.postgres.source import PostgresSource

C = TypeVar("C", bound=SourceConfig)


@dataclass(frozen=True, slots=True)
class SourceType(Generic[C]):
    """One kind of database: its configuration's parser, and its `Source` built from that."""

    parse: Callable[[Mapping[str, Any]], C]
    open: Callable[[C], Source]


SOURCE_TYPES: Mapping[str, SourceType[Any]] = {
    "postgres": SourceType(PostgresSourceConfig.from_section, PostgresSource),
    "mysql": SourceType(MysqlSourceConfig.from_section, MysqlSource),
}
DEFAULT_TYPE = "postgres"


def parse_source_config(section: Mapping[str, Any]) -> SourceConfig:
    """The `[source]` section as its type's configuration (`type` defaults to postgres).
    Raises SourceError naming what is wrong."""
    config: SourceConfig = _source_type(section.get("type", DEFAULT_TYPE)).parse(section)
    return config


def source_for(config: SourceConfig) -> Source:
    """The `Source` of a parsed configuration; connects to nothing."""
    return _source_type(config.type).open(config)


def _source_type(name: object) -> SourceType[Any]:
    kind = SOURCE_TYPES.get(name) if isinstance(name, str) else None
    if kind is None:
        known = ", ".join(SOURCE_TYPES)
        raise SourceError(f"source type {name!r} is unknown; known types: {known}")
    return kind
