"""The lean row decoder: a type it does not read, and bytes it cannot read, are errors naming
the table, the column and the type, never a silent wrong value; and values built into their
binlog bytes here read as the converters of a chunk read spell the same stored value."""

from __future__ import annotations

import datetime
import json
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.base import SourceError
from airflow_provider_dblog.sources.mysql import events as ev
from airflow_provider_dblog.sources.mysql.catalog import ColumnInfo
from airflow_provider_dblog.sources.mysql.converters import converter
from airflow_provider_dblog.sources.mysql.rows import FloatSeen, column_read, compile_image

TABLE = TableRef("shop", "orders")


def test_a_type_the_decoder_does_not_read_is_refused_by_name() -> None:
    with pytest.raises(SourceError, match=r"column 'odd' of shop\.orders has binlog type 6"):
        column_read(TABLE, "odd", ev.TYPE_NULL, 0, None, FloatSeen())


def test_bytes_it_cannot_read_name_the_column_and_its_type() -> None:
    table_map = ev.TableMap(
        1, "shop", "orders", bytes([ev.TYPE_LONG, ev.TYPE_LONGLONG]), (0, 0), None
    )
    columns = (ColumnInfo("id", "int", "int(11)"), ColumnInfo("total", "bigint", "bigint(20)"))
    read = compile_image(TABLE, table_map, ("id", "total"), columns, ("id",), b"\x03", FloatSeen())
    row = b"\x00" + (7).to_bytes(4, "little") + (9).to_bytes(8, "little")
    assert read(row, 0) == ({"id": 7, "total": 9}, {"id": 7}, len(row))
    with pytest.raises(
        SourceError, match=r"'total' of shop\.orders \(binlog type 8, bigint\(20\)\)"
    ):
        read(row[:-3], 0)


def test_a_json_document_with_a_float_is_reported() -> None:
    """Rows whose documents hold floats are spelled by the standard encoder (`FloatSeen`)."""
    floats = FloatSeen()
    table_map = ev.TableMap(1, "shop", "orders", bytes([ev.TYPE_BLOB]), (4,), ("doc",))
    columns = (ColumnInfo("doc", "json", "longtext", "utf8mb4", "utf8mb4_bin"),)
    read = compile_image(TABLE, table_map, ("doc",), columns, (), b"\x01", floats)
    for text, seen in ((b'{"a": [1, "x", true]}', False), (b'{"a": 1.5}', True)):
        floats.seen = False
        read(b"\x00" + len(text).to_bytes(4, "little") + text, 0)
        assert floats.seen is seen


@pytest.mark.parametrize(
    "text",
    [
        '{"a": [1, "x", true, null], "a": {"b": -0}}',
        "123456789012345678901234567890",
        "[1e400, -0.0, 0.1, 1E2, 18446744073709551616, -9223372036854775809]",
        '"\\u00e9 \\ud83d\\ude00 \\u0000 \U0001f600"',
        '"\\ud800"',  # a lone surrogate: msgspec refuses it, json.loads takes it
        "[NaN, Infinity]",  # the same
        ' [ 1 , {"b" : null} ]\n',
    ],
)
def test_a_json_document_reads_as_json_loads_reads_it(text: str) -> None:
    """The log's parser gives the values (and the float flag) `json.loads` gives the chunk's
    text, also where it hands the document over to `json.loads`."""
    floats = FloatSeen()
    table_map = ev.TableMap(1, "shop", "orders", bytes([ev.TYPE_BLOB]), (4,), ("doc",))
    columns = (ColumnInfo("doc", "json", "longtext", "utf8mb4", "utf8mb4_bin"),)
    read = compile_image(TABLE, table_map, ("doc",), columns, (), b"\x01", floats)
    data = text.encode("utf-8", "surrogatepass")
    row, _, _ = read(b"\x00" + len(data).to_bytes(4, "little") + data, 0)
    expected_floats: list[str] = []
    expected = json.loads(text, parse_float=lambda f: expected_floats.append(f) or float(f))
    assert json.dumps(row["doc"]) == json.dumps(expected)
    assert floats.seen is bool(expected_floats)


