"""A chunk read as columns of text, for a target that takes columns (the lake): the server prints
the chunk's rows as CSV (`COPY (chunk query) TO STDOUT`) and Arrow splits them, with no Python
work per row. Each column comes with its type OID, what its text is to the converters
(`TextKind`) and its converter, so the target turns it into its own type exactly as it turns
the converters' values (`lake.schema.LakeSchema.values_from_text`).

CSV keeps what the rows need: PostgreSQL writes NULL as an empty unquoted field and the empty
string quoted, which Arrow keeps apart, and quotes every field holding a comma, a quote or a
line break. Imported only where a lake is written: pyarrow costs a process that never writes
one about 80 MiB.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import pyarrow as pa
import pyarrow.csv as pacsv

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


def text_columns(data: bytes, columns: Sequence[ColumnInfo]) -> tuple[TextColumn, ...]:
    """The CSV `COPY ... TO STDOUT (FORMAT csv)` printed for `columns`, split by Arrow."""
    if not data:
        empty = pa.array([], pa.string())
        return tuple(_column(info, empty) for info in columns)
    names = [f"c{i}" for i in range(len(columns))]
    table = pacsv.read_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(column_names=names, block_size=1 << 24),
        # A line may be empty: one column, NULL.
        parse_options=pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.string()),
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    )
    return tuple(_column(info, table.column(i).combine_chunks()) for i, info in enumerate(columns))


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
