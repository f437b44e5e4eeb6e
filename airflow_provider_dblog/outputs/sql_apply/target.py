"""A target table as the target's catalog describes it, and how a JSON value becomes a parameter
for one of its columns.

Column types are read from the target once per table and values adapted to them: dicts and
lists for json/jsonb, base64 text for bytea, lists for arrays; every parameter is cast to its
column's type, so numeric, uuid, timestamptz and the like travel as the strings the source made
of them.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Json, Jsonb

from airflow_provider_dblog.core.event import JsonValue, Row, TableRef
from airflow_provider_dblog.outputs.base import TargetTableMissing

RELATION = """
SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
"""

# Domains are looked through to their base type, arrays to their element type. Parameters are
# cast to the type without its modifier: an explicit cast to varchar(n) truncates silently, while
# the assignment to the column errors. bpchar and bit keep theirs: alone they mean length 1.
_COLUMNS = """
SELECT a.attname, b.typname, e.typname, format_type(
    a.atttypid,
    CASE WHEN coalesce(e.typname, b.typname) IN ('bpchar', 'bit') THEN a.atttypmod END
)
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
LEFT JOIN pg_type e ON e.oid = b.typelem AND b.typcategory = 'A'
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

_PRIMARY_KEY = """
SELECT a.attname
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND i.indisprimary
ORDER BY k.n
"""


def _adapter(type_name: str) -> Callable[[JsonValue], Any]:
    """How a JSON value becomes a parameter for a column of base type `type_name`."""
    if type_name == "jsonb":
        return Jsonb
    if type_name == "json":
        return Json
    if type_name == "bytea":
        return lambda v: base64.b64decode(v) if isinstance(v, str) else v
    return lambda v: v


def _array_adapter(element: Callable[[JsonValue], Any]) -> Callable[[JsonValue], Any]:
    def adapt(value: JsonValue) -> Any:
        if isinstance(value, list):
            return [None if v is None else adapt(v) for v in value]  # nested: multi-dim arrays
        return element(value)

    return adapt


@dataclass(frozen=True)
class TargetColumn:
    type_sql: str
    """`format_type` of the column: what every parameter is cast to."""
    adapt: Callable[[JsonValue], Any]


@dataclass(frozen=True)
class Target:
    """A target table as the catalog describes it."""

    ref: TableRef
    columns: Mapping[str, TargetColumn]
    key: tuple[str, ...]

    def placeholder(self, column: str) -> sql.Composable:
        return sql.SQL("%s::{}").format(sql.SQL(self.columns[column].type_sql))

    def check(self, source: TableRef, key: Row, columns: Sequence[str]) -> None:
        if set(key) != set(self.key):
            raise TargetTableMissing(
                f"target table {self.ref} has primary key ({', '.join(self.key)}) but events "
                f"of {source} are keyed by ({', '.join(key)}): give it the source's primary key"
            )
        missing = [c for c in columns if c not in self.columns]
        if missing:
            raise TargetTableMissing(
                f"target table {self.ref} has no column {', '.join(missing)} that events of "
                f"{source} carry: add the column"
            )


class TableMap:
    """Which target table a source table's events go to: `table_map` maps a source table
    ("schema.table") to its target table ("schema.table", or a bare name in the source's
    schema); unmapped tables go to the same schema and name."""

    def __init__(self, table_map: Mapping[str, str] | None) -> None:
        self._map = {
            TableRef.parse(src): TableRef.parse(dst, default_schema=TableRef.parse(src).schema)
            for src, dst in (table_map or {}).items()
        }

    def target_of(self, source: TableRef) -> TableRef:
        return self._map.get(source, source)


def describe(conn: psycopg.Connection[Any], source: TableRef, ref: TableRef) -> Target:
    """The target table `ref` of `source`'s events, read from the catalog."""
    row = conn.execute(RELATION, (ref.schema, ref.name)).fetchone()
    if row is None:
        raise TargetTableMissing(
            f"target table {ref} (for {source}) does not exist: create it with the "
            "source's columns and primary key"
        )
    oid = row[0]
    columns = {}
    for name, base, element, type_sql in conn.execute(_COLUMNS, (oid,)):
        adapt = _array_adapter(_adapter(element)) if element else _adapter(base)
        columns[name] = TargetColumn(type_sql, adapt)
    key = tuple(r[0] for r in conn.execute(_PRIMARY_KEY, (oid,)))
    if not key:
        raise TargetTableMissing(f"target table {ref} has no primary key: give it the source's")
    return Target(ref, columns, key)