def test_a_json_document_that_is_not_utf8_names_the_column() -> None:
    table_map = ev.TableMap(1, "shop", "orders", bytes([ev.TYPE_BLOB]), (4,), ("doc",))
    columns = (ColumnInfo("doc", "json", "longtext", "utf8mb4", "utf8mb4_bin"),)
    read = compile_image(TABLE, table_map, ("doc",), columns, (), b"\x01", FloatSeen())
    with pytest.raises(SourceError, match=r"cannot decode column 'doc' of shop\.orders"):
        read(b'\x00\x03\x00\x00\x00"\xff"', 0)


# -- values from their binlog bytes, against the converters of a chunk read --------------------


def _read_one(kind: int, metadata: int, column: ColumnInfo, data: bytes) -> object:
    """`data`, one non-null value of `column` as its binlog type logs it, read by the decoder."""
    table_map = ev.TableMap(1, "shop", "orders", bytes([kind]), (metadata,), ("c",))
    read = compile_image(TABLE, table_map, ("c",), (column,), (), b"\x01", FloatSeen())
    row, _, end = read(b"\x00" + data + b"\xee", 0)  # a byte after it, which it must not read
    assert end == 1 + len(data)
    return row["c"]


def _binary_decimal(digits: int, precision: int, scale: int) -> bytes:
    """MySQL's binary DECIMAL of `digits` * 10**-scale: nine digits a four-byte group, the
    leftover digits of each side in fewer bytes, the sign in the first bit, a negative value
    with every bit inverted."""
    sizes = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
    text = str(abs(digits)).rjust(precision, "0")
    whole, fraction = text[: precision - scale], text[precision - scale :]
    lead = len(whole) % 9
    groups = ([whole[:lead]] if lead else []) + [
        whole[i : i + 9] for i in range(lead, len(whole), 9)
    ]
    groups += [fraction[i : i + 9] for i in range(0, len(fraction), 9)]
    raw = bytearray(b"".join(int(g).to_bytes(sizes[len(g)], "big") for g in groups))
    raw[0] ^= 0x80
    return bytes(b ^ 0xFF for b in raw) if digits < 0 else bytes(raw)


@st.composite
def _decimals(draw: st.DrawFn) -> tuple[int, int, int]:
    precision = draw(st.integers(1, 65))
    scale = draw(st.integers(0, min(precision, 30)))
    limit = 10**precision - 1
    digits = draw(st.sampled_from([0, limit, -limit, 1, -1]) | st.integers(-limit, limit))
    return precision, scale, digits


@settings(max_examples=500)
@given(_decimals())
def test_a_decimal_reads_as_a_chunk_reads_it(case: tuple[int, int, int]) -> None:
    precision, scale, digits = case
    column = ColumnInfo("c", "decimal", f"decimal({precision},{scale})")
    data = _binary_decimal(digits, precision, scale)
    expected = converter(column)(Decimal(f"{digits}e-{scale}"))
    assert _read_one(ev.TYPE_NEWDECIMAL, precision << 8 | scale, column, data) == expected


