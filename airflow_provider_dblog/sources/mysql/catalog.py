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

_UNIQUE_INDEXES = """
SELECT s.INDEX_NAME, s.COLUMN_NAME, c.IS_NULLABLE = 'NO' AND s.SUB_PART IS NULL
FROM information_schema.STATISTICS s
LEFT JOIN information_schema.COLUMNS c
  ON c.TABLE_SCHEMA = s.TABLE_SCHEMA AND c.TABLE_NAME = s.TABLE_NAME
 AND c.COLUMN_NAME = s.COLUMN_NAME
WHERE s.TABLE_SCHEMA = %s AND s.TABLE_NAME = %s AND s.NON_UNIQUE = 0
ORDER BY s.INDEX_NAME, s.SEQ_IN_INDEX
"""
"""Each unique index's columns in order, and whether the column can key rows: NOT NULL,
whole (no prefix); an expression's part (MySQL 8) has no column and keys nothing."""

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
    conn: pymysql.connections.Connection[Any], table: TableRef, unique_key: str | None = None
) -> TableShape[ColumnInfo]:
    """Columns and key (`row_key`) of `table`; UnknownTable or NoPrimaryKey otherwise."""
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
    key_names = row_key(conn, table, unique_key)
    by_name = {c.name: c for c in columns}
    return TableShape(table, columns, tuple(by_name[name] for name in key_names))


@dataclass(frozen=True, slots=True)
class UniqueIndex:
    """A unique index; `keys_rows` when every part is a whole NOT NULL column, so that no two
    rows can share its values (NULLs repeat in a unique index)."""

    name: str
    columns: tuple[str, ...]
    keys_rows: bool

    def __str__(self) -> str:
        return f"{self.name} ({', '.join(self.columns)})"


def row_key(
    conn: pymysql.connections.Connection[Any], table: TableRef, unique_key: str | None = None
) -> tuple[str, ...]:
    """The columns that key `table`'s rows (`choose_row_key`); NoPrimaryKey naming the ways
    out when none does."""
    parts: dict[str, list[tuple[str | None, bool]]] = {}
    with conn.cursor() as cursor:
        cursor.execute(_UNIQUE_INDEXES, (table.schema, table.name))
        for name, column, whole in cursor.fetchall():
            parts.setdefault(str(name), []).append((column, bool(whole)))
    indexes = [
        UniqueIndex(
            name,
            tuple(str(c) for c, _ in columns if c is not None),
            all(c is not None and whole for c, whole in columns),
        )
        for name, columns in parts.items()
    ]
    return choose_row_key(table, indexes, unique_key)


def choose_row_key(
    table: TableRef, indexes: list[UniqueIndex], unique_key: str | None
) -> tuple[str, ...]:
    """The primary key; without one the unique index `unique_key` names (`[source]
    unique_keys`), which must key rows; without that the only unique index that keys rows.
    Anything else is NoPrimaryKey naming what to do."""
    by_name = {i.name: i for i in indexes}
    if "PRIMARY" in by_name:
        if unique_key is not None:
            raise NoPrimaryKey(
                f"[source] unique_keys names index {unique_key} for {table}, which has a primary "
                "key: it is keyed by its primary key; remove the entry"
            )
        return by_name["PRIMARY"].columns
    usable = [i for i in indexes if i.keys_rows]
    if unique_key is not None:
        chosen = by_name.get(unique_key)
        if chosen is None or not chosen.keys_rows:
            why = "does not exist" if chosen is None else "has a nullable or prefix column"
            raise NoPrimaryKey(
                f"[source] unique_keys names index {unique_key} for {table}, which {why}; "
                f"its unique indexes on whole NOT NULL columns: "
                f"{', '.join(map(str, usable)) or 'none'}"
            )
        return chosen.columns
    if len(usable) == 1:
        return usable[0].columns
    if usable:
        raise NoPrimaryKey(
            f"table {table} has no primary key and {len(usable)} unique indexes that could key "
            f"it: {', '.join(map(str, usable))}; choose one in the TOML: [source] unique_keys = "
            f'{{ "{table}" = "{usable[0].name}" }}'
        )
    nullable = [str(i) for i in indexes]
    also = f" (its unique indexes {', '.join(nullable)} have nullable or prefix columns)"
    raise NoPrimaryKey(
        f"table {table} has no primary key and no unique index on whole NOT NULL columns"
        f"{also if nullable else ''}: DBLog chunks and reconciles by a key; add a primary key "
        f"(ALTER TABLE {table} ADD PRIMARY KEY (...)) or a unique index on NOT NULL columns, "
        "or stop capturing it"
    )


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
