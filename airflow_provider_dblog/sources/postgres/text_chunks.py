"""A chunk read as columns of text, for a target that takes columns (the lake): the text the
server prints for each value, taken from the query's result column by column into Arrow
arrays, with no Python object per row. Each column comes with its type OID, what its text is to
the converters (`TextKind`) and its converter, so the target turns it into its own type exactly
as it turns the converters' values (`lake.schema.LakeSchema.values_from_text`).

Imported only where a lake is written: pyarrow costs a process that never writes one about
80 MiB.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import pyarrow as pa
from psycopg.pq.abc import PGresult

from airflow_provider_dblog.core.event import JsonValue, Key, freeze
from airflow_provider_dblog.sources.postgres.catalog import ColumnInfo
from airflow_provider_dblog.sources.postgres.converters import (
    BOOL,
    INT2,
    INT4,
    INT8,
    OID,
    column_converter,
    keeps_text,
)


class TextKind(Enum):
    """What a column's text is to the converters, so a target may take it without them."""

    TEXT = "text"
    """The converter's value is the text itself."""
    INT = "int"
    """The converter's value is `int(text)`."""
    BOOL = "bool"
    """The converter's value is `text == "t"`."""
    OTHER = "other"
    """Anything else: only the converter says."""


_INTEGERS = frozenset({INT2, INT4, INT8, OID})


def text_kind(type_oid: int) -> TextKind:
    if type_oid in _INTEGERS:
        return TextKind.INT
    if type_oid == BOOL:
        return TextKind.BOOL
    return TextKind.TEXT if keeps_text(type_oid) else TextKind.OTHER


@dataclass(frozen=True)
class TextColumn:
    """One column of a chunk: PostgreSQL's text of each value (null for NULL)."""

    name: str
    text: pa.Array
    kind: TextKind
    convert: Callable[[str], JsonValue]
    """The converter of its non-NULL values (`converters.column_converter`)."""


@dataclass(frozen=True)
class ChunkText:
    """A chunk read as text columns, in key order, and what the dump needs of the read."""

    columns: tuple[TextColumn, ...]
    rows: int
    last_key: Key | None
    invisible_txids: frozenset[int]


def text_columns(result: PGresult | None, columns: Sequence[ColumnInfo]) -> tuple[TextColumn, ...]:
    """The text result of a query whose columns are `columns`, column by column: each value's
    bytes straight into an Arrow string array (UTF-8, the client encoding the source's
    connections set)."""
    if result is None:
        return tuple(_column(info, pa.array([], pa.string())) for info in columns)
    get, rows = result.get_value, range(result.ntuples)
    return tuple(
        _column(info, pa.array([get(r, i) for r in rows], pa.string()))
        for i, info in enumerate(columns)
    )


def _column(info: ColumnInfo, text: pa.Array) -> TextColumn:
    return TextColumn(info.name, text, text_kind(info.type_oid), column_converter(info.type_oid))


def last_key(columns: Sequence[TextColumn], key: Sequence[str]) -> Key | None:
    """The key of the last row, as `key_of` gives it from the converters' row."""
    by_name = {c.name: c for c in columns}
    found = []
    for name in key:
        column = by_name[name]
        if len(column.text) == 0:
            return None
        text = column.text[-1].as_py()
        found.append(freeze(None if text is None else column.convert(text)))
    return tuple(found)
