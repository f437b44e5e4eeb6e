"""The lean row decoder's refusals: a type it does not read, and bytes it cannot read, are
errors naming the table, the column and the type, never a silent wrong value."""

from __future__ import annotations

import json

import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.base import SourceError
from airflow_provider_dblog.sources.mysql import events as ev
from airflow_provider_dblog.sources.mysql.catalog import ColumnInfo
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
