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
    converter,
    read_expression,
    to_param,
)


def column(column_type: str, **fields: Any) -> ColumnInfo:
    data_type = fields.pop("data_type", column_type.split("(")[0].split(" ")[0])
    return ColumnInfo("c", data_type, column_type, **fields)


UTF8 = {"charset": "utf8mb4", "collation": "utf8mb4_unicode_ci"}

CASES: list[tuple[ColumnInfo, Any, Any]] = [
    # column, the value PyMySQL gives, its JSON
    (column("tinyint(4)"), -128, -128),
    (column("tinyint(1)"), 1, 1),
    (column("tinyint(3) unsigned"), 255, 255),
    (column("smallint(5) unsigned"), 65535, 65535),
    (column("mediumint(8) unsigned"), 16777215, 16777215),
    (column("int(10) unsigned"), 4294967295, 4294967295),
    (column("bigint(20) unsigned"), 2**64 - 1, 2**64 - 1),
    (column("bigint(20)"), -(2**63), -(2**63)),
    (column("decimal(30,10)"), Decimal("0E-10"), "0.0000000000"),
    (column("decimal(5,2)"), Decimal("-1.50"), "-1.50"),
    (column("float"), 16777216.0, 16777216.0),
    (column("float"), 1.100000023841858, 1.1),
    (column("double"), 0.30000000000000004, 0.30000000000000004),
    (column("varchar(20)", **UTF8), "héllo😀", "héllo😀"),
    (column("varchar(10)", charset="latin1", collation="latin1_swedish_ci"), "lätin", "lätin"),
    (column("binary(6)", length=6), b"\x01\x02\0\0\0\0", "AQIAAAAA"),
    (column("binary(6)", length=6), b"\0" * 6, "AAAAAAAA"),
    (column("varbinary(10)", length=10), b"\xde\xad", "3q0="),
    (column("blob", length=65535), b"", ""),
    (column("date"), datetime.date(2024, 2, 29), "2024-02-29"),
    (column("date"), "0000-00-00", None),
    (
        column("datetime(6)", fsp=6),
        datetime.datetime(2024, 2, 29, 23, 59, 59, 123456),
        "2024-02-29 23:59:59.123456",
    ),
    (
        column("datetime(3)", fsp=3),
        datetime.datetime(999, 1, 1, 0, 0, 0, 120000),
        "0999-01-01 00:00:00.120",
    ),
    (column("datetime"), "0000-00-00 00:00:00", None),
    (
        column("timestamp(6)", fsp=6),
        datetime.datetime(1970, 1, 1, 0, 0, 1),
        "1970-01-01 00:00:01.000000",
    ),
    (column("timestamp"), "0000-00-00 00:00:00", None),
    (column("time"), datetime.timedelta(days=-35, seconds=3601), "-838:59:59"),
    (
        column("time(6)", fsp=6),
        datetime.timedelta(seconds=45296, microseconds=1),
        "12:34:56.000001",
    ),
    (column("time(2)", fsp=2), datetime.timedelta(microseconds=-10000), "-00:00:00.01"),
    (column("year(4)"), 2155, 2155),
    (column("year(4)"), 0, 0),
    (
        column("longtext", data_type="json", **UTF8),
        '{"a": [1, 2.5, "x"], "c": 12345678901234567890}',
        {"a": [1, 2.5, "x"], "c": 12345678901234567890},
    ),
    (column("json"), '{"k": [1, "v"]}', {"k": [1, "v"]}),
    (column("enum('x','y','z')", **UTF8), "y", "y"),
    (column("set('a','b','c')", **UTF8), "a,c", "a,c"),
    (column("set('a','b','c')", **UTF8), "", ""),
    (column("bit(10)"), b"\x02\xaa", 0b1010101010),
    (column("bit(64)"), b"\xff" * 8, 2**64 - 1),
    (column("int(11)"), None, None),
    (column("set('a')"), None, None),
]


@pytest.mark.parametrize(("col", "dumped", "expected"), CASES)
def test_each_type_gives_its_json(col: ColumnInfo, dumped: Any, expected: Any) -> None:
    assert json.dumps(converter(col)(dumped)) == json.dumps(expected)


def test_enum_and_set_members_are_parsed_from_the_column_type() -> None:
    col = column("enum('it''s','a,b','back\\\\slash')")
    assert col.members == ("it's", "a,b", "back\\slash")
    assert column("set('x','y','z')").members == ("x", "y", "z")


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
