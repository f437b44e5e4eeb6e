"""A captured table's lake schema read from its source's catalog now.

The catalog queries are the sources' own (`sources/postgres/catalog.py`,
`sources/mysql/catalog.py`), spelled as their schema events spell a table, so a table created
from the catalog and one evolved by `s` events map alike.
"""

from __future__ import annotations

from contextlib import closing

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.lake.schema import LakeSchema, lake_schema
from airflow_provider_dblog.sources.base import SourceConfig, SourceError
from airflow_provider_dblog.sources.mysql import catalog as mysql_catalog
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.postgres import catalog as postgres_catalog
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig


def describe(config: SourceConfig, table: TableRef) -> TableSchema:
    """`table`'s columns and key as the source's catalog has them now."""
    if isinstance(config, PostgresSourceConfig):
        with closing(config.connect()) as pg:
            return postgres_catalog.describe_table(pg, table)
    if isinstance(config, MysqlSourceConfig):
        with closing(config.connect()) as my:
            return mysql_catalog.table_schema(my, mysql_catalog.table_shape(my, table))
    raise SourceError(f"no catalog reader for source type {config.type!r}")


def source_lake_schema(config: SourceConfig, table: TableRef) -> LakeSchema:
    """The lake schema of a captured table, from its source's catalog."""
    return lake_schema(config.type, table, describe(config, table))
