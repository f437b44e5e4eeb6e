"""MySQL/MariaDB values to JSON: one converter per column type, for the log and the dump alike.

The two paths hand over different Python values for the same stored value, so each converter
accepts both and returns one JSON value (what was probed on MariaDB 10.11 with PyMySQL 1.2
and mysql-replication 1.0.17):

type: dump (PyMySQL) / log (mysql-replication) -> JSON

- tinyint .. bigint, signed or unsigned (bool is tinyint(1)): int / int, negative for a large
  unsigned value without FULL row metadata -> int.
- decimal: Decimal / Decimal -> its digits as a string, scale kept (`"-1.50"`), as PostgreSQL's
  numeric.
- float: float of the 6 digits the server prints, so the dump selects `CAST(col AS DOUBLE)`
  (`read_expression`) / float of the 4 stored bytes -> the shortest float that is the same
  32-bit float (`1.1`, not 1.100000023841858).
- double: float / float -> float.
- char, varchar, text: str / str (bytes if the charset is unknown: decoded with the column's
  charset) -> str. Trailing spaces of char are gone on both paths.
- binary(n): bytes padded with zero bytes to n / bytes with the trailing zero bytes stripped
  (`''` if all were) -> base64 of the n bytes, as PostgreSQL's bytea.
- varbinary, blob: bytes / bytes -> base64.
- date: date, a str for a zero date / date, None for a zero date -> `"2024-02-29"`; zero and
  invalid dates (non-strict sql_mode) are null on both paths.
- datetime(p), timestamp(p): datetime / datetime, both UTC for timestamps (the session time
  zone is UTC) -> `"2024-02-29 23:59:59.123456"` with exactly p fraction digits, as the server
  prints it; zero datetimes and timestamps are null.
- time(p): timedelta / timedelta -> `"-838:59:59"`, `"12:34:56.001"` with p fraction digits.
- year: int / int, 1900 for the zero year -> int, 0 for the zero year.
- json: str (MariaDB's JSON is a longtext) / str on MariaDB, the decoded document on MySQL 8
  (bytes for its strings) -> the parsed JSON value.
- enum: str / str (None without FULL row metadata) -> str.
- set: str, members in definition order / a Python set, None for the empty set -> str, members
  in definition order, comma-separated (`"a,c"`, `""`).
- bit(n): bytes, big-endian / str of '0' and '1' -> int.
- NULL: None / None -> null.

Calling them: `converter(column)` returns the function for a column described by
`catalog.ColumnInfo`; `catalog.table_shape(conn, table)` (conn from `config.connect()`) gives
every column of a table in table order, with its unsigned flag, charset, length, fraction digits
and enum/set members. Build the converters once per table (again when the binlog's table map for
it changes: an ALTER TABLE) and call one per value, matching values to columns by name. For a
log row from mysql-replication, pass each value of `row["values"]` (`before_values`,
`after_values`) to its column's converter, except that a None whose `none_sources` entry is
`"empty set"` must be passed as `set()`: the library decodes the empty set as None, and only its
`none_sources` tells it from NULL. Zero dates also decode as None (`"out of date range"`): they
become null on both paths.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import struct
from collections.abc import Callable, Collection
from typing import Any

from pymysql.charset import charset_by_name

from airflow_provider_dblog.core.event import JsonValue
from airflow_provider_dblog.sources.mysql.catalog import ColumnInfo

Converter = Callable[[Any], JsonValue]

_INTEGER_BITS = {"tinyint": 8, "smallint": 16, "mediumint": 24, "int": 32, "bigint": 64}
_TEXT_TYPES = frozenset(("char", "varchar", "tinytext", "text", "mediumtext", "longtext"))
_BINARY_TYPES = frozenset(("varbinary", "tinyblob", "blob", "mediumblob", "longblob"))
_EPOCH = datetime.datetime(1970, 1, 1)
_FLOAT32 = struct.Struct("<f")
_FLOAT32_MAX = 3.4028234663852886e38


def converter(column: ColumnInfo) -> Converter:
    """The function from either path's Python value of `column` to its JSON value."""
    kind = column.data_type
    if kind in _INTEGER_BITS:
        return _integer(_INTEGER_BITS[kind]) if column.unsigned else _nullable(int)
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
        return _datetime(column.fsp, zero_is_epoch=kind == "timestamp")
    if kind == "time":
        return _nullable(_time(column.fsp))
    if kind == "year":
        return _nullable(_year)
    if kind == "json":
        return _nullable(_json)
    if kind == "set":
        return _nullable(_set(column.members))
    if kind == "enum":
        return _nullable(_enum(column.members))
    if kind == "bit":
        return _nullable(_bit)
    if kind in _TEXT_TYPES:
        return _nullable(_text(encoding(column.charset)))
    return _nullable(_other)


