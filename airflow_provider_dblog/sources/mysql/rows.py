"""The lean row decoder: a binlog row image straight from the event's bytes to the row's JSON
values, by a function compiled once per table map.

A rows event holds row images back to back; each is a null bitmap, then the bytes of every
present non-null column in table order. `compile_image` writes, for one table map (types,
metadata) and one bitmap of present columns, a function of straight-line code that reads each
column where it lies and converts it as it reads: no per-value type dispatch, no copy of the
rest of the event, and the row dict and the key dict built in one display each. Each value is
the JSON value `converters.converter(column)` gives for the same stored value read by a chunk
query (the integration and property tests compare the two paths byte for byte).

The binlog decides how the bytes are laid out (type and metadata); the catalog's `ColumnInfo`
decides what they mean where the binlog does not say (signedness, the character set, binary
or text, enum and set members, JSON in a MariaDB longtext). A column the catalog does not have
(a reader behind a DROP or RENAME COLUMN) is read by the binlog's type alone. A type this
decoder does not know is a `SourceError` naming the table, the column and the type, raised
when the map is compiled, before any row of it is read.

The generated code names columns, converters and constants only by index (`n0`, `f0`, ...),
bound as globals of the function: no text from the database is ever part of the code.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from airflow_provider_dblog.core.event import JsonValue, Row, TableRef
from airflow_provider_dblog.sources.base import SourceError
from airflow_provider_dblog.sources.mysql import events as ev
from airflow_provider_dblog.sources.mysql.catalog import ColumnInfo
from airflow_provider_dblog.sources.mysql.converters import encoding, float32

ImageReader = Callable[[bytes, int], tuple[Row, Row | None, int]]
"""(event bytes, offset of an image) -> (the row, its key or None if a key column is not in
the image, the offset after the image)."""

_INTEGER_TYPES = frozenset(("tinyint", "smallint", "mediumint", "int", "bigint"))
_TEXT_TYPES = frozenset(("char", "varchar", "tinytext", "text", "mediumtext", "longtext"))
_EPOCH = datetime.datetime(1970, 1, 1)
_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_DIGIT_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
"""Bytes a group of 0..9 decimal digits takes in the binary DECIMAL format."""
_CACHE_LIMIT = 1 << 14


@dataclass(frozen=True, slots=True)
class ColumnRead:
    """How one column's bytes are read: the code that sets `v` from `d` at `p` and moves `p`
    past the value (`{v}` and `{f}` stand for the value's and the converter's names), and
    the converter it calls, if any."""

    code: str
    function: object = None
    """A function, or a tuple the code indexes (an enum's members)."""


class FloatSeen:
    """Set by the JSON columns' parsers of one table when a document they read held a float:
    the rows read since it was cleared must be spelled by the standard encoder (msgspec spells
    floats otherwise than `json.dumps`, `core.event_codec.plain_row_encoder`)."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = False


def compile_image(
    table: TableRef,
    table_map: ev.TableMap,
    names: Sequence[str],
    columns: Sequence[ColumnInfo | None],
    key: Sequence[str],
    present: bytes,
    floats: FloatSeen,
) -> ImageReader:
    """The reader of `table`'s row images logged under `table_map` with the columns of bitmap
    `present`. `names` and `columns` are the map's columns in table order (`None` where the
    catalog does not have the column); its JSON columns set `floats`."""
    indexes = [i for i in range(len(names)) if present[i >> 3] >> (i & 7) & 1]
    namespace: dict[str, object] = {"SourceError": SourceError, "TABLE": str(table)}
    nulls = (len(indexes) + 7) // 8
    lines = [
        "def image(d, p):",
        "    c = -1",
        "    try:",
        f"        nulls = int.from_bytes(d[p : p + {nulls}], 'little')" if nulls else "",
        f"        p += {nulls}",
    ]
    for bit, i in enumerate(indexes):
        read = column_read(
            table, names[i], table_map.types[i], table_map.metadata[i], columns[i], floats
        )
        namespace[f"n{i}"] = names[i]
        namespace[f"t{i}"] = _type_name(table_map.types[i], columns[i])
        if read.function is not None:
            namespace[f"f{i}"] = read.function
        code = read.code.format(v=f"v{i}", f=f"f{i}")
        lines += [
            f"        c = {i}",
            f"        if nulls >> {bit} & 1:",
            f"            v{i} = None",
            "        else:",
            *("            " + line for line in code.split("\n")),
        ]
    present_names = {names[i]: i for i in indexes}
    row = ", ".join(f"n{i}: v{i}" for i in indexes)
    if all(k in present_names for k in key):
        key_dict = "{" + ", ".join(f"n{present_names[k]}: v{present_names[k]}" for k in key) + "}"
    else:
        key_dict = "None"
    lines += [
        "    except Exception as exc:",
        "        if c < 0:",
        "            raise SourceError(f'binlog: a malformed row image of {TABLE}: {exc!r}')",
        "        raise SourceError(",
        "            f'binlog: cannot decode column {globals()[\"n%d\" % c]!r} of {TABLE}'",
        "            f' (binlog type {globals()[\"t%d\" % c]}): {exc!r}'",
        "        ) from exc",
        f"    return {{{row}}}, {key_dict}, p",
    ]
    source = "\n".join(line for line in lines if line) + "\n"
    exec(compile(source, "<binlog row image>", "exec"), namespace)
    function: ImageReader = namespace["image"]  # type: ignore[assignment]
    return function


def plain_values(table_map: ev.TableMap) -> bool:
    """Whether every value read under `table_map` is a str, an int, None, or a JSON document
    of those (whose floats `FloatSeen` reports): no FLOAT or DOUBLE column. Such rows are what
    msgspec spells as `json.dumps` does (`core.event_codec.plain_row_encoder`)."""
    return not any(kind in _FLOATING for kind in table_map.types)


_FLOATING = frozenset((ev.TYPE_FLOAT, ev.TYPE_DOUBLE))


def column_read(
    table: TableRef,
    name: str,
    kind: int,
    metadata: int,
    column: ColumnInfo | None,
    floats: FloatSeen,
) -> ColumnRead:
    """How a column of binlog type `kind` with `metadata` is read, as `column` (the catalog's
    description, None if it has none) says its value is spelled; a JSON document holding a
    float sets `floats`."""
    data_type = column.data_type if column is not None else ""
    if kind in _FIXED_INTEGERS:
        size, signed, unsigned = _FIXED_INTEGERS[kind]
        is_unsigned = data_type in _INTEGER_TYPES and column is not None and column.unsigned
        fmt = unsigned if is_unsigned else signed
        if fmt == "B":
            return ColumnRead("{v} = d[p]\np += 1")
        return ColumnRead(
            f"{{v}} = {{f}}(d, p)[0]\np += {size}", struct.Struct("<" + fmt).unpack_from
        )
    if kind == ev.TYPE_INT24:
        is_unsigned = data_type in _INTEGER_TYPES and column is not None and column.unsigned
        return ColumnRead(
            f"{{v}} = int.from_bytes(d[p : p + 3], 'little', signed={not is_unsigned})\np += 3"
        )
    if kind == ev.TYPE_FLOAT:
        return ColumnRead("{v} = {f}(d, p)\np += 4", _float_at)
    if kind == ev.TYPE_DOUBLE:
        return ColumnRead("{v} = {f}(d, p)[0]\np += 8", struct.Struct("<d").unpack_from)
    if kind == ev.TYPE_NEWDECIMAL:
        reader, size = _decimal_reader(metadata >> 8, metadata & 0xFF)
        return ColumnRead(f"{{v}} = {{f}}(d, p)\np += {size}", reader)
    if kind == ev.TYPE_DATE:
        return ColumnRead("{v} = {f}(d, p)\np += 3", _date_at)
    if kind == ev.TYPE_DATETIME2:
        return ColumnRead(
            f"{{v}} = {{f}}(d, p)\np += {5 + (metadata + 1) // 2}", _datetime2(metadata)
        )
    if kind == ev.TYPE_TIMESTAMP2:
        return ColumnRead(
            f"{{v}} = {{f}}(d, p)\np += {4 + (metadata + 1) // 2}", _timestamp2(metadata)
        )
    if kind == ev.TYPE_TIME2:
        return ColumnRead(f"{{v}} = {{f}}(d, p)\np += {3 + (metadata + 1) // 2}", _time2(metadata))
    if kind == ev.TYPE_DATETIME:
        return ColumnRead("{v} = {f}(d, p)\np += 8", _old_datetime)
    if kind == ev.TYPE_TIMESTAMP:
        return ColumnRead("{v} = {f}(d, p)\np += 4", _old_timestamp)
    if kind == ev.TYPE_TIME:
        return ColumnRead("{v} = {f}(d, p)\np += 3", _old_time)
    if kind == ev.TYPE_YEAR:
        return ColumnRead("{v} = d[p]\nif {v}:\n    {v} += 1900\np += 1")
    if kind == ev.TYPE_BIT:
        size = (metadata >> 8) + (1 if metadata & 0xFF else 0)
        return ColumnRead(f"{{v}} = int.from_bytes(d[p : p + {size}], 'big')\np += {size}")
    if kind in (ev.TYPE_VARCHAR, ev.TYPE_VAR_STRING):
        return _string(1 if metadata < 256 else 2, _spelling(column, floats, text=True))
    if kind in (ev.TYPE_BLOB, ev.TYPE_TINY_BLOB, ev.TYPE_MEDIUM_BLOB, ev.TYPE_LONG_BLOB):
        return _string(metadata, _spelling(column, floats, text=False))
    if kind == ev.TYPE_GEOMETRY:
        return _string(metadata, _base64)
    if kind == ev.TYPE_JSON:
        return _string(metadata, _mysql_json(floats))
    if kind == ev.TYPE_STRING:
        return _string_type(table, name, metadata, column, floats)
    raise SourceError(
        f"binlog: column {name!r} of {table} has binlog type {kind}, which the row decoder "
        "does not read; capture tables of the types sources/mysql/converters.py lists"
    )


_FIXED_INTEGERS = {
    ev.TYPE_TINY: (1, "b", "B"),
    ev.TYPE_SHORT: (2, "h", "H"),
    ev.TYPE_LONG: (4, "i", "I"),
    ev.TYPE_LONGLONG: (8, "q", "Q"),
}
_LENGTH_READS = {
    1: "n = d[p]",
    2: "n = d[p] | d[p + 1] << 8",
    3: "n = int.from_bytes(d[p : p + 3], 'little')",
    4: "n = int.from_bytes(d[p : p + 4], 'little')",
}


def _string(length_bytes: int, spell: Callable[[bytes], JsonValue] | None) -> ColumnRead:
    """A value prefixed by its length in `length_bytes` bytes; `spell` turns its bytes into the
    JSON value (None: decoded as UTF-8)."""
    head = f"{_LENGTH_READS[length_bytes]}\ns = p + {length_bytes}\np = s + n\n"
    if spell is None:
        return ColumnRead(head + "{v} = d[s:p].decode()")
    return ColumnRead(head + "{v} = {f}(d[s:p])", spell)


def _spelling(
    column: ColumnInfo | None, floats: FloatSeen, *, text: bool
) -> Callable[[bytes], JsonValue] | None:
    """How a string's bytes become its JSON value: text in its character set (None: UTF-8,
    decoded inline), JSON parsed, binary as base64. A column the catalog does not have is
    text or base64 as its binlog type (`text`) suggests."""
    if column is None:
        return _lenient_text if text else _base64
    kind = column.data_type
    if kind == "json":
        return _json_text(floats)
    if kind == "binary":
        return _padded(column.length or 0)
    if kind not in _TEXT_TYPES:
        return _base64
    codec = encoding(column.charset)
    if codec == "utf-8":
        return None
    return lambda data: data.decode(codec)


def _string_type(
    table: TableRef, name: str, metadata: int, column: ColumnInfo | None, floats: FloatSeen
) -> ColumnRead:
    """The STRING type's two metadata bytes: the real type (char, binary, enum, set) and the
    length, whose two high bits hide in the first byte for lengths over 255."""
    first, second = metadata >> 8, metadata & 0xFF
    if first & 0x30 != 0x30:
        length = ((first >> 4 & 0x03) ^ 0x03) << 8 | second
        real = first | 0x30
    else:
        length, real = second, first
    if real == ev.TYPE_ENUM:
        members = ("",) + (
            column.members if column is not None and column.data_type == "enum" else ()
        )
        index = "d[p]" if second == 1 else "d[p] | d[p + 1] << 8"
        if len(members) == 1:  # no members known: the index, as the server counts it
            return ColumnRead(f"{{v}} = {index}\np += {second}")
        return ColumnRead(f"{{v}} = {{f}}[{index}]\np += {second}", members)
    if real == ev.TYPE_SET:
        members = column.members if column is not None and column.data_type == "set" else ()
        return ColumnRead(
            f"{{v}} = {{f}}(int.from_bytes(d[p : p + {second}], 'little'))\np += {second}",
            _set_spelling(members),
        )
    if real == ev.TYPE_STRING:
        return _string(1 if length < 256 else 2, _spelling(column, floats, text=True))
    raise SourceError(
        f"binlog: column {name!r} of {table} has binlog string type {real}, which the row "
        "decoder does not read"
    )


def _type_name(kind: int, column: ColumnInfo | None) -> str:
    return f"{kind}" if column is None else f"{kind}, {column.column_type}"


# -- converters the generated code calls ------------------------------------------------------


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _json_text(floats: FloatSeen) -> Callable[[bytes], JsonValue]:
    """MariaDB's JSON, a utf8mb4 longtext: parsed as `json.loads` parses the chunk's text, by
    msgspec's parser, which gives the same values several times faster. What msgspec refuses
    and `json.loads` takes (NaN, a lone surrogate escape) is parsed by `json.loads`. Both call
    their float hook for float literals only, so the flag costs nothing else."""

    def seen(text: str) -> float:
        floats.seen = True
        return float(text)

    fast = msgspec.json.Decoder(float_hook=seen).decode
    decode = json.JSONDecoder(parse_float=seen).decode

    def parse(data: bytes) -> JsonValue:
        try:
            parsed: JsonValue = fast(data)
        except msgspec.DecodeError:
            parsed = decode(data.decode("utf-8"))
        return parsed

    return parse


def _lenient_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _padded(length: int) -> Callable[[bytes], JsonValue]:
    """binary(n) is padded to its length with zero bytes; the binlog strips them."""

    def padded(data: bytes) -> JsonValue:
        return base64.b64encode(data.ljust(length, b"\0")).decode("ascii")

    return padded


def _set_spelling(members: tuple[str, ...]) -> Callable[[int], JsonValue]:
    """A SET's bitmask as its members in definition order, comma-separated."""
    cache: dict[int, str] = {}

    def spell(mask: int) -> JsonValue:
        found = cache.get(mask)
        if found is None:
            if mask >> len(members):
                raise ValueError(f"set bits {mask:b} beyond its {len(members)} members")
            found = ",".join(m for i, m in enumerate(members) if mask >> i & 1)
            if len(cache) < _CACHE_LIMIT:
                cache[mask] = found
        return found

    return spell


