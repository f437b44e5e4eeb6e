"""A chunk's result read as the text the server sends, column by column.

PyMySQL turns every value into a Python object as it reads a row (`int`, `Decimal`, a regular
expression per datetime) and the converters then turn that object into JSON: two calls a
value, and a dict built in Python a row. A chunk's query is read with no PyMySQL decoder
instead (`undecoded`): each value is the server's text (the bytes of a binary column). Each
column is then read in one pass (`load_rows`, or Arrow arrays for the lake: `text_chunks.py`):
kept as it is where the converters' JSON is the text itself (text, enum and set columns, and
decimals: the server prints their digits with the column's scale as the converters spell
them, but for ZEROFILL's leading zeros), `int` of it for integer columns, and for every other
column the decoder PyMySQL would have applied followed by the column's converter: the same
functions on the same text, so the same JSON as the log's
(`tests/integration/test_mysql_types.py` compares them byte for byte).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import Any

import pymysql
from pymysql.converters import decoders, through

from airflow_provider_dblog.core.event import JsonValue, Row
from airflow_provider_dblog.sources.mysql.catalog import ColumnInfo
from airflow_provider_dblog.sources.mysql.converters import converter
from airflow_provider_dblog.sources.text_chunks import TextKind

_INTEGERS = frozenset(("tinyint", "smallint", "mediumint", "int", "bigint"))
_TEXTS = frozenset(("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"))
"""Types whose JSON is the text PyMySQL decodes with the connection's character set: what the
converters return for a `str` of a text, an enum or a set column is that `str`."""


@dataclass(frozen=True, slots=True)
class TextReader:
    """How to read one column of a chunk's undecoded result."""

    name: str
    at: int
    """Where its value is in a result row."""
    kind: TextKind
    convert: Callable[[Any], JsonValue]
    """From a non-NULL value of the result (text, or bytes) to its JSON."""


def text_kind(column: ColumnInfo) -> TextKind:
    if column.data_type in _INTEGERS:
        return TextKind.INT
    if column.data_type in _TEXTS:
        return TextKind.TEXT
    if column.data_type == "decimal" and "zerofill" not in column.column_type.lower():
        return TextKind.TEXT
    return TextKind.OTHER


def text_reader(column: ColumnInfo, at: int, type_code: int) -> TextReader:
    """The reader of `column`, at `at` in the result, whose field type is `type_code`."""
    convert = converter(column)
    decode = decoders.get(type_code, through)
    if decode is not through:
        convert = _composed(decode, convert)
    return TextReader(column.name, at, text_kind(column), convert)


def _composed(
    decode: Callable[[Any], Any], convert: Callable[[Any], JsonValue]
) -> Callable[[Any], JsonValue]:
    def decoded(text: Any) -> JsonValue:
        return convert(decode(text))

    return decoded


@contextmanager
def undecoded(conn: pymysql.connections.Connection[Any]) -> Iterator[None]:
    """Queries run inside return every value as the server's text (bytes for a binary
    column; NULL as None): PyMySQL picks a result's decoders from the connection's when it
    reads the result, so they are none for that while."""
    kept, conn.decoders = conn.decoders, {}
    try:
        yield
    finally:
        conn.decoders = kept


def column_values(raw: Sequence[Sequence[Any]], reader: TextReader) -> list[JsonValue]:
    """One column of `raw` (rows of an undecoded result) as the converters' JSON values."""
    values: list[Any] = list(map(itemgetter(reader.at), raw))
    if reader.kind is TextKind.TEXT:
        return values
    convert: Callable[[Any], JsonValue] = int if reader.kind is TextKind.INT else reader.convert
    if None in values:
        return [None if v is None else convert(v) for v in values]
    return list(map(convert, values))


def load_rows(raw: Sequence[Sequence[Any]], readers: Sequence[TextReader]) -> list[Row]:
    """Every row of an undecoded result as a dict from each reader's column to its JSON
    value: a pass per column, then the rows built in C-level passes."""
    names = [r.name for r in readers]
    columns = [column_values(raw, r) for r in readers]
    return list(map(dict, map(zip, repeat(names), zip(*columns, strict=True))))
