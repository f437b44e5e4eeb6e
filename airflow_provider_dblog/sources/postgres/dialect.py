"""PostgreSQL's `Dialect`: what the factory hands out for `[source] type = "postgres"`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_dblog.sources.dialect import Dialect
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig
from airflow_provider_dblog.sources.postgres.source import PostgresSource

if TYPE_CHECKING:
    from airflow_provider_dblog.sources.lake_types import LakeType


def _lake_type(sql_type: str) -> LakeType:
    from airflow_provider_dblog.sources.postgres.lake_types import lake_type  # pyarrow

    return lake_type(sql_type)


DIALECT = Dialect("postgres", PostgresSourceConfig.from_section, PostgresSource, _lake_type)