_FLOAT = struct.Struct("<f").unpack_from


def _float_at(data: bytes, pos: int) -> JsonValue:
    return float32(_FLOAT(data, pos)[0])


def _decimal_reader(precision: int, scale: int) -> tuple[Callable[[bytes, int], str], int]:
    """MySQL's binary DECIMAL(precision, scale) and its size: groups of nine digits in four
    big-endian bytes, the leftover digits of each side in fewer, the first bit flipped for the
    sign and every bit inverted for a negative value. Spelled with the scale kept, as
    `converters.converter` spells the Decimal a chunk query gives. Compiled per type: the
    groups' shifts and powers of ten are constants of straight-line code."""
    if not 0 <= scale <= precision or precision == 0:
        raise SourceError(f"binlog: decimal({precision},{scale}) is not a valid column type")
    whole, rest = divmod(scale, 9)
    fraction = [(32, 9)] * whole + ([(_DIGIT_BYTES[rest] * 8, rest)] if rest else [])
    whole, rest = divmod(precision - scale, 9)
    integer = ([(_DIGIT_BYTES[rest] * 8, rest)] if rest else []) + [(32, 9)] * whole
    groups = list(reversed(integer + fraction))  # the last group first: the lowest bits
    size = sum(bits for bits, _ in groups) // 8
    terms, shift, digits = [], 0, 0
    for bits, width in groups:
        terms.append(f"(raw >> {shift} & {(1 << bits) - 1}) * {10**digits}")
        shift, digits = shift + bits, digits + width
    top = 1 << (size * 8 - 1)
    lines = [
        "def decimal(d, p):",
        f"    raw = int.from_bytes(d[p : p + {size}], 'big')",
        f"    if raw & {top}:",
        f"        raw ^= {top}",
        "        sign = ''",
        "    else:",
        f"        raw ^= {(1 << size * 8) - 1 - top}",
        "        sign = '-'",
        f"    text = str({' + '.join(terms)})",
    ]
    if scale:
        lines += [
            f"    text = text.rjust({scale + 1}, '0')",
            f"    return sign + text[:-{scale}] + '.' + text[-{scale}:]",
        ]
    else:
        lines.append("    return sign + text")
    namespace: dict[str, object] = {}
    exec(compile("\n".join(lines) + "\n", "<binlog decimal>", "exec"), namespace)
    function: Callable[[bytes, int], str] = namespace["decimal"]  # type: ignore[assignment]
    return function, size