def convert(column: ColumnInfo, value: Any) -> JsonValue:
    """`converter(column)(value)`, for one value."""
    return converter(column)(value)


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


def _integer(bits: int) -> Converter:
    """An unsigned integer; without FULL row metadata the binlog decodes it as signed."""
    wrap = 1 << bits

    def unsigned(value: Any) -> JsonValue:
        if value is None:
            return None
        number = int(value)
        return number + wrap if number < 0 else number

    return unsigned


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
    """binary(n) is padded to its length with zero bytes; the binlog strips them."""

    def binary(value: Any) -> JsonValue:
        data = value.encode("latin-1") if isinstance(value, str) else bytes(value)
        if len(data) < length:
            data = data.ljust(length, b"\0")
        return base64.b64encode(data).decode("ascii")

    return binary


def _date(value: Any) -> JsonValue:
    """A zero or invalid date (PyMySQL: a str; the binlog: None) is null."""
    if isinstance(value, datetime.date):
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
    return None


def _datetime(fsp: int, *, zero_is_epoch: bool) -> Converter:
    """A zero or invalid datetime (PyMySQL: a str; the binlog: None) is null. The zero
    TIMESTAMP decodes from the binlog as 1970-01-01 00:00:00, outside TIMESTAMP's range."""

    def convert(value: Any) -> JsonValue:
        if not isinstance(value, datetime.datetime):
            return None
        if zero_is_epoch and value == _EPOCH:
            return None
        text = (
            f"{value.year:04d}-{value.month:02d}-{value.day:02d} "
            f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
        )
        return text + _fraction(value.microsecond, fsp)

    return convert


def _time(fsp: int) -> Callable[[Any], JsonValue]:
    def convert(value: Any) -> JsonValue:
        if isinstance(value, datetime.time):
            value = datetime.timedelta(
                hours=value.hour,
                minutes=value.minute,
                seconds=value.second,
                microseconds=value.microsecond,
            )
        micros = value // datetime.timedelta(microseconds=1)
        sign = "-" if micros < 0 else ""
        seconds, micro = divmod(abs(micros), 1_000_000)
        minutes, second = divmod(seconds, 60)
        hours, minute = divmod(minutes, 60)
        return f"{sign}{hours:02d}:{minute:02d}:{second:02d}" + _fraction(micro, fsp)

    return convert


def _fraction(microsecond: int, fsp: int) -> str:
    return f".{microsecond:06d}"[: fsp + 1] if fsp else ""


def _year(value: Any) -> JsonValue:
    """YEAR is 1901..2155 or 0; the binlog decodes 0 as 1900."""
    year = int(value)
    return 0 if year == 1900 else year


def _json(value: Any) -> JsonValue:
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, str):
        return json.loads(value)
    return _json_value(value)


def _json_value(value: Any) -> JsonValue:
    """MySQL 8's binary JSON as mysql-replication decodes it (bytes for strings and keys)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, dict):
        return {_json_value(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, decimal.Decimal):
        return float(value)
    return value


def _set(members: tuple[str, ...]) -> Callable[[Any], JsonValue]:
    def convert(value: Any) -> JsonValue:
        if isinstance(value, str):
            return value
        if isinstance(value, int):
            return ",".join(m for i, m in enumerate(members) if value >> i & 1)
        chosen: Collection[str] = value
        return ",".join(m for m in members if m in chosen)

    return convert


def _enum(members: tuple[str, ...]) -> Callable[[Any], JsonValue]:
    def convert(value: Any) -> JsonValue:
        if isinstance(value, int):  # an index, 0 for the invalid ''
            return members[value - 1] if value > 0 else ""
        return str(value)

    return convert


def _bit(value: Any) -> JsonValue:
    if isinstance(value, bytes):
        return int.from_bytes(value, "big")
    if isinstance(value, str):
        return int(value, 2)
    return int(value)


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
