"""A schema change (`s`), applied in the batch's transaction, so the target table follows its
source table's columns (`dblog_schemas` keeps, per source table, the version and schema last
applied; a replayed older version is skipped):
- a column the target lacks is added with the source's type, default and NOT NULL, so the
  target's existing rows get the default as the source's did (a volatile default such as now()
  or a sequence gives them other values than the source's, or fails: dump the table after such
  an ALTER);
- a column the last applied schema had and the new one lacks is dropped (columns of the
  target's own, never in the source, are left alone);
- a type that changed since the last applied schema is applied if PostgreSQL converts the column
  without a USING clause (int to bigint, a longer varchar, to text); otherwise the output stops
  (`OutputError`) saying what to alter in the target before the tailer is started again;
- the defaults and NOT NULL of existing columns and the primary key are left as they are: they
  change no row. The first schema event of a table only adds missing columns.
A replay that crosses a dropped column carries rows with it: that column is left out of the
rows older than the schema applied (they are older images the replay goes past anyway:
`dropped`).
Types and defaults are the source's SQL text, run in the target: a target trusts its source's
catalog, and must be PostgreSQL when the source is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from airflow_provider_dblog.core.event import Event
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.outputs.base import OutputError
from airflow_provider_dblog.outputs.sql_apply.target import RELATION, Target

SCHEMAS_TABLE = "dblog_schemas"

CREATE_SCHEMAS = sql.SQL(
    """CREATE TABLE IF NOT EXISTS {table} (
    source text NOT NULL,
    schema text NOT NULL,
    tbl text NOT NULL,
    version bigint NOT NULL,
    table_schema jsonb NOT NULL,
    PRIMARY KEY (source, schema, tbl)
)"""
).format(table=sql.Identifier(SCHEMAS_TABLE))

_APPLIED_SCHEMA = sql.SQL(
    "SELECT version, table_schema FROM {table} WHERE source = %s AND schema = %s AND tbl = %s"
).format(table=sql.Identifier(SCHEMAS_TABLE))

_SAVE_SCHEMA = sql.SQL(
    """INSERT INTO {table} (source, schema, tbl, version, table_schema)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (source, schema, tbl) DO UPDATE SET version = EXCLUDED.version,
table_schema = EXCLUDED.table_schema"""
).format(table=sql.Identifier(SCHEMAS_TABLE))

# A target table's columns and their full types, to compare with a schema event's.
_COLUMN_TYPES = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


def _column_definition(column: Column) -> sql.Composed:
    """`name type [DEFAULT ...] [NOT NULL]` as the source spells them."""
    parts = [sql.Identifier(column.name), sql.SQL(column.type)]
    if column.default is not None:
        parts += [sql.SQL("DEFAULT"), sql.SQL(column.default)]
    if not column.nullable:
        parts.append(sql.SQL("NOT NULL"))
    return sql.SQL(" ").join(parts)


def alter(conn: psycopg.Connection[Any], event: Event, target: Target) -> None:
    """Give the target the event's columns (see the module docstring for what is done)."""
    schema = event.table_schema
    assert schema is not None  # an `s` event carries one
    where = (event.source.name, event.table.schema, event.table.name)
    applied = conn.execute(_APPLIED_SCHEMA, where).fetchone()
    if applied is not None and applied[0] >= event.schema_version:
        return  # a replay of a schema already applied
    previous = None if applied is None else TableSchema.from_json(applied[1])
    oid = conn.execute(RELATION, (target.ref.schema, target.ref.name)).fetchone()
    assert oid is not None  # described just before, in this transaction
    types: dict[str, str] = dict(conn.execute(_COLUMN_TYPES, (oid[0],)).fetchall())
    table = sql.Identifier(target.ref.schema, target.ref.name)
    for column in schema.columns:
        old = None if previous is None else previous.column(column.name)
        if column.name not in types:
            add = sql.SQL("ALTER TABLE {} ADD COLUMN {}")
            _ddl(conn, event, add.format(table, _column_definition(column)))
        elif old is not None and old.type != column.type != types[column.name]:
            _ddl(
                conn,
                event,
                sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {}").format(
                    table, sql.Identifier(column.name), sql.SQL(column.type)
                ),
                f"column {column.name} changed type from {old.type} to {column.type} in "
                "the source, and the target cannot convert it without a USING clause: "
                f"ALTER TABLE {target.ref} ALTER COLUMN {column.name} TYPE {column.type} "
                "USING ... as the source did, then start the tailer again",
            )
    for old in () if previous is None else previous.columns:
        if old.name in types and schema.column(old.name) is None:
            drop = sql.SQL("ALTER TABLE {} DROP COLUMN {}")
            _ddl(conn, event, drop.format(table, sql.Identifier(old.name)))
    conn.execute(_SAVE_SCHEMA, (*where, event.schema_version, Jsonb(schema.to_json())))


def _ddl(
    conn: psycopg.Connection[Any],
    event: Event,
    statement: sql.Composed,
    what_to_do: str | None = None,
) -> None:
    try:
        conn.execute(statement)
    except psycopg.Error as exc:
        if isinstance(exc, psycopg.OperationalError) or (conn.closed or conn.broken):
            raise
        detail = what_to_do or (
            "apply the change to the target table by hand, then start the tailer again"
        )
        raise OutputError(
            f"cannot apply the schema change of {event.table} at {event.position} "
            f"(schema_version {event.schema_version}) to the SQL target: "
            f"{str(exc).strip().splitlines()[0]}; {detail}"
        ) from exc


def dropped(
    conn: psycopg.Connection[Any], event: Event, target: Target, columns: Sequence[str]
) -> frozenset[str]:
    """The event's columns the target lacks because a later schema event, already applied,
    dropped them: a replay (a restarted tailer re-sends what came after its last
    acknowledged position) carries the rows of before the DROP COLUMN. Any other missing
    column is the target's fault, and `Target.check` names it."""
    missing = frozenset(c for c in columns if c not in target.columns) - set(event.key)
    if not missing:
        return missing
    where = (event.source.name, event.table.schema, event.table.name)
    applied = conn.execute(_APPLIED_SCHEMA, where).fetchone()
    if applied is None or applied[0] <= event.schema_version:
        return frozenset()
    later = TableSchema.from_json(applied[1])
    return frozenset(c for c in missing if later.column(c) is None)
