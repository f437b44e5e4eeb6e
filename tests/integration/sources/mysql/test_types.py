"""The converter contract on a real MariaDB: rows of every type the source supports read by a
query (PyMySQL, as the dump reads them) give the documented JSON, and decoded from the binlog
(`MysqlLogReader`'s row decoder) give the same JSON, byte for byte."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Row, TableRef
from airflow_provider_dblog.core.log import Change, Idle, single_changes
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.lake.catalog import source_lake_schema
from airflow_provider_dblog.sources.keyset import TableShape
from airflow_provider_dblog.sources.mysql.binlog import MysqlLogReader
from airflow_provider_dblog.sources.mysql.catalog import ColumnInfo, table_shape
from airflow_provider_dblog.sources.mysql.chunks import MysqlChunkSource
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.mysql.converters import converter, read_expression
from airflow_provider_dblog.sources.mysql.setup import ensure_setup
from airflow_provider_dblog.sources.text_chunks import TextKind

pytestmark = pytest.mark.integration

COLUMNS = """
 id int PRIMARY KEY,
 ti tinyint, b bool, tu tinyint unsigned, si smallint, su smallint unsigned,
 mi mediumint, mu mediumint unsigned, i int, iu int unsigned, bi bigint, bu bigint unsigned,
 d decimal(30,10), d0 decimal(5,0), f float, db double,
 c char(5), vc varchar(20), tx text, lat varchar(10) CHARACTER SET latin1,
 bn binary(6), vb varbinary(10), bl blob,
 dt date, dtm datetime(6), dtm0 datetime, ts timestamp(6) NULL, tm time, tm3 time(3), y year,
 j json, e enum('x','y','it''s'), s set('a','b','c'), bt bit(10), bt64 bit(64),
 dz decimal(6,2) zerofill, iz int(5) zerofill
"""

ROWS = [
    """(1, -128, true, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295,
     -9223372036854775808, 18446744073709551615, -12345678901234567890.0123456789, 99999,
     16777217, 3.141592653589793, 'ab  ', 'héllo😀', 'tëxt😀 ∑', 'lätin', x'0102', x'deadbeef',
     x'000102', '2024-02-29', '2024-02-29 23:59:59.123456', '1000-01-01 00:00:00',
     '2038-01-19 03:14:07.999999', '-838:59:59', '12:34:56.001', 2155,
     '{"a": [1, 2.5, "x"], "b": null, "c": 12345678901234567890}', 'it''s', 'a,c',
     b'1010101010', b'1111111111111111111111111111111111111111111111111111111111111111',
     1.5, 42)""",
    "(2, " + ", ".join(["NULL"] * 36) + ")",
    """(3, 0, false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.1, 0.30000000000000004, '', '', '', '',
     x'000000000000', x'', x'', '0000-00-00', '0000-00-00 00:00:00', '9999-12-31 23:59:59',
     '0000-00-00 00:00:00', '00:00:00', '-00:00:00.5', 0, '[]', 'x', '', b'0', b'0', 0, 0)""",
]


@pytest.fixture
def conn(mariadb: MariaDBInfo) -> Iterator[pymysql.connections.Connection[Any]]:
    with pymysql.connect(
        **mariadb.connect_kwargs(),
        charset="utf8mb4",
        init_command="SET time_zone = '+00:00', NAMES utf8mb4 COLLATE utf8mb4_bin",
        autocommit=True,
    ) as connection:
        yield connection


@pytest.fixture
def types_config(
    mariadb: MariaDBInfo,
    conn: pymysql.connections.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> MysqlSourceConfig:
    """A source capturing a new, empty table of every type; `conn` writes in a lax sql_mode
    (zero dates, as old applications write them)."""
    table = TableRef(mariadb.dbname, f"types_{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("DBLOG_TEST_TYPES_PASSWORD", mariadb.password)
    with conn.cursor() as cursor:
        cursor.execute("SET SESSION sql_mode = ''")
        cursor.execute(f"CREATE TABLE `{table.name}` ({COLUMNS})")
    return MysqlSourceConfig(
        name="types",
        dsn=f"mysql://{mariadb.user}@{mariadb.host}:{mariadb.port}/{mariadb.dbname}",
        tables=(table,),
        password_env="DBLOG_TEST_TYPES_PASSWORD",
        watermark_table=f"watermark_{uuid.uuid4().hex[:8]}",
    )


def dumped(conn: pymysql.connections.Connection[Any], shape: TableShape[ColumnInfo]) -> list[Row]:
    converters = [converter(c) for c in shape.columns]
    select = ", ".join(read_expression(c) for c in shape.columns)
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT {select} FROM `{shape.table.schema}`.`{shape.table.name}` ORDER BY id"
        )
        rows = cursor.fetchall()
    return [
        {c.name: f(v) for c, f, v in zip(shape.columns, converters, row, strict=True)}
        for row in rows
    ]


def test_a_chunk_read_gives_the_documented_json_for_every_type(
    mariadb: MariaDBInfo, conn: pymysql.connections.Connection[Any]
) -> None:
    table = TableRef(mariadb.dbname, f"types_{uuid.uuid4().hex[:8]}")
    with conn.cursor() as cursor:
        cursor.execute("SET SESSION sql_mode = ''")  # zero dates, as old applications write them
        cursor.execute(f"CREATE TABLE `{table.name}` ({COLUMNS})")
        for values in ROWS:
            cursor.execute(f"INSERT INTO `{table.name}` VALUES {values}")
        # An update logs a before and an after image: the after image must match too.
        cursor.execute(f"UPDATE `{table.name}` SET s = 'b', bn = x'00ff' WHERE id = 3")
    shape = table_shape(conn, table)
    assert [c.data_type for c in shape.columns if c.name in ("j", "b")] == ["tinyint", "json"]

    first, null, zero = dumped(conn, shape)
    assert first["bu"] == 2**64 - 1 and first["iu"] == 4294967295
    assert first["f"] == 16777216.0 and zero["f"] == 1.1
    assert first["d"] == "-12345678901234567890.0123456789" and zero["d"] == "0.0000000000"
    assert (first["c"], first["vc"], first["lat"]) == ("ab", "héllo😀", "lätin")
    assert (first["bn"], zero["bn"]) == ("AQIAAAAA", "AP8AAAAA")
    assert (first["dtm"], first["dtm0"], first["ts"]) == (
        "2024-02-29 23:59:59.123456",
        "1000-01-01 00:00:00",
        "2038-01-19 03:14:07.999999",
    )
    assert (first["tm"], first["tm3"], zero["tm3"]) == (
        "-838:59:59",
        "12:34:56.001",
        "-00:00:00.500",
    )
    assert (first["y"], zero["y"]) == (2155, 0)
    assert first["j"] == {"a": [1, 2.5, "x"], "b": None, "c": 12345678901234567890}
    assert (first["e"], first["s"], zero["s"]) == ("it's", "a,c", "b")
    assert (first["bt"], first["bt64"]) == (0b1010101010, 2**64 - 1)
    assert (first["dz"], first["iz"], zero["dz"]) == ("1.50", 42, "0.00")
    assert (zero["dt"], zero["dtm"], zero["ts"]) == (None, None, None)
    assert all(v is None for k, v in null.items() if k != "id")


def test_the_log_reader_and_a_chunk_read_give_the_same_bytes(
    types_config: MysqlSourceConfig, conn: pymysql.connections.Connection[Any]
) -> None:
    """The same rows through the source's own two paths: `MysqlLogReader`'s events and
    `MysqlChunkSource`'s chunk read, each row encoded as events encode it."""
    config = types_config
    (table,) = config.tables
    ensure_setup(config)
    reader = MysqlLogReader(config, None, heartbeat_s=0.2)
    chunks = MysqlChunkSource(config)
    try:
        items = single_changes(reader.items())
        assert isinstance(next(items), Idle)  # connected, at the log's end
        with conn.cursor() as cursor:
            for values in ROWS:
                cursor.execute(f"INSERT INTO `{table.name}` VALUES {values}")
            cursor.execute(f"UPDATE `{table.name}` SET s = 'b', bn = x'00ff' WHERE id = 3")
        logged: dict[Any, Row] = {}
        while len(logged) < len(ROWS) or logged[3]["s"] != "b":
            item = next(items)
            if isinstance(item, Change):
                assert item.event.after is not None
                logged[item.event.after["id"]] = item.event.after
        dumped = chunks.read_chunk(Chunk(table, 0)).rows
    finally:
        chunks.close()
        reader.close()

    def encoded(row: Row) -> bytes:
        return json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode()

    assert [encoded(logged[k]) for k in sorted(logged)] == [encoded(r) for r in dumped]
    assert dumped[0]["bu"] == 2**64 - 1 and dumped[2]["s"] == "b"


