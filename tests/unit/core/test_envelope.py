"""The log readers' events built with their lines (`core.envelope`): each line is `encode`'s of
the event it comes with, for a change filled at once, for a change and a run of changes in a
transaction, whatever the names and values hold."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_dblog.core.envelope import TableLines
from airflow_provider_dblog.core.event import (
    EncodedLogEvent,
    LogOrigin,
    Op,
    Origin,
    PlainEvent,
    Row,
    SourceInfo,
    TableRef,
)
from airflow_provider_dblog.core.event_codec import decode, encode
from airflow_provider_dblog.core.log import Change
from airflow_provider_dblog.core.position import Position

pytestmark = pytest.mark.unit

NAMES = st.text(max_size=6) | st.sampled_from(['o"rders%', "50%d", "%b%%", "ü\n"])
VALUES = st.integers(-(2**63), 2**63) | st.text(max_size=8) | st.none()
ROWS = st.dictionaries(st.sampled_from(["id", "note", "n%d"]), VALUES, min_size=1)
spell = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def json_of(row: Row | None) -> bytes:
    return b"null" if row is None else spell(row).encode()


def plain(
    op: Op,
    key: Row,
    before: Row | None,
    after: Row | None,
    position: Position,
    origin: LogOrigin,
    version: int,
) -> PlainEvent:
    table = origin.table
    source = SourceInfo(
        origin.name,
        origin.db,
        table.schema,
        table.name,
        position,
        Origin.LOG,
        txid=origin.txid,
        ts_ms=origin.ts_ms,
    )
    return PlainEvent(op, key, before, after, source, version)


@given(
    names=st.tuples(NAMES, NAMES, NAMES, NAMES),
    op=st.sampled_from([Op.CREATE, Op.UPDATE, Op.DELETE]),
    key=ROWS,
    row=ROWS,
    txid=st.none() | st.integers(0, 2**64 - 1),
    commit=st.integers(0, 2**64 - 1),
    seq=st.integers(0, 2**31),
    version=st.integers(0, 1000),
)
def test_a_change_carries_encodes_line_of_its_event(
    names: tuple[str, str, str, str],
    op: Op,
    key: Row,
    row: Row,
    txid: int | None,
    commit: int,
    seq: int,
    version: int,
) -> None:
    name, db, schema, table = names
    origin = LogOrigin(name, db, TableRef(schema, table), txid, 1_700_000_000_123)
    before = None if op is Op.CREATE else row
    after = None if op is Op.DELETE else row
    position = Position(commit, seq)
    lines = TableLines(name, db, origin.table)
    jsons = (json_of(key), json_of(before), json_of(after))
    expected = plain(op, key, before, after, position, origin, version)
    in_transaction = lines.in_transaction(commit, origin, version)
    for change in (
        in_transaction.change(op, key, before, after, *jsons, position),
        in_transaction.change(op, key, before, after, *jsons, position),  # its format kept
    ):
        assert isinstance(change, Change) and isinstance(change.event, EncodedLogEvent)
        assert change.event == expected
        assert change.event.line == (encode(expected) + "\n").encode()
        assert decode(change.event.line) == expected


@given(
    op=st.sampled_from([Op.CREATE, Op.UPDATE, Op.DELETE]),
    rows=st.lists(st.tuples(ROWS, ROWS), min_size=1, max_size=5),
    first=st.integers(0, 100),
)
def test_a_run_of_changes_carries_the_lines_of_its_events(
    op: Op, rows: list[tuple[Row, Row]], first: int
) -> None:
    origin = LogOrigin("shop%", 'sh"op', TableRef("app", "t%d"), None, 5)
    commit = (3 << 32) | 120
    keys = [{"id": key.get("id")} for key, _ in rows]
    befores = None if op is Op.CREATE else [row for _, row in rows]
    afters = None if op is Op.DELETE else [row for row, _ in rows]
    run = (
        TableLines("shop%", 'sh"op', origin.table)
        .in_transaction(commit, origin, 2)
        .run(
            op,
            first,
            keys,
            befores,
            afters,
            map(json_of, keys),
            map(json_of, befores or [None] * len(rows)),
            map(json_of, afters or [None] * len(rows)),
        )
    )
    assert (run.commit, run.first, run.last) == (commit, first, first + len(rows) - 1)
    expected = [
        plain(
            op,
            key,
            None if befores is None else befores[i],
            None if afters is None else afters[i],
            Position(commit, first + i),
            origin,
            2,
        )
        for i, key in enumerate(keys)
    ]
    assert run.events() == expected
    assert run.data == b"".join((encode(e) + "\n").encode() for e in expected)
