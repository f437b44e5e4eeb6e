"""What the dump and the log reader read from PostgreSQL's catalog about a captured table.

Columns are listed as pgoutput lists them (attribute order, no dropped or generated columns),
with the type OID pgoutput reports, so both paths convert a column with the same converter.

Schema descriptions (`core.schema.TableSchema`) spell types with `format_type` and defaults with
`pg_get_expr`, whether they describe a Relation message or the catalog as it is now, so the same
columns describe alike either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import psycopg
from psycopg.rows import TupleRow

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.sources.base import NoPrimaryKey, UnknownTable
from airflow_provider_dblog.sources.keyset import TableShape

_ROW_KEY = """
SELECT a.attname
FROM pg_index i
JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND (
    i.indisprimary OR (
        i.indisreplident
        AND NOT EXISTS (SELECT 1 FROM pg_index p WHERE p.indrelid = i.indrelid AND p.indisprimary)
    )
)
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


# The columns a Relation message names (name, type OID, type modifier, in its order), with the
# nullability and default the catalog holds for a column of that name now (a column dropped
# since the message was sent has none: nullable, no default).
_DESCRIBE_RELATION = """
SELECT r.name, format_type(r.type_oid, r.type_modifier), coalesce(NOT a.attnotnull, true),
       pg_get_expr(d.adbin, d.adrelid), a.attnum IS NOT NULL
FROM unnest(%s::text[], %s::oid[], %s::int[]) WITH ORDINALITY AS r(name, type_oid, type_modifier, n)
LEFT JOIN pg_attribute a
  ON a.attrelid = %s AND a.attname = r.name AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
ORDER BY r.n
"""

# The columns pgoutput would list now, described as `_DESCRIBE_RELATION` describes them.
_DESCRIBE_TABLE = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid)
FROM pg_attribute a
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum
"""


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    name: str
    type_oid: int
    sql_type: str
    """The type as SQL spells it (format_type), for casting key parameters."""


def row_key(conn: psycopg.Connection[TupleRow], relation_oid: int) -> tuple[str, ...]:
    """The columns that key the table's rows: its primary key, or without one its replica
    identity index (a unique index on NOT NULL columns, which updates and deletes carry in
    the log); empty when it has neither (`setup.check_table` names the ways out)."""
    return tuple(name for (name,) in conn.execute(_ROW_KEY, (relation_oid,)))


VISIBLE_WAIT_S: Final = 1.0
"""How long `describe_relation` asks again for a column the catalog does not show yet."""


def describe_relation(
    conn: psycopg.Connection[TupleRow],
    relation_oid: int,
    columns: tuple[tuple[str, int, int], ...],
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> TableSchema:
    """The schema of a Relation message's `columns` (name, type OID, type modifier): types as
    the message gives them, nullability and defaults as the catalog has them now.

    The log can deliver a commit a moment before the server shows it to other sessions, so a
    column an ALTER added in that transaction may be missing from the catalog: asked again
    every 10 ms for up to `VISIBLE_WAIT_S`. A column still missing then (dropped since: a
    replay of older log) is described as nullable, with no default."""
    args = (
        [c[0] for c in columns],
        [c[1] for c in columns],
        [c[2] for c in columns],
        relation_oid,
    )
    deadline = time.monotonic() + VISIBLE_WAIT_S
    while True:
        rows = conn.execute(_DESCRIBE_RELATION, args).fetchall()
        if all(found for *_, found in rows) or time.monotonic() >= deadline:
            break
        sleep(0.01)
    described = tuple(Column(*row[:4]) for row in rows)
    return TableSchema(described, row_key(conn, relation_oid))


def describe_table(conn: psycopg.Connection[TupleRow], table: TableRef) -> TableSchema:
    """`table`'s schema as the catalog has it now; UnknownTable if it does not exist."""
    row = conn.execute(_TABLE_OID, (table.schema, table.name)).fetchone()
    if row is None:
        raise UnknownTable(f"table {table} does not exist")
    (oid,) = row
    columns = tuple(Column(*c) for c in conn.execute(_DESCRIBE_TABLE, (oid,)))
    return TableSchema(columns, row_key(conn, oid))


def table_shape(conn: psycopg.Connection[TupleRow], table: TableRef) -> TableShape[ColumnInfo]:
    """Columns and key (`row_key`) of `table`; UnknownTable or NoPrimaryKey otherwise."""
    row = conn.execute(_TABLE_OID, (table.schema, table.name)).fetchone()
    if row is None:
        raise UnknownTable(f"table {table} does not exist")
    (oid,) = row
    columns = tuple(ColumnInfo(*c) for c in conn.execute(_COLUMNS, (oid,)))
    by_name = {c.name: c for c in columns}
    key = tuple(by_name[name] for name in row_key(conn, oid))
    if not key:
        raise NoPrimaryKey(
            f"table {table} has no primary key and no replica identity index: add a primary "
            "key, or key it by a unique index on NOT NULL columns (ALTER TABLE ... REPLICA "
            "IDENTITY USING INDEX ...) to dump it"
        )
    return TableShape(table, columns, key)
