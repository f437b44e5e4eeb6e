"""MySQL/MariaDB values to JSON: one converter per column type, for what a chunk query reads.

The log reader decodes the binlog's bytes itself (`rows.py`) into the same JSON these give for
the same stored value (the integration tests compare the two paths byte for byte). What PyMySQL
hands over (probed on MariaDB 10.11 with PyMySQL 1.2), and the JSON:

- tinyint .. bigint, signed or unsigned (bool is tinyint(1)): int -> int.
- decimal: Decimal -> its digits as a string, scale kept (`"-1.50"`), as PostgreSQL's numeric.
- float: the double it stores (the dump selects `CAST(col AS DOUBLE)`, `read_expression`: the
  server would print 6 digits) -> the shortest float that is the same 32-bit float (`1.1`, not
  1.100000023841858).
- double: float -> float.
- char, varchar, text: str (bytes for a column read without a character set: decoded with
  its own) -> str. Trailing spaces of char are gone.
- binary(n): bytes padded with zero bytes to n -> base64 of the n bytes, as PostgreSQL's bytea.
- varbinary, blob: bytes -> base64.
- date: date, a str for a zero or invalid date (non-strict sql_mode) -> `"2024-02-29"`, null.
- datetime(p), timestamp(p): datetime, UTC for timestamps (the session time zone is UTC), a str
  for a zero value -> `"2024-02-29 23:59:59.123456"` with exactly p fraction digits, as the
  server prints it; null for zero values.
- time(p): timedelta -> `"-838:59:59"`, `"12:34:56.001"` with p fraction digits.
- year: int -> int (0 for the zero year).
- json: str (MariaDB's JSON is a longtext; MySQL 8 sends its text) -> the parsed JSON value.
- enum: str -> str. set: str, members in definition order -> the same (`"a,c"`, `""`).
- bit(n): bytes, big-endian -> int.
- NULL: None -> null.

Calling them: `converter(column)` returns the function for a column described by
`catalog.ColumnInfo`; `catalog.table_shape(conn, table)` (conn from `config.connect()`) gives
every column of a table in table order, with its unsigned flag, charset, length, fraction digits
and enum/set members. Build the converters once per table and call one per value.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import struct
from collections.abc import Callable
from typing import Any

from pymysql.charset import charset_by_name

from airflow_provider_dblog.core.event import JsonValue
from airflow_provider_dblog.sources.mysql.catalog import ColumnInfo

Converter = Callable[[Any], JsonValue]

_INTEGER_BITS = {"tinyint": 8, "smallint": 16, "mediumint": 24, "int": 32, "bigint": 64}
_TEXT_TYPES = frozenset(("char", "varchar", "tinytext", "text", "mediumtext", "longtext"))
_BINARY_TYPES = frozenset(("varbinary", "tinyblob", "blob", "mediumblob", "longblob"))
_FLOAT32 = struct.Struct("<f")
_FLOAT32_MAX = 3.4028234663852886e38


def converter(column: ColumnInfo) -> Converter:
    """The function from either path's Python value of `column` to its JSON value."""
    kind = column.data_type
    if kind in _INTEGER_BITS or kind == "year":
        return _nullable(int)
    if kind == "decimal":
        return _nullable(_decimal)
    if kind == "float":
        return _nullable(float32)
    if kind == "double":
        return _nullable(float)
    if kind == "binary":
        return _nullable(_binary(column.length or 0))
    if kind in _BINARY_TYPES:
        return _nullable(_binary(0))
    if kind == "date":
        return _date
    if kind in ("datetime", "timestamp"):
        return _datetime(column.fsp)
    if kind == "time":
        return _nullable(_time(column.fsp))
    if kind == "json":
        return _nullable(_json)
    if kind in ("set", "enum"):
        return _nullable(str)
    if kind == "bit":
        return _nullable(_bit)
    if kind in _TEXT_TYPES:
        return _nullable(_text(encoding(column.charset)))
    return _nullable(_other)


def read_expression(column: ColumnInfo) -> str:
    """How the dump selects `column` (SQL, the name quoted) so PyMySQL returns a value its
    converter reads like the log's: FLOAT as the double it stores, not its 6-digit text."""
    name = quote_name(column.name)
    return f"CAST({name} AS DOUBLE)" if column.data_type == "float" else name


