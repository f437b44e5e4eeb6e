"""What the dump and the log reader read from PostgreSQL's catalog about a captured table.

Columns are listed as pgoutput lists them (attribute order, no dropped or generated columns),
with the type OID pgoutput reports, so both paths convert a column with the same converter.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg.rows import TupleRow

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.base import NoPrimaryKey, UnknownTable

_PRIMARY_KEY = """
SELECT a.attname
FROM pg_index i
JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND i.indisprimary
ORDER BY k.ord
"""

_COLUMNS = """
SELECT a.attname, a.atttypid::int, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum
"""

_TABLE_OID = """
SELECT c.oid::int FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
"""


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    name: str
    type_oid: int
    sql_type: str
    """The type as SQL spells it (format_type), for casting key parameters."""


@dataclass(frozen=True, slots=True)
class TableShape:
    table: TableRef
    columns: tuple[ColumnInfo, ...]
    key: tuple[ColumnInfo, ...]
    """The primary-key columns in key order."""

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.key)


def primary_key(conn: psycopg.Connection[TupleRow], relation_oid: int) -> tuple[str, ...]:
    return tuple(name for (name,) in conn.execute(_PRIMARY_KEY, (relation_oid,)))


def table_shape(conn: psycopg.Connection[TupleRow], table: TableRef) -> TableShape:
    """Columns and primary key of `table`; UnknownTable or NoPrimaryKey otherwise."""
    row = conn.execute(_TABLE_OID, (table.schema, table.name)).fetchone()
    if row is None:
        raise UnknownTable(f"table {table} does not exist")
    (oid,) = row
    columns = tuple(ColumnInfo(*c) for c in conn.execute(_COLUMNS, (oid,)))
    by_name = {c.name: c for c in columns}
    key = tuple(by_name[name] for name in primary_key(conn, oid))
    if not key:
        raise NoPrimaryKey(f"table {table} has no primary key: add one to dump it")
    return TableShape(table, columns, key)
