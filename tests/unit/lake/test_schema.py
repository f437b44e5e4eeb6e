"""The lake's type mapping: PostgreSQL and MySQL catalog types to Arrow, and the converters'
JSON values to typed Arrow columns."""

from __future__ import annotations

import datetime
import decimal
import pickle

import pyarrow as pa
import pytest

from airflow_provider_dblog.core.event import JsonValue, TableRef
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.lake.schema import (
    KEEP_PREFIX,
    POSITION_COLUMNS,
    LakeRow,
    LakeSchema,
    LakeSchemaError,
    column_array,
    converter,
    lake_column,
    lake_schema,
)

pytestmark = pytest.mark.unit
UTC = datetime.UTC


@pytest.mark.parametrize(
    ("sql_type", "arrow"),
    [
        ("smallint", pa.int16()),
        ("integer", pa.int32()),
        ("bigint", pa.int64()),
        ("boolean", pa.bool_()),
        ("real", pa.float32()),
        ("double precision", pa.float64()),
        ("numeric(10,2)", pa.decimal128(10, 2)),
        ("numeric(5)", pa.decimal128(5, 0)),
        ("numeric", pa.string()),
        ("numeric(60,4)", pa.string()),
        ("text", pa.string()),
        ("character varying(20)", pa.string()),
        ("uuid", pa.string()),
        ("jsonb", pa.string()),
        ("bytea", pa.binary()),
        ("date", pa.date32()),
        ("timestamp without time zone", pa.timestamp("us")),
        ("timestamp(3) with time zone", pa.timestamp("us", tz="UTC")),
        ("time without time zone", pa.string()),
        ("interval", pa.string()),
        ("integer[]", pa.list_(pa.int32())),
        ("timestamp with time zone[]", pa.list_(pa.timestamp("us", tz="UTC"))),
        ("public.mood", pa.string()),
    ],
)
def test_postgres_types(sql_type: str, arrow: pa.DataType) -> None:
    assert lake_column("postgres", "c", sql_type).arrow == arrow


@pytest.mark.parametrize(
    ("sql_type", "arrow"),
    [
        ("tinyint(1)", pa.int8()),
        ("tinyint(3) unsigned", pa.int16()),
        ("int(11)", pa.int32()),
        ("int unsigned", pa.int64()),
        ("bigint(20)", pa.int64()),
        ("bigint(20) unsigned", pa.decimal128(20, 0)),
        ("decimal(10,2)", pa.decimal128(10, 2)),
        ("decimal(65,30)", pa.string()),
        ("float", pa.float32()),
        ("double", pa.float64()),
        ("varchar(20)", pa.string()),
        ("enum('a','b')", pa.string()),
        ("binary(16)", pa.binary()),
        ("longblob", pa.binary()),
        ("date", pa.date32()),
        ("datetime(6)", pa.timestamp("us")),
        ("timestamp(3)", pa.timestamp("us", tz="UTC")),
        ("time(3)", pa.string()),
        ("year(4)", pa.int16()),
        ("json", pa.string()),
        ("bit(8)", pa.int64()),
        ("bit(64)", pa.decimal128(20, 0)),
    ],
)
def test_mysql_types(sql_type: str, arrow: pa.DataType) -> None:
    assert lake_column("mysql", "c", sql_type).arrow == arrow


TABLE = TableRef("app", "t")
DESCRIBED = TableSchema(
    (
        Column("id", "bigint", False, None),
        Column("amount", "numeric(10,2)", True, None),
        Column("ratio", "double precision", True, None),
        Column("doc", "jsonb", True, None),
        Column("raw", "bytea", True, None),
        Column("at", "timestamp with time zone", True, None),
        Column("local", "timestamp without time zone", True, None),
        Column("day", "date", True, None),
        Column("tags", "text[]", True, None),
        Column("name", "text", True, None),
    ),
    ("id",),
)