def quote_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def to_param(column: ColumnInfo, value: JsonValue) -> Any:
    """A key value as the query parameter PyMySQL sends for comparison with `column`: the
    inverse of `converter(column)` for types a primary key can have (enum and set members as
    their numbers, which is how the server orders them)."""
    if value is None:
        raise ValueError("a key value is never NULL")
    kind = column.data_type
    if isinstance(value, list | dict) or kind == "json":
        raise ValueError(f"JSON values cannot be keys: {value!r}")
    if kind in _INTEGER_BITS or kind in ("year", "bit"):
        return int(value)
    if kind == "decimal":
        return decimal.Decimal(str(value))
    if kind == "float":
        # The stored 32-bit value exactly: the server compares FLOAT as that double, and
        # 1.1 < 1.100000023841858 would put a row after its own key.
        return _FLOAT32.unpack(_FLOAT32.pack(float(value)))[0]
    if kind == "double":
        return float(value)
    if kind == "binary" or kind in _BINARY_TYPES:
        return base64.b64decode(str(value), validate=True)
    if kind in ("enum", "set"):
        return _member_number(column.members, kind, str(value))
    return str(value)


def _member_number(members: tuple[str, ...], kind: str, value: str) -> int:
    """An enum or set value as the number the server sorts it by (ORDER BY uses the index, a
    comparison with a string would compare text: keyset bounds must use the number)."""
    try:
        if kind == "enum":
            return members.index(value) + 1 if value else 0
        return sum(1 << members.index(m) for m in value.split(",")) if value else 0
    except ValueError:
        raise ValueError(f"{value!r} is not one of the {kind} members {members}") from None


def _nullable(convert: Callable[[Any], JsonValue]) -> Converter:
    def nullable(value: Any) -> JsonValue:
        return None if value is None else convert(value)

    return nullable


def _decimal(value: Any) -> JsonValue:
    """Never exponent notation (str(Decimal('0E-10')) is '0E-10'): the digits, scale kept."""
    return format(decimal.Decimal(value), "f")


def float32(value: Any) -> JsonValue:
    """The shortest decimal that reads back as the same 32-bit float (1.1, not 1.100000023...).
    Near the largest float a shorter decimal may round past it: not a candidate."""
    (stored,) = _FLOAT32.unpack(_FLOAT32.pack(float(value)))
    for digits in range(1, 10):
        shortest = float(f"{stored:.{digits}g}")
        if abs(shortest) <= _FLOAT32_MAX and _FLOAT32.unpack(_FLOAT32.pack(shortest))[0] == stored:
            return shortest
    return float(stored)


def _binary(length: int) -> Callable[[Any], JsonValue]:
    """binary(n) as stored, padded to its length with zero bytes (as a chunk read gives it;
    the binlog strips them)."""

    def binary(value: Any) -> JsonValue:
        data = bytes(value)
        if len(data) < length:
            data = data.ljust(length, b"\0")
        return base64.b64encode(data).decode("ascii")

    return binary


def _date(value: Any) -> JsonValue:
    """A zero or invalid date (PyMySQL gives its text) is null."""
    if isinstance(value, datetime.date):
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
    return None


def _datetime(fsp: int) -> Converter:
    """A zero or invalid datetime or timestamp (PyMySQL gives its text) is null."""

    def convert(value: Any) -> JsonValue:
        if not isinstance(value, datetime.datetime):
            return None
        text = (
            f"{value.year:04d}-{value.month:02d}-{value.day:02d} "
            f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
        )
        return text + _fraction(value.microsecond, fsp)

    return convert


def _time(fsp: int) -> Callable[[Any], JsonValue]:
    def convert(value: Any) -> JsonValue:
        micros = value // datetime.timedelta(microseconds=1)
        sign = "-" if micros < 0 else ""
        seconds, micro = divmod(abs(micros), 1_000_000)
        minutes, second = divmod(seconds, 60)
        hours, minute = divmod(minutes, 60)
        return f"{sign}{hours:02d}:{minute:02d}:{second:02d}" + _fraction(micro, fsp)

    return convert


def _fraction(microsecond: int, fsp: int) -> str:
    return f".{microsecond:06d}"[: fsp + 1] if fsp else ""


def _json(value: Any) -> JsonValue:
    parsed: JsonValue = json.loads(value)
    return parsed


def _bit(value: Any) -> JsonValue:
    return int.from_bytes(value, "big") if isinstance(value, bytes) else int(value)


def _text(encoding: str) -> Callable[[Any], JsonValue]:
    def convert(value: Any) -> JsonValue:
        return value.decode(encoding) if isinstance(value, bytes | bytearray) else str(value)

    return convert


def encoding(charset: str | None) -> str:
    """The Python codec of a MySQL character set (latin1 is cp1252 in MySQL)."""
    found = charset_by_name(charset) if charset else None
    return found.encoding if found is not None else "utf-8"


def _other(value: Any) -> JsonValue:
    """A type outside the supported list (geometry, ...): bytes as base64, else its text."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, int | float | str):
        return value
    return str(value)
