"""The keyset queries (`sources/keyset.py`) spelled for PostgreSQL: composed with psycopg's
`sql`, names as `Identifier`s, each key value a text parameter cast to its column's type
(`CAST(%s AS numeric(10,2))`), so any key type the converters print comes back as a bound."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from airflow_provider_dblog.core.event import JsonValue, TableRef
from airflow_provider_dblog.sources.keyset import KeysetSql
from airflow_provider_dblog.sources.postgres.catalog import ColumnInfo
from airflow_provider_dblog.sources.postgres.converters import to_text


class PostgresKeyset(KeysetSql[sql.Composed, ColumnInfo]):
    """Every piece a `Composed`, which a psycopg cursor executes."""

    def compose(self, template: str, *parts: sql.Composed) -> sql.Composed:
        return sql.SQL(template).format(*parts)

    def join(self, parts: Sequence[sql.Composed], separator: str = ", ") -> sql.Composed:
        return sql.SQL(separator).join(parts)

    def table(self, table: TableRef) -> sql.Composed:
        return sql.Composed([sql.Identifier(table.schema, table.name)])

    def name(self, column: ColumnInfo) -> sql.Composed:
        return sql.Composed([sql.Identifier(column.name)])

    def number(self, value: int) -> sql.Composed:
        return sql.Composed([sql.Literal(int(value))])

    def placeholder(self, column: ColumnInfo) -> sql.Composed:
        return sql.SQL("CAST({} AS {})").format(sql.Placeholder(), sql.SQL(column.sql_type))

    def condition(self, text: str) -> sql.Composed:
        return sql.Composed([sql.SQL(text.replace("%", "%%"))])

    def param(self, column: ColumnInfo, value: JsonValue) -> str:
        return to_text(column.type_oid, value)


KEYSET = PostgresKeyset()
