"""A captured table's lake schema read from its source's catalog now.

The source describes the table (`Source.describe`) as its schema events spell a table, and its
dialect maps the types (`Dialect.lake_type`), so a table created from the catalog and one
evolved by `s` events map alike.
"""

from __future__ import annotations

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.lake.schema import LakeSchema, lake_schema
from airflow_provider_dblog.sources.base import SourceConfig
from airflow_provider_dblog.sources.factory import source_for


def source_lake_schema(config: SourceConfig, table: TableRef) -> LakeSchema:
    """The lake schema of a captured table, from its source's catalog."""
    return lake_schema(config.type, table, source_for(config).describe(table))
