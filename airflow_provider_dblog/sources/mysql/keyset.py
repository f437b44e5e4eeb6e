"""The keyset queries (`sources/keyset.py`) spelled for MySQL/MariaDB: text with backquoted
names and PyMySQL's `%s` placeholders.

Key values travel as typed parameters (`converters.to_param`): integers (unsigned bigint above
2^63 included), Decimals, bytes for binary keys (binary(16) UUIDs), enum and set members as
their numbers, text for the rest; the server compares them in the key columns' own
collations. Each range bound also bounds the key's first column alone (`a >= x AND (a, b) >
(x, y)`): the same rows, but one the range optimizer can use (neither MySQL nor MariaDB does
for a row comparison). A key column is selected with `converters.read_expression` (a FLOAT as
the double it stores)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_dblog.core.event import JsonValue, TableRef
from airflow_provider_dblog.sources.keyset import KeysetSql
from airflow_provider_dblog.sources.mysql.catalog import ColumnInfo
from airflow_provider_dblog.sources.mysql.converters import quote_name, read_expression, to_param


class MysqlKeyset(KeysetSql[str, ColumnInfo]):
    bounds_first_column = True

    def compose(self, template: str, *parts: str) -> str:
        return template.format(*parts)

    def join(self, parts: Sequence[str], separator: str = ", ") -> str:
        return separator.join(parts)

    def table(self, table: TableRef) -> str:
        return f"{quote_name(table.schema)}.{quote_name(table.name)}"

    def name(self, column: ColumnInfo) -> str:
        return quote_name(column.name)

    def number(self, value: int) -> str:
        return str(int(value))

    def placeholder(self, column: ColumnInfo) -> str:
        return "%s"

    def condition(self, text: str) -> str:
        return text.replace("%", "%%")

    def param(self, column: ColumnInfo, value: JsonValue) -> Any:
        return to_param(column, value)

    def selected(self, column: ColumnInfo) -> str:
        return read_expression(column)


KEYSET = MysqlKeyset()
