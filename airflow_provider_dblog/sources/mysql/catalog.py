"""What the dump and the binlog reader read from information_schema about a captured table.

A column is described once, by the server's own catalog, so both paths pick its converter
(`converters.converter`) from the same `ColumnInfo`: the log reader cannot rely on the binlog's
table map alone (without binlog_row_metadata = FULL it carries neither names, nor signedness,
nor enum members, and even with it MariaDB's JSON is a plain longtext there).

MariaDB has no JSON type: a JSON column is a longtext with a `json_valid(col)` CHECK constraint,
which is how the catalog recognises it and reports `data_type = "json"` as MySQL 8 does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pymysql

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.sources.base import NoPrimaryKey, UnknownTable
from airflow_provider_dblog.sources.keyset import TableShape

_TABLE = """
SELECT TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s
"""

_COLUMNS = """
SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME, COLLATION_NAME,
       CHARACTER_MAXIMUM_LENGTH, DATETIME_PRECISION
FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s
ORDER BY ORDINAL_POSITION
"""

_PRIMARY_KEY = """
SELECT COLUMN_NAME FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY'
ORDER BY SEQ_IN_INDEX
"""

# MariaDB's JSON columns; MySQL 8.0.16+ has the view too, with no such constraints.
_JSON_CHECKS = """
SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS
WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s
"""

_JSON_VALID = re.compile(r"json_valid\(`((?:[^`]|``)+)`\)", re.IGNORECASE)
_MEMBER = re.compile(r"'((?:[^'\\]|''|\\.)*)'")


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    """One column as information_schema.COLUMNS describes it.

    `data_type` is DATA_TYPE in lower case (`int`, `varchar`, `datetime`, ...; `json` for
    MariaDB's JSON too); `column_type` is COLUMN_TYPE (`int(10) unsigned`, `binary(16)`,
    `set('a','b')`). `length` is CHARACTER_MAXIMUM_LENGTH (bytes for binary types),
    `fsp` the fractional-second digits of time types (0 for others)."""

    name: str
    data_type: str
    column_type: str
    charset: str | None = None
    collation: str | None = None
    length: int | None = None
    fsp: int = 0

    @property
    def unsigned(self) -> bool:
        return " unsigned" in self.column_type.lower()

    @property
    def members(self) -> tuple[str, ...]:
        """The members of an enum or set in definition order; empty for other types."""
        if self.data_type not in ("enum", "set"):
            return ()
        inner = self.column_type[self.column_type.index("(") + 1 : self.column_type.rindex(")")]
        return tuple(_unquote(m) for m in _MEMBER.findall(inner))


def table_shape(
    conn: pymysql.connections.Connection[Any], table: TableRef
) -> TableShape[ColumnInfo]:
    """Columns and primary key of `table`; UnknownTable or NoPrimaryKey otherwise."""
    with conn.cursor() as cursor:
        cursor.execute(_TABLE, (table.schema, table.name))
        found = cursor.fetchone()
        if found is None or found[0] not in ("BASE TABLE", "SYSTEM VERSIONED"):
            raise UnknownTable(f"table {table} does not exist")
        cursor.execute(_JSON_CHECKS, (table.schema, table.name))
        json_columns = {
            m.group(1).replace("``", "`")
            for (clause,) in cursor.fetchall()
            for m in [_JSON_VALID.fullmatch(str(clause).strip())]
            if m is not None
        }
        cursor.execute(_COLUMNS, (table.schema, table.name))
        columns = tuple(_column(row, is_json=row[0] in json_columns) for row in cursor.fetchall())
    key_names = primary_key(conn, table)
    if not key_names:
        raise NoPrimaryKey(f"table {table} has no primary key: add one to dump it")
    by_name = {c.name: c for c in columns}
    return TableShape(table, columns, tuple(by_name[name] for name in key_names))


def primary_key(conn: pymysql.connections.Connection[Any], table: TableRef) -> tuple[str, ...]:
    """The primary-key columns of `table` in key order; empty when it has none."""
    with conn.cursor() as cursor:
        cursor.execute(_PRIMARY_KEY, (table.schema, table.name))
        return tuple(str(name) for (name,) in cursor.fetchall())


def _column(row: tuple[Any, ...], *, is_json: bool) -> ColumnInfo:
    name, data_type, column_type, charset, collation, length, fsp = row
    return ColumnInfo(
        name=str(name),
        data_type="json" if is_json else str(data_type).lower(),
        column_type=str(column_type),
        charset=None if charset is None else str(charset),
        collation=None if collation is None else str(collation),
        length=None if length is None else int(length),
        fsp=int(fsp or 0),
    )


def _unquote(member: str) -> str:
    """An enum or set member as COLUMN_TYPE quotes it ('' for a quote, backslash escapes)."""
    return re.sub(r"''|\\(.)", lambda m: m.group(1) or "'", member)


_DESCRIPTION = """
SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT
FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s
ORDER BY ORDINAL_POSITION
"""


def table_schema(
    conn: pymysql.connections.Connection[Any], shape: TableShape[ColumnInfo]
) -> TableSchema:
    """The description schema events carry (`core.schema`): COLUMN_TYPE, IS_NULLABLE and
    COLUMN_DEFAULT's text for each column of `shape`'s table, and its key. MariaDB spells no
    default or a NULL one as the text NULL; both are None here."""
    with conn.cursor() as cursor:
        cursor.execute(_DESCRIPTION, (shape.table.schema, shape.table.name))
        columns = tuple(
            Column(
                name=str(name),
                type=str(column_type),
                nullable=str(nullable).upper() == "YES",
                default=None if default is None or default == "NULL" else str(default),
            )
            for name, column_type, nullable, default in cursor.fetchall()
        )
    return TableSchema(columns, shape.key_columns)
