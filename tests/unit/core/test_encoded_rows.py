"""Chunk rows encoded by the reader give the bytes `encode_lines` gives for the same rows."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.core.encoded_rows import (
    EncodedEvent,
    EncodedRows,
    changed_key_json,
    encode_rows,
)
from airflow_provider_dblog.core.event import Event, Op, Origin, TableRef, key_of
from airflow_provider_dblog.core.event_codec import encode_lines
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import ChunkRows, Closed, Reconciler, Window

pytestmark = pytest.mark.unit

T = TableRef("públic", 'tab"le')

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
key_values = st.integers(min_value=-(2**63), max_value=2**63) | st.text()


@st.composite
def chunks(draw: st.DrawFn) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    """Key columns and rows with one column list, keys unique."""
    columns = draw(st.lists(st.text(max_size=6), min_size=1, max_size=5, unique=True))
    width = draw(st.integers(min_value=1, max_value=len(columns)))
    key_columns = tuple(draw(st.permutations(columns))[:width])
    keys = draw(
        st.lists(
            st.tuples(*(key_values for _ in key_columns)),
            max_size=12,
            unique_by=lambda k: tuple((type(v), v) for v in k),
        )
    )
    rows = []
    for key in keys:
        row = {c: draw(values) for c in columns}
        row.update(zip(key_columns, key, strict=True))
        rows.append(row)
    return key_columns, rows


def _closed(changed: frozenset[Any], hw: Position) -> Closed:
    window = Window("w-ü\n1", 'dump "1"', T)
    return Closed(window, Position(hw.commit - 1, 0), hw, changed)


@settings(max_examples=200, deadline=None)
@given(
    chunk=chunks(),
    drop=st.lists(st.integers(min_value=0, max_value=11), max_size=4),
    page=st.integers(min_value=1, max_value=5),
    hw=st.builds(Position, st.integers(1, 2**64 - 1), st.integers(0, 2**20)),
    version=st.integers(0, 2**31),
)
def test_encoded_rows_give_the_lines_of_encode_lines(
    chunk: tuple[tuple[str, ...], list[dict[str, Any]]],
    drop: list[int],
    page: int,
    hw: Position,
    version: int,
) -> None:
    """The reader's encoding, stamped page by page at hw, is byte for byte `encode_lines` of the
    events the tailer built from the rows themselves, and decodes to those events."""
    key_columns, rows = chunk
    changed = frozenset(key_of(rows[i], key_columns) for i in drop if i < len(rows))
    closed = _closed(changed, hw)
    reconciler = Reconciler("sourçe", "d\tb")
    expected = reconciler.chunk_events(closed, ChunkRows("w-ü\n1", key_columns, rows, version))
    assert isinstance(expected, list)

    encoded = encode_rows(rows, key_columns)
    got: list[Event] = []
    for start in range(0, len(rows), page):
        part = EncodedRows(encoded.keys[start : start + page], encoded.values[start : start + page])
        slice_ = ChunkRows("w-ü\n1", key_columns, part, version, emitted_before=len(got))
        events = reconciler.chunk_events(closed, slice_)
        assert isinstance(events, list)
        got += events

    assert all(type(e) is EncodedEvent for e in got)
    assert [e.line for e in got if isinstance(e, EncodedEvent)] == encode_lines(expected)
    assert encode_lines(got) == encode_lines(expected)
    assert got == expected and expected == got
    assert [e.position for e in got] == [e.position for e in expected]
    fields = [(e.key, e.after, e.source, e.schema_version) for e in expected]
    assert [(e.key, e.after, e.source, e.schema_version) for e in got] == fields


def test_keys_holding_lists_are_compared_decoded() -> None:
    """A key value JSON spells as a list or object cannot be told from its frozen tuple: those
    windows compare each row's key decoded."""
    key_columns = ("k",)
    rows = [{"k": [1, 2], "v": 1}, {"k": [3], "v": 2}]
    changed = frozenset({key_of(rows[0], key_columns)})
    assert changed_key_json(changed, key_columns) is None
    closed = _closed(changed, Position(10, 0))
    events = Reconciler("s", "d").chunk_events(
        closed, ChunkRows("w-ü\n1", key_columns, encode_rows(rows, key_columns), 1)
    )
    assert isinstance(events, list)
    assert [e.after for e in events] == [rows[1]]
    assert [e.position for e in events] == [Position(10, 1)]


def test_an_encoded_event_reads_its_fields_from_its_line() -> None:
    rows = [{"id": 7, "name": "a\u2028b"}]
    closed = _closed(frozenset(), Position(99, 4))
    (event,) = Reconciler("s", "d").chunk_events(
        closed, ChunkRows("w-ü\n1", ("id",), encode_rows(rows, ("id",)), 3, emitted_before=2)
    )
    assert isinstance(event, EncodedEvent)
    assert (event.op, event.key, event.before, event.after) == (Op.READ, {"id": 7}, None, rows[0])
    assert event.position == Position(99, 7) and event.table == T
    assert event.source.origin is Origin.DUMP and event.source.window_id == "w-ü\n1"
    assert event.schema_version == 3 and event.table_schema is None
    assert json.loads(event.line) == event.event().to_json()


def test_a_row_without_its_key_column_is_refused_by_the_reader() -> None:
    with pytest.raises(ValueError, match="primary-key column"):
        encode_rows([{"id": 1}, {"v": 2}], ("id",))
