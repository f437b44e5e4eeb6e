"""MySQL/MariaDB's `Dialect`: what the factory hands out for `[source] type = "mysql"`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_dblog.sources.dialect import Dialect
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.mysql.source import MysqlSource

if TYPE_CHECKING:
    from airflow_provider_dblog.sources.lake_types import LakeType


def _lake_type(sql_type: str) -> LakeType:
    from airflow_provider_dblog.sources.mysql.lake_types import lake_type  # pyarrow

    return lake_type(sql_type)


DIALECT = Dialect("mysql", MysqlSourceConfig.from_section, MysqlSource, _lake_type)
