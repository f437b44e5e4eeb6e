"""A MySQL source's rows as a PostgreSQL target holds them (the SQL-apply output's tables), read
back as this source's own converters give them: what `dblog verify` hashes a target row by, so
that a row the output applied hashes as the source's does.

The output writes each event's JSON into the target column of the matching type (a datetime's
text into a timestamp, base64 into bytea, a decimal's digits into numeric). psycopg reads those
columns back as the Python values PyMySQL gives for the source's (datetime, bytes, Decimal,
int, str), and the source column's converter (`converters.converter`, the one the dump and the
binlog reader share) turns them into the source's JSON. Where psycopg's value is not PyMySQL's,
the target column is read cast to a type whose value is: JSON as its text, TIME as an interval
(a timedelta), BIT as a bigint, enum and set members as text.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_dblog.core.event import JsonValue, TableRef
from airflow_provider_dblog.sources.mysql.catalog import ColumnInfo, table_shape
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.mysql.converters import Converter, converter

READ_AS = {"json": "text", "time": "interval", "bit": "bigint", "enum": "text", "set": "text"}
"""The PostgreSQL type a target column is read as, by the source column's type, where psycopg's
value of the column's own type is not the one the converter reads."""


def _as_text(value: Any) -> JsonValue:
    return value


class TargetValues:
    """Each target column's read cast and converter, by the source table's columns as the
    source's catalog describes them (read once a table)."""

    def __init__(self, config: MysqlSourceConfig) -> None:
        self._config = config
        self._columns: dict[TableRef, dict[str, ColumnInfo]] = {}

    def column(self, table: TableRef, name: str) -> tuple[str | None, Converter]:
        """How the target column `name` of source table `table` is read: the type to cast it
        to (None: as it is) and the converter of its value. A column the source lacks is read
        as its text, so its rows differ from the source's."""
        columns = self._columns.get(table)
        if columns is None:
            columns = self._columns[table] = self._describe(table)
        found = columns.get(name)
        if found is None:
            return "text", _as_text
        return READ_AS.get(found.data_type), converter(found)

    def _describe(self, table: TableRef) -> dict[str, ColumnInfo]:
        conn = self._config.connect()
        try:
            shape = table_shape(conn, table, self._config.unique_keys.get(table))
        finally:
            conn.close()
        return {c.name: c for c in shape.columns}