def _fraction(fsp: int, microsecond: int) -> bytes:
    """The fraction of a temporal value of `fsp` digits: hundredths, ten-thousandths or
    microseconds in one, two or three big-endian bytes."""
    size = (fsp + 1) // 2
    shown = microsecond // 10 ** (6 - fsp) * 10 ** (6 - fsp)
    return (shown // (1, 10_000, 100, 1)[size]).to_bytes(size, "big") if size else b""


_MOMENTS = st.datetimes(datetime.datetime(1000, 1, 1), datetime.datetime(9999, 12, 31))


@settings(max_examples=300)
@given(st.integers(0, 6), _MOMENTS)
def test_a_datetime_reads_as_a_chunk_reads_it(fsp: int, moment: datetime.datetime) -> None:
    column = ColumnInfo("c", "datetime", f"datetime({fsp})", fsp=fsp)
    packed = (moment.year * 13 + moment.month) << 22 | moment.day << 17 | moment.hour << 12
    packed |= moment.minute << 6 | moment.second
    data = (packed | 1 << 39).to_bytes(5, "big") + _fraction(fsp, moment.microsecond)
    stored = moment.replace(microsecond=moment.microsecond // 10 ** (6 - fsp) * 10 ** (6 - fsp))
    assert _read_one(ev.TYPE_DATETIME2, fsp, column, data) == converter(column)(stored)


@given(st.dates(datetime.date(1000, 1, 1)))
def test_a_date_reads_as_a_chunk_reads_it(day: datetime.date) -> None:
    column = ColumnInfo("c", "date", "date")
    data = (day.year << 9 | day.month << 5 | day.day).to_bytes(3, "little")
    assert _read_one(ev.TYPE_DATE, 0, column, data) == converter(column)(day)


_INVALID_DAYS = [(0, 0, 0), (2023, 2, 29), (1900, 2, 29), (2024, 0, 1), (2024, 4, 31), (2024, 1, 0)]


@pytest.mark.parametrize("year, month, day", _INVALID_DAYS)
def test_a_zero_or_invalid_date_reads_as_null(year: int, month: int, day: int) -> None:
    """Non-strict sql_mode stores them; a chunk read gives their text, which is null."""
    data = (year << 9 | month << 5 | day).to_bytes(3, "little")
    assert _read_one(ev.TYPE_DATE, 0, ColumnInfo("c", "date", "date"), data) is None


@pytest.mark.parametrize("year, month, day", _INVALID_DAYS)
def test_a_zero_or_invalid_datetime_reads_as_null(year: int, month: int, day: int) -> None:
    """Non-strict sql_mode stores them; a chunk read gives their text, which is null."""
    column = ColumnInfo("c", "datetime", "datetime(6)", fsp=6)
    packed = (year * 13 + month) << 22 | day << 17 | 12 << 12
    data = (packed | 1 << 39).to_bytes(5, "big") + (5).to_bytes(3, "big")
    assert _read_one(ev.TYPE_DATETIME2, 6, column, data) is None


@settings(max_examples=300)
@given(st.integers(0, 6), st.integers(0, 2**32 - 1), st.integers(0, 999_999))
def test_a_timestamp_reads_as_a_chunk_reads_it(fsp: int, epoch: int, microsecond: int) -> None:
    """UTC seconds since the epoch (the session's time zone is UTC); zero is the zero
    timestamp, null."""
    column = ColumnInfo("c", "timestamp", f"timestamp({fsp})", fsp=fsp)
    data = epoch.to_bytes(4, "big") + _fraction(fsp, microsecond)
    shown = microsecond // 10 ** (6 - fsp) * 10 ** (6 - fsp)
    stored = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=epoch, microseconds=shown)
    expected = converter(column)(stored) if epoch or shown else None
    assert _read_one(ev.TYPE_TIMESTAMP2, fsp, column, data) == expected


_MEMBERS = tuple(f"m{i}" for i in range(20))


@given(st.integers(1, 20).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, 2**n - 1))))
def test_a_set_reads_as_its_members_in_definition_order(case: tuple[int, int]) -> None:
    count, mask = case
    members = _MEMBERS[:count]
    column = ColumnInfo("c", "set", "set(" + ",".join(f"'{m}'" for m in members) + ")")
    size = (count + 7) // 8
    metadata = ev.TYPE_SET << 8 | size
    expected = ",".join(m for i, m in enumerate(members) if mask >> i & 1)
    assert _read_one(ev.TYPE_STRING, metadata, column, mask.to_bytes(size, "little")) == expected


def test_set_bits_beyond_its_members_are_refused_by_name() -> None:
    column = ColumnInfo("c", "set", "set('a','b')")
    with pytest.raises(SourceError, match=r"column 'c' of shop\.orders .*beyond its 2 members"):
        _read_one(ev.TYPE_STRING, ev.TYPE_SET << 8 | 1, column, b"\x05")


@given(st.binary(max_size=300))
def test_a_blob_reads_as_its_base64(data: bytes) -> None:
    column = ColumnInfo("c", "blob", "blob")
    value = _read_one(ev.TYPE_BLOB, 2, column, len(data).to_bytes(2, "little") + data)
    assert value == converter(column)(data)