def test_the_lake_takes_a_chunk_as_text_columns_as_it_takes_its_rows(
    types_config: MysqlSourceConfig, conn: pymysql.connections.Connection[Any]
) -> None:
    """A direct dump into the lake reads a chunk as the server's text in columns
    (`read_chunk_text`): each column's kind says truly when its JSON is the text itself or its
    integer, and the lake gets the same Arrow table and last key as from the rows."""
    config = types_config
    (table,) = config.tables
    with conn.cursor() as cursor:
        for values in ROWS:
            cursor.execute(f"INSERT INTO `{table.name}` VALUES {values}")
    schema = source_lake_schema(config, table)
    chunks = MysqlChunkSource(config)
    try:
        for chunk in (
            Chunk(table, 0),
            Chunk(table, 1, after=(1,), limit=1),
            Chunk(table, 2, after=(3,)),
        ):
            rows = chunks.read_chunk(chunk).rows
            text = chunks.read_chunk_text(chunk)
            assert text.rows == len(rows) and text.invisible_txids == frozenset()
            assert text.last_key == ((rows[-1]["id"],) if rows else None)
            for column in text.columns:
                for value, row in zip(column.text.to_pylist(), rows, strict=True):
                    if value is not None and column.kind is TextKind.TEXT:
                        assert column.convert(value) == value, column.name
                    if value is not None and column.kind is TextKind.INT:
                        assert column.convert(value) == int(value), column.name
                    assert (None if value is None else column.convert(value)) == row[column.name]
            by_rows, by_text = schema.values_to_arrow(rows), schema.values_from_text(text.columns)
            assert by_text.schema == by_rows.schema
            for name in by_rows.column_names:  # repr: 1 differs from 1.0 and True
                assert repr(by_text[name].to_pylist()) == repr(by_rows[name].to_pylist()), name
        kinds = {c.name: c.kind for c in text.columns}
        assert (kinds["bu"], kinds["iz"], kinds["vc"], kinds["s"], kinds["d"], kinds["dz"]) == (
            TextKind.INT,
            TextKind.INT,
            TextKind.TEXT,
            TextKind.TEXT,
            TextKind.TEXT,
            TextKind.OTHER,
        )
    finally:
        chunks.close()