def test_json_values_become_typed_columns() -> None:
    schema = lake_schema("postgres", TABLE, DESCRIBED)
    row = {
        "id": 1,
        "amount": "-1.50",
        "ratio": "NaN",
        "doc": {"a": [1, "x"]},
        "raw": "AAH/",
        "at": "2024-02-29 23:59:59.123456+00",
        "local": "2024-02-29 23:59:59",
        "day": "infinity",
        "tags": ["a", None],
        "name": "é",
    }
    table = schema.to_arrow([LakeRow(row, 10, 3, "c", ts_ms=5)])
    assert table.schema.field("id").nullable is False
    assert table.schema.names[-len(POSITION_COLUMNS) :] == list(POSITION_COLUMNS)
    [found] = table.to_pylist()
    assert found["amount"] == decimal.Decimal("-1.50")
    assert found["ratio"] != found["ratio"]  # NaN
    assert found["doc"] == '{"a":[1,"x"]}'
    assert found["raw"] == b"\x00\x01\xff"
    assert found["at"] == datetime.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC)
    assert found["local"] == datetime.datetime(2024, 2, 29, 23, 59, 59)
    assert found["day"] is None
    assert found["tags"] == ["a", None]
    assert (found["_dblog_commit"], found["_dblog_seq"], found["_dblog_op"]) == (10, 3, "c")
    assert found["_dblog_deleted"] is False and found["_dblog_ts_ms"] == 5


@pytest.mark.parametrize(
    ("sql_type", "values"),
    [
        ("numeric(12,2)", ["1.5", "-0.01", "+3", ".5", "1e2", "7.", None]),
        ("numeric(12,2)", ["1.5", "NaN", " 2", "1_0"]),  # Arrow refuses: per value
        ("date", ["2024-02-29", "0099-01-01", None]),
        ("date", ["2024-02-29", "infinity"]),
        ("timestamp without time zone", ["2024-02-29 23:59:59.5", "2024-02-29T01:02", None]),
        ("timestamp without time zone", ["2024-02-29 23:59:59.1234567", "20240229T120000"]),
        ("timestamp with time zone", ["2024-02-29 23:59:59+00", "2024-02-29 01:02:03.5+05:30"]),
        ("timestamp with time zone", ["2024-02-29 23:59:59+00", "2024-02-29 01:02:03"]),
        ("real", [1, 2.5, None]),
        ("double precision", [1.5, "NaN", "-Infinity"]),
        ("text", ["a", "é", None]),
        ("text", ["a", 1, True, [1]]),
    ],
)
def test_a_column_made_at_once_holds_what_the_per_value_conversion_makes(
    sql_type: str, values: list[JsonValue]
) -> None:
    """Arrow builds most columns in one call; what it reads must equal the converters'."""
    column = lake_column("postgres", "c", sql_type)
    convert = converter(column.kind)
    expected = pa.array([None if v is None else convert(v) for v in values], column.arrow)
    found = column_array(column, values, TABLE)
    assert found.type == expected.type
    assert repr(found.to_pylist()) == repr(expected.to_pylist())  # repr: NaN equals NaN


def test_a_tombstone_and_kept_columns() -> None:
    schema = lake_schema("postgres", TABLE, DESCRIBED)
    rows = [
        LakeRow({"id": 2}, 11, 0, "d", deleted=True),
        LakeRow({"id": 3, "name": "n"}, 12, 0, "u", keep=frozenset({"doc"})),
    ]
    table = schema.to_arrow(rows)
    assert table[KEEP_PREFIX + "doc"].to_pylist() == [False, True]
    assert table["_dblog_deleted"].to_pylist() == [True, False]


def test_a_value_the_type_refuses_names_table_column_and_value() -> None:
    schema = lake_schema("postgres", TABLE, DESCRIBED)
    with pytest.raises(LakeSchemaError, match=r"app\.t\.amount .*'abc'"):
        schema.to_arrow([LakeRow({"id": 1, "amount": "abc"}, 1, 0, "c")])
    with pytest.raises(LakeSchemaError, match=r"_dblog_commit"):
        schema.to_arrow([LakeRow({"id": 1}, 1 << 63, 0, "c")])


def test_the_schema_survives_pickling_and_the_arrow_round_trip() -> None:
    schema = lake_schema("postgres", TABLE, DESCRIBED)
    assert pickle.loads(pickle.dumps(schema)) == schema
    again = LakeSchema.from_arrow(TABLE, schema.arrow_schema(), schema.key, "postgres")
    assert again == schema
