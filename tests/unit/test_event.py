"""Positions and the event envelope: ordering, LSN spelling, stable JSON."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_dblog.core.event import (
    Event,
    Op,
    Origin,
    SourceInfo,
    TableRef,
    decode,
    encode,
    key_of,
)
from airflow_provider_dblog.core.position import (
    Position,
    binlog_file_number,
    format_pg_lsn,
    mysql_commit,
    parse_pg_lsn,
)

pytestmark = pytest.mark.unit


def test_positions_order_by_commit_then_seq() -> None:
    assert Position(1, 9) < Position(2, 0) < Position(2, 1)
    assert Position.from_json([5, 3]) == Position(5, 3)
    with pytest.raises(ValueError, match="two integers"):
        Position.from_json([1, "2"])
    with pytest.raises(ValueError, match="out of range"):
        Position(-1, 0)


@given(st.integers(0, 2**64 - 1))
def test_pg_lsn_round_trip(lsn: int) -> None:
    assert parse_pg_lsn(format_pg_lsn(lsn)) == lsn


def test_pg_lsn_spelling_and_errors() -> None:
    assert parse_pg_lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert format_pg_lsn(0x16_B374D848) == "16/B374D848"
    with pytest.raises(ValueError, match="not a PostgreSQL LSN"):
        parse_pg_lsn("16B374D848")


def test_mysql_commit_grows_with_file_then_offset() -> None:
    assert mysql_commit(2, 4) > mysql_commit(1, 2**32 - 1)
    assert binlog_file_number("mysql-bin.000042") == 42
    with pytest.raises(ValueError, match="not a binlog file name"):
        binlog_file_number("mysql-bin")


def test_table_ref_parse() -> None:
    assert TableRef.parse("app.users") == TableRef("app", "users")
    assert TableRef.parse("users", default_schema="public") == TableRef("public", "users")
    with pytest.raises(ValueError, match=r"schema\.table"):
        TableRef.parse("users")


def sample_event() -> Event:
    source = SourceInfo("pg", "db", "app", "users", Position(7, 1), Origin.LOG, txid=9, ts_ms=1)
    after = {"id": 1, "name": "Zoë", "tags": ["a"], "doc": {"z": 1, "a": [1, 2]}}
    return Event(Op.CREATE, {"id": 1}, None, after, source, 2)


def test_encoding_is_stable_and_round_trips() -> None:
    event = sample_event()
    line = encode(event)
    assert line.startswith('{"op":"c","key":{"id":1},"before":null,"after":{"id":1,"name":"Zoë"')
    assert '"position":[7,1]' in line and "\n" not in line
    assert decode(line) == event
    assert encode(decode(line)) == line


def test_decode_refuses_what_is_not_an_event() -> None:
    with pytest.raises(ValueError, match="not a DBLog event"):
        decode('{"op": "c"}')


def test_keys_are_hashable_in_primary_key_order() -> None:
    row = {"b": [1, 2], "a": "x", "v": 0}
    assert key_of(row, ("a", "b")) == ("x", (1, 2))
    assert hash(key_of(row, ("a", "b")))
    with pytest.raises(ValueError, match="no primary-key column"):
        key_of(row, ("missing",))
