"""MySQL converters: the values PyMySQL (dump) and mysql-replication (log) hand over for the same
stored value give the same JSON. The pairs are what both libraries returned on MariaDB 10.11
(tests/integration/sources/mysql/test_types.py checks them against the real server)."""

from __future__ import annotations

import datetime
import json
from decimal import Decimal
from typing import Any

import pytest

from airflow_provider_dblog.sources.mysql.catalog import ColumnInfo
from airflow_provider_dblog.sources.mysql.converters import (
    convert,
    converter,
    read_expression,
    to_param,
)


def column(column_type: str, **fields: Any) -> ColumnInfo:
    data_type = fields.pop("data_type", column_type.split("(")[0].split(" ")[0])
    return ColumnInfo("c", data_type, column_type, **fields)


UTF8 = {"charset": "utf8mb4", "collation": "utf8mb4_unicode_ci"}

CASES: list[tuple[ColumnInfo, Any, Any, Any]] = [
    # column, value from the dump, value from the log, JSON
    (column("tinyint(4)"), -128, -128, -128),
    (column("tinyint(1)"), 1, 1, 1),
    (column("tinyint(3) unsigned"), 255, -1, 255),
    (column("smallint(5) unsigned"), 65535, -1, 65535),
    (column("mediumint(8) unsigned"), 16777215, -1, 16777215),
    (column("int(10) unsigned"), 4294967295, -1, 4294967295),
    (column("bigint(20) unsigned"), 2**64 - 1, -1, 2**64 - 1),
    (column("bigint(20)"), -(2**63), -(2**63), -(2**63)),
    (column("decimal(30,10)"), Decimal("0E-10"), Decimal("0E-10"), "0.0000000000"),
    (column("decimal(5,2)"), Decimal("-1.50"), Decimal("-1.50"), "-1.50"),
    (column("float"), 16777216.0, 16777216.0, 16777216.0),
    (column("float"), 1.100000023841858, 1.100000023841858, 1.1),
    (column("double"), 0.30000000000000004, 0.30000000000000004, 0.30000000000000004),
    (column("varchar(20)", **UTF8), "héllo😀", "héllo😀", "héllo😀"),
    (
        column("varchar(10)", charset="latin1", collation="latin1_swedish_ci"),
        "lätin",
        "lätin".encode("cp1252"),
        "lätin",
    ),
    (column("binary(6)", length=6), b"\x01\x02\0\0\0\0", b"\x01\x02", "AQIAAAAA"),
    (column("binary(6)", length=6), b"\0" * 6, "", "AAAAAAAA"),
    (column("varbinary(10)", length=10), b"\xde\xad", b"\xde\xad", "3q0="),
    (column("blob", length=65535), b"", b"", ""),
    (column("date"), datetime.date(2024, 2, 29), datetime.date(2024, 2, 29), "2024-02-29"),
    (column("date"), "0000-00-00", None, None),
    (
        column("datetime(6)", fsp=6),
        datetime.datetime(2024, 2, 29, 23, 59, 59, 123456),
        datetime.datetime(2024, 2, 29, 23, 59, 59, 123456),
        "2024-02-29 23:59:59.123456",
    ),
    (
        column("datetime(3)", fsp=3),
        datetime.datetime(999, 1, 1, 0, 0, 0, 120000),
        datetime.datetime(999, 1, 1, 0, 0, 0, 120000),
        "0999-01-01 00:00:00.120",
    ),
    (column("datetime"), "0000-00-00 00:00:00", None, None),
    (
        column("timestamp(6)", fsp=6),
        datetime.datetime(1970, 1, 1, 0, 0, 1),
        datetime.datetime(1970, 1, 1, 0, 0, 1),
        "1970-01-01 00:00:01.000000",
    ),
    (column("timestamp"), "0000-00-00 00:00:00", datetime.datetime(1970, 1, 1), None),
    (
        column("time"),
        datetime.timedelta(days=-35, seconds=3601),
        datetime.timedelta(days=-35, seconds=3601),
        "-838:59:59",
    ),
    (
        column("time(6)", fsp=6),
        datetime.timedelta(seconds=45296, microseconds=1),
        datetime.timedelta(seconds=45296, microseconds=1),
        "12:34:56.000001",
    ),
    (
        column("time(2)", fsp=2),
        datetime.timedelta(microseconds=-10000),
        datetime.timedelta(microseconds=-10000),
        "-00:00:00.01",
    ),
    (column("year(4)"), 2155, 2155, 2155),
    (column("year(4)"), 0, 1900, 0),
    (
        column("longtext", data_type="json", **UTF8),
        '{"a": [1, 2.5, "x"], "c": 12345678901234567890}',
        '{"a": [1, 2.5, "x"], "c": 12345678901234567890}',
        {"a": [1, 2.5, "x"], "c": 12345678901234567890},
    ),
    (column("json"), '{"k": [1, "v"]}', {b"k": [1, b"v"]}, {"k": [1, "v"]}),
    (column("enum('x','y','z')", **UTF8), "y", "y", "y"),
    (column("set('a','b','c')", **UTF8), "a,c", {"c", "a"}, "a,c"),
    (column("set('a','b','c')", **UTF8), "", set(), ""),
    (column("bit(10)"), b"\x02\xaa", "1010101010", 0b1010101010),
    (column("bit(64)"), b"\xff" * 8, "1" * 64, 2**64 - 1),
    (column("int(11)"), None, None, None),
    (column("set('a')"), None, None, None),
]


@pytest.mark.parametrize(("col", "dumped", "logged", "expected"), CASES)
def test_both_paths_give_the_same_json(
    col: ColumnInfo, dumped: Any, logged: Any, expected: Any
) -> None:
    convert_value = converter(col)
    from_dump, from_log = convert_value(dumped), convert_value(logged)
    assert from_dump == expected
    assert json.dumps(from_log) == json.dumps(from_dump)


def test_enum_and_set_members_are_parsed_from_the_column_type() -> None:
    col = column("enum('it''s','a,b','back\\\\slash')")
    assert col.members == ("it's", "a,b", "back\\slash")
    assert convert(column("set('x','y','z')"), 0b101) == "x,z"
    assert convert(col, 2) == "a,b"


@pytest.mark.parametrize(
    ("col", "value", "param"),
    [
        (column("bigint(20) unsigned"), 2**64 - 1, 2**64 - 1),
        (column("decimal(5,2)"), "-1.50", Decimal("-1.50")),
        (column("binary(16)", length=16), "AQIAAAAA", b"\x01\x02\0\0\0\0"),
        (column("varchar(10)", **UTF8), "a", "a"),
        (column("datetime(6)", fsp=6), "2024-02-29 23:59:59.123456", "2024-02-29 23:59:59.123456"),
        (column("bit(3)"), 5, 5),
        (column("float"), 1.1, 1.100000023841858),
        (column("enum('b','a','c')"), "a", 2),
        (column("set('x','y','z')"), "x,z", 0b101),
        (column("set('x','y','z')"), "", 0),
    ],
)
def test_keys_go_back_as_parameters_the_server_compares(
    col: ColumnInfo, value: Any, param: Any
) -> None:
    assert to_param(col, value) == param


def test_a_float_column_is_read_as_the_double_it_stores() -> None:
    assert read_expression(column("float")) == "CAST(`c` AS DOUBLE)"
    assert read_expression(ColumnInfo("we`ird", "int", "int(11)")) == "`we``ird`"


def test_a_value_outside_the_members_cannot_be_a_key() -> None:
    with pytest.raises(ValueError, match="not one of the enum members"):
        to_param(column("enum('b','a')"), "q")
