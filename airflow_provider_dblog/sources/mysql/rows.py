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

import binascii
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
_GLOBALS = {
    "TWO": tuple(f"{n:02d}" for n in range(64)),
    "SECOND": tuple(f"{n:02d}." for n in range(64)),
    "THREE": tuple(f"{n:03d}" for n in range(1000)),
    "BE8": struct.Struct(">Q").unpack_from,
}
"""What the generated code of temporal values reads besides its columns' own: seconds (0-63:
six bits, as the binlog's) with and without their point, thousandths, and eight big-endian
bytes read as one integer."""


@dataclass(frozen=True, slots=True)
class ColumnRead:
    """How one column's bytes are read: the code that sets `v` from `d` at `p` and moves `p`
    past the value (`{v}` and `{f}` stand for the value's and the converter's names), and
    the converter it calls, if any."""

    code: str
    function: object = None
    """A function, or a table the code indexes (an enum's members, a set's values)."""


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
    namespace: dict[str, object] = {"SourceError": SourceError, "TABLE": str(table), **_GLOBALS}
    nulls = (len(indexes) + 7) // 8
    lines = [
        "def image(d, p):",
        "    c = -1",
        "    try:",
        f"        nulls = {_little_endian(nulls)}" if nulls else "",
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
            f"        if nulls & {1 << bit}:",
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
        return _decimal(metadata >> 8, metadata & 0xFF)
    if kind == ev.TYPE_DATE:
        return ColumnRead(f"{{v}} = {{f}}[{_little_endian(3)}]\np += 3", _Texts(_date))
    if kind == ev.TYPE_DATETIME2:
        return _datetime2(metadata)
    if kind == ev.TYPE_TIMESTAMP2:
        return _timestamp2(metadata)
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
        return _string(metadata, _BASE64)
    if kind == ev.TYPE_JSON:
        return _string(metadata, _called(_mysql_json(floats)))
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


def _little_endian(size: int) -> str:
    """The code reading `size` bytes at `p` as a little-endian integer (up to three bytes by
    index: a fraction of the cost of a slice and `int.from_bytes`)."""
    if size <= 3:
        return " | ".join(f"d[p + {i}] << {8 * i}" if i else "d[p]" for i in range(size))
    return f"int.from_bytes(d[p : p + {size}], 'little')"


def _string(length_bytes: int, spelling: ColumnRead) -> ColumnRead:
    """A value prefixed by its length in `length_bytes` bytes; `spelling` is the code turning
    its bytes, `d[s:p]`, into the JSON value."""
    head = f"n = {_little_endian(length_bytes)}\ns = p + {length_bytes}\np = s + n\n"
    return ColumnRead(head + spelling.code, spelling.function)


_UTF8 = ColumnRead("{v} = d[s:p].decode()")
_BASE64 = ColumnRead("{v} = {f}(d[s:p], newline=False).decode('ascii')", binascii.b2a_base64)


def _called(function: Callable[[bytes], JsonValue]) -> ColumnRead:
    return ColumnRead("{v} = {f}(d[s:p])", function)


def _spelling(column: ColumnInfo | None, floats: FloatSeen, *, text: bool) -> ColumnRead:
    """How a string's bytes become its JSON value: text in its character set, JSON parsed,
    binary as base64. A column the catalog does not have is text or base64 as its binlog
    type (`text`) suggests."""
    if column is None:
        return _called(_lenient_text) if text else _BASE64
    kind = column.data_type
    if kind == "json":
        return _called(_json_text(floats))
    if kind == "binary":
        return _called(_padded(column.length or 0))
    if kind not in _TEXT_TYPES:
        return _BASE64
    codec = encoding(column.charset)
    if codec == "utf-8":
        return _UTF8
    return _called(lambda data: data.decode(codec))


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
        index = _little_endian(second)
        if len(members) == 1:  # no members known: the index, as the server counts it
            return ColumnRead(f"{{v}} = {index}\np += {second}")
        return ColumnRead(f"{{v}} = {{f}}[{index}]\np += {second}", members)
    if real == ev.TYPE_SET:
        members = column.members if column is not None and column.data_type == "set" else ()
        return ColumnRead(
            f"{{v}} = {{f}}[{_little_endian(second)}]\np += {second}",
            _Texts(_set_value(members)),
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
        return binascii.b2a_base64(data.ljust(length, b"\0"), newline=False).decode("ascii")

    return padded


def _set_value(members: tuple[str, ...]) -> Callable[[int], str]:
    """A SET's bitmask as its members in definition order, comma-separated."""

    def spell(mask: int) -> str:
        if mask >> len(members):
            raise ValueError(f"set bits {mask:b} beyond its {len(members)} members")
        return ",".join(m for i, m in enumerate(members) if mask >> i & 1)

    return spell


_FLOAT = struct.Struct("<f").unpack_from


def _float_at(data: bytes, pos: int) -> JsonValue:
    return float32(_FLOAT(data, pos)[0])


def _decimal(precision: int, scale: int) -> ColumnRead:
    """MySQL's binary DECIMAL(precision, scale): groups of nine digits in four big-endian
    bytes, the leftover digits of each side in fewer, the first bit flipped for the sign and
    every bit inverted for a negative value. Read as one integer whose groups make the whole
    part and the fraction, spelled by one `%` format with the scale kept, as
    `converters.converter` spells the Decimal a chunk query gives."""
    if not 0 <= scale <= precision or precision == 0:
        raise SourceError(f"binlog: decimal({precision},{scale}) is not a valid column type")
    whole, rest = divmod(precision - scale, 9)
    integer = ([(_DIGIT_BYTES[rest] * 8, rest)] if rest else []) + [(32, 9)] * whole
    whole, rest = divmod(scale, 9)
    fraction = [(32, 9)] * whole + ([(_DIGIT_BYTES[rest] * 8, rest)] if rest else [])
    size = sum(bits for bits, _ in integer + fraction) // 8
    top = size * 8 - 1
    values: list[str] = []
    shift = 0  # from the last group, the lowest bits
    for groups in (fraction, integer):
        terms, digits = [], 0
        for bits, width in reversed(groups):
            mask = (1 << min(bits, top - shift)) - 1  # the sign bit is no digit's
            term = f"(r >> {shift} & {mask})" if shift else f"(r & {mask})"
            terms.append(f"{term} * {10**digits}" if digits else term)
            shift, digits = shift + bits, digits + width
        if terms:
            values.insert(0, " + ".join(reversed(terms)))
    spelling = ("%d" if integer else "0") + (f".%0{scale}d" if scale else "")
    arguments = ", ".join(values)
    return ColumnRead(
        f"r = {_big_endian(size)}\n"
        f"if r >> {top}:\n"
        f"    {{v}} = '{spelling}' % ({arguments},)\n"
        "else:\n"
        f"    r ^= {(1 << size * 8) - 1}\n"
        f"    {{v}} = '-{spelling}' % ({arguments},)\n"
        f"p += {size}"
    )


def _day(year: int, month: int, day: int) -> str | None:
    """`YYYY-MM-DD`, or None for a zero or invalid date (non-strict sql_mode stores them)."""
    if year < 1 or not 1 <= month <= 12 or not 1 <= day <= _DAYS[month]:
        return None
    if month == 2 and day == 29 and (year % 4 or (year % 100 == 0 and year % 400)):
        return None
    return f"{year:04d}-{month:02d}-{day:02d}"


def _date(packed: int) -> str | None:
    """DATE: year, month and day in 15, 4 and 5 bits; a zero or invalid date is null."""
    return _day(packed >> 9, packed >> 5 & 15, packed & 31)


def _big_endian(size: int) -> str:
    """The code reading `size` bytes at `p` as a big-endian integer."""
    return "BE8(d, p)[0]" if size == 8 else f"int.from_bytes(d[p : p + {size}], 'big')"


def _clock(fsp: int, text: str, second: str, fraction: str) -> str:
    """Code appending a temporal value's seconds and `fsp` fraction digits to `text` (the
    value up to its minute): `second` and `fraction` are the integers' expressions, the
    fraction as its bytes hold it. Spelled from tables of digits, the cheapest way Python has
    (a `%` format costs about twice as much); an odd `fsp` stores one digit more than it shows,
    always 0."""
    if not fsp:
        return f"{text} += TWO[{second}]"
    if fsp == 6:
        return (
            f"u = {fraction}\n"
            f"{text} = ''.join(({text}, SECOND[{second}], THREE[u // 1000], THREE[u % 1000]))"
        )
    shown = f"{fraction} // 10" if fsp % 2 else fraction
    return f"{text} += SECOND[{second}] + '%0{fsp}d' % ({shown},)"


def _datetime2(fsp: int) -> ColumnRead:
    """DATETIME(fsp): 40 bits big-endian (sign, year*13+month, day, hour, minute, second),
    then the fraction, read as one integer. Its text up to the minute comes from a table
    (`_Texts`) by those bits, the rest from tables of digits (`_clock`). A zero or invalid
    date is null, as on the chunk path."""
    size = 5 + (fsp + 1) // 2
    bits = (size - 5) * 8
    clock = _clock(fsp, "{v}", f"r >> {bits} & 63", f"(r & {(1 << bits) - 1})")
    return ColumnRead(
        f"r = {_big_endian(size)}\n"
        f"{{v}} = {{f}}[r >> {bits + 6}]\n"
        "if {v} is not None:\n"
        + "".join(f"    {line}\n" for line in clock.split("\n"))
        + f"p += {size}",
        _Texts(_datetime_minute),
    )


def _timestamp2(fsp: int) -> ColumnRead:
    """TIMESTAMP(fsp): UTC seconds, 32 bits big-endian, then the fraction, read as one
    integer; its text up to the minute from a table (`_Texts`), the rest from tables of
    digits (`_clock`). The zero timestamp is null."""
    size = 4 + (fsp + 1) // 2
    bits = (size - 4) * 8
    clock = _clock(fsp, "{v}", "e % 60", f"(r & {(1 << bits) - 1})")
    return ColumnRead(
        f"r = {_big_endian(size)}\n"
        "if r:\n"
        f"    e = r >> {bits}\n"
        "    {v} = {f}[e // 60]\n"
        + "".join(f"    {line}\n" for line in clock.split("\n"))
        + "else:\n"
        "    {v} = None\n"
        f"p += {size}",
        _Texts(_timestamp_minute),
    )


class _Texts(dict[int, str | None]):
    """A column's texts by the integer its bytes pack (a date, a minute, a set's bitmask),
    each spelled once by `spell`: rows written close together share them, and the generated
    code reads one by indexing, with no call. Bounded: past `_CACHE_LIMIT` texts it starts
    again empty."""

    __slots__ = ("_spell",)

    def __init__(self, spell: Callable[[int], str | None]) -> None:
        super().__init__()
        self._spell = spell

    def __missing__(self, packed: int) -> str | None:
        text = self._spell(packed)
        if len(self) >= _CACHE_LIMIT:
            self.clear()
        self[packed] = text
        return text


def _datetime_minute(bits: int) -> str | None:
    """A DATETIME's bits down to its minute (sign, year*13+month, day, hour, minute) spelled;
    None for a zero or invalid date or a negative value."""
    minute = bits - (0x8000000000 >> 6)
    year_month, day = minute >> 16, minute >> 11 & 31
    text = _day(year_month // 13, year_month % 13, day)
    if text is None or minute < 0:
        return None
    return f"{text} {minute >> 6 & 31:02d}:{minute & 63:02d}:"


def _timestamp_minute(minute: int) -> str:
    """A TIMESTAMP's minutes since the epoch spelled, in UTC."""
    return (_EPOCH + datetime.timedelta(minutes=minute)).strftime("%Y-%m-%d %H:%M:")


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