def _day(year: int, month: int, day: int) -> str | None:
    """`YYYY-MM-DD`, or None for a zero or invalid date (non-strict sql_mode stores them)."""
    if year < 1 or not 1 <= month <= 12 or not 1 <= day <= _DAYS[month]:
        return None
    if month == 2 and day == 29 and (year % 4 or (year % 100 == 0 and year % 400)):
        return None
    return f"{year:04d}-{month:02d}-{day:02d}"


_dates: dict[int, str | None] = {}


def _date_at(data: bytes, pos: int) -> JsonValue:
    packed = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
    try:
        return _dates[packed]
    except KeyError:
        text = _day(packed >> 9, packed >> 5 & 15, packed & 31)
        if len(_dates) < _CACHE_LIMIT:
            _dates[packed] = text
        return text


def _fraction(fsp: int) -> tuple[int, int, int]:
    """A temporal value's fraction bytes for `fsp` digits, and the factor turning them into
    microseconds: (bytes, bits, factor)."""
    size = (fsp + 1) // 2
    return size, size * 8, (1, 10_000, 100, 1)[size]


def _datetime2(fsp: int) -> Callable[[bytes, int], JsonValue]:
    """DATETIME(fsp): 40 bits big-endian (sign, year*13+month, day, hour, minute, second),
    then the fraction, read as one integer. A zero or invalid date is null, as on the chunk
    path."""
    size, bits, factor = _fraction(fsp)
    end, mask, cut = 5 + size, (1 << bits) - 1, fsp + 1
    seconds: dict[int, str | None] = {}

    def read(data: bytes, pos: int) -> JsonValue:
        whole = int.from_bytes(data[pos : pos + end], "big")
        packed = (whole >> bits) - 0x8000000000
        text = seconds.get(packed, "")
        if text == "":
            day_part, time_part = packed >> 17, packed & 0x1FFFF
            year_month = day_part >> 5
            day = _day(year_month // 13, year_month % 13, day_part & 31)
            text = None
            if day is not None and packed >= 0:
                hour, minute, second = time_part >> 12, time_part >> 6 & 63, time_part & 63
                text = f"{day} {hour:02d}:{minute:02d}:{second:02d}"
            if len(seconds) >= _CACHE_LIMIT:
                seconds.clear()
            seconds[packed] = text
        if text is None or not bits:
            return text
        return text + f".{(whole & mask) * factor:06d}"[:cut]

    return read


def _timestamp2(fsp: int) -> Callable[[bytes, int], JsonValue]:
    """TIMESTAMP(fsp): UTC seconds, 32 bits big-endian, then the fraction, read as one
    integer; the zero timestamp is null."""
    size, bits, factor = _fraction(fsp)
    end, mask, cut = 4 + size, (1 << bits) - 1, fsp + 1
    seconds: dict[int, str] = {}

    def read(data: bytes, pos: int) -> JsonValue:
        whole = int.from_bytes(data[pos : pos + end], "big")
        if whole == 0:
            return None
        epoch = whole >> bits
        text = seconds.get(epoch)
        if text is None:
            text = (_EPOCH + datetime.timedelta(seconds=epoch)).strftime("%Y-%m-%d %H:%M:%S")
            if len(seconds) >= _CACHE_LIMIT:
                seconds.clear()
            seconds[epoch] = text
        if not bits:
            return text
        return text + f".{(whole & mask) * factor:06d}"[:cut]

    return read


def _time2(fsp: int) -> Callable[[bytes, int], JsonValue]:
    """TIME(fsp): 24 bits big-endian offset by 0x800000 (sign, hour, minute, second) and the
    fraction, which for a negative value counts down from the next whole second."""
    fraction_bytes, cut = (fsp + 1) // 2, fsp + 1

    def read(data: bytes, pos: int) -> JsonValue:
        if fraction_bytes == 3:
            packed = int.from_bytes(data[pos : pos + 6], "big") - 0x800000000000
        else:
            whole = int.from_bytes(data[pos : pos + 3], "big") - 0x800000
            frac = 0
            if fraction_bytes == 1:
                frac = data[pos + 3]
                if whole < 0 and frac:
                    whole += 1
                    frac -= 0x100
                frac *= 10_000
            elif fraction_bytes == 2:
                frac = data[pos + 3] << 8 | data[pos + 4]
                if whole < 0 and frac:
                    whole += 1
                    frac -= 0x10000
                frac *= 100
            packed = (whole << 24) + frac
        sign = "-" if packed < 0 else ""
        packed = abs(packed)
        hms, micro = packed >> 24, packed & 0xFFFFFF
        hour, minute, second = hms >> 12 & 0x3FF, hms >> 6 & 63, hms & 63
        text = f"{sign}{hour:02d}:{minute:02d}:{second:02d}"
        return text + f".{micro:06d}"[:cut] if fsp > 0 else text

    return read


def _old_datetime(data: bytes, pos: int) -> JsonValue:
    """The DATETIME of servers before MySQL 5.6 / MariaDB 10.1: YYYYMMDDhhmmss as an integer."""
    packed = int.from_bytes(data[pos : pos + 8], "little")
    date, time = divmod(packed, 1_000_000)
    day = _day(date // 10_000, date // 100 % 100, date % 100)
    if day is None:
        return None
    return f"{day} {time // 10_000:02d}:{time // 100 % 100:02d}:{time % 100:02d}"


def _old_timestamp(data: bytes, pos: int) -> JsonValue:
    epoch = int.from_bytes(data[pos : pos + 4], "little")
    if epoch == 0:
        return None
    return (_EPOCH + datetime.timedelta(seconds=epoch)).strftime("%Y-%m-%d %H:%M:%S")


def _old_time(data: bytes, pos: int) -> JsonValue:
    packed = int.from_bytes(data[pos : pos + 3], "little", signed=True)
    sign = "-" if packed < 0 else ""
    packed = abs(packed)
    return f"{sign}{packed // 10_000:02d}:{packed // 100 % 100:02d}:{packed % 100:02d}"


def _mysql_json(floats: FloatSeen) -> Callable[[bytes], JsonValue]:
    """MySQL 8's binary JSON: parsed by mysql-replication's parser, then as a chunk query's
    JSON text would parse (decimals as numbers, strings as text)."""
    from pymysqlreplication.json_binary import parse_json

    def plain(value: Any) -> JsonValue:
        if isinstance(value, bytes):
            return value.decode("utf-8")
        if isinstance(value, dict):
            return {str(plain(k)): plain(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        if isinstance(value, float | decimal.Decimal):
            floats.seen = True
            return float(value)
        found: JsonValue = value
        return found

    def parse(data: bytes) -> JsonValue:
        return plain(parse_json(data[0], data[1:])) if data else None

    return parse
