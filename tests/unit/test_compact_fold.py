"""The compaction's pure rules: which event wins per key, and how event files are cut."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_dblog.compaction import (
    TABLE_KEY,
    TRUNCATE,
    CompactState,
    Delta,
    Stored,
    changes_of,
    floors,
    fold,
    parse_line,
    plan_segments,
    read_segment,
)
from airflow_provider_dblog.core.event import Event, Op, Origin, SourceInfo, encode, table_event
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput, event_files

pytestmark = pytest.mark.unit


def upsert(commit: int, seq: int = 0, op: str = "u", **after: object) -> Delta:
    return Delta(commit, seq, op, {"id": 1, **after})


def delete(commit: int, seq: int = 0) -> Delta:
    return Delta(commit, seq, "d", None)


def test_newest_position_wins_whatever_the_arrival_order() -> None:
    changes = [upsert(3, a="c"), upsert(1, a="a"), upsert(2, 5, a="b")]
    assert fold(None, changes) == Stored(3, 0, {"id": 1, "a": "c"})


def test_delete_removes_and_a_later_create_brings_the_key_back() -> None:
    stored = Stored(1, 0, {"id": 1, "a": "a"})
    assert fold(stored, [delete(2)]) is None
    assert fold(stored, [delete(2), upsert(3, op="c", a="n")]) == Stored(3, 0, {"id": 1, "a": "n"})


def test_duplicates_are_harmless() -> None:
    once = [upsert(1, op="c", a="a", n=1), upsert(2, a="b")]
    assert fold(None, once + once) == fold(None, once)
    stored = fold(None, once)
    assert fold(stored, once) == stored


def test_absent_column_keeps_the_previous_value() -> None:
    stored = Stored(1, 0, {"id": 1, "a": "a", "big": "toasted"})
    assert fold(stored, [upsert(2, a="b")]) == Stored(2, 0, {"id": 1, "a": "b", "big": "toasted"})


def test_dump_read_replaces_the_whole_row() -> None:
    stored = Stored(1, 0, {"id": 1, "a": "a", "dropped": 1})
    assert fold(stored, [upsert(2, op="r", a="b")]) == Stored(2, 0, {"id": 1, "a": "b"})


def test_older_event_after_newer_is_ignored() -> None:
    stored = Stored(5, 2, {"id": 1, "a": "new"})
    assert fold(stored, [upsert(5, 1, a="old"), delete(4)]) == stored
    assert fold(None, [delete(6), upsert(5, a="old")]) is None


def event(op: Op, commit: int, key: dict, after: dict | None, before: dict | None = None) -> Event:
    source = SourceInfo("src", "db", "app", "t", Position(commit, 0), Origin.LOG)
    return Event(op, key, before, after, source, 1)


def test_key_changing_update_deletes_the_old_key_at_the_same_position() -> None:
    moved = event(Op.UPDATE, 7, {"a": 2, "b": "x"}, {"a": 2, "b": "x"}, {"a": 1, "b": "x"})
    assert changes_of(moved) == [
        ("app.t", '{"a":2,"b":"x"}', Delta(7, 0, "u", {"a": 2, "b": "x"})),
        ("app.t", '{"a":1,"b":"x"}', Delta(7, 0, "d", None)),
    ]


def test_a_truncate_is_a_floor_for_every_key_of_its_table() -> None:
    """Stored rows and changes positioned before the table's last truncate are gone; what
    comes after it is folded as usual."""
    stored = Stored(3, 0, {"id": 1, "a": "before"})
    assert fold(stored, [], (5, 1)) is None
    assert fold(stored, [upsert(4, a="still before")], (5, 1)) is None
    assert fold(stored, [upsert(5, 2, a="after")], (5, 1)) == Stored(5, 2, {"id": 1, "a": "after"})
    assert fold(None, [upsert(6, op="r", a="dump"), upsert(2, a="old")], (5, 1)) == Stored(
        6, 0, {"id": 1, "a": "dump"}
    )


def test_table_level_events_as_changes() -> None:
    source = SourceInfo("src", "db", "app", "t", Position(8, 3), Origin.LOG)
    truncate = table_event(Op.TRUNCATE, source, 1)
    schema = TableSchema((Column("id", "integer", False, None),), ("id",))
    assert changes_of(truncate) == [("app.t", TABLE_KEY, Delta(8, 3, TRUNCATE, None))]
    assert changes_of(table_event(Op.SCHEMA, source, 2, schema)) == []
    found = [("app.t", Delta(8, 3, "t", None)), ("app.u", Delta(2, 0, "t", None))]
    found.append(("app.t", Delta(9, 1, "t", None)))
    assert floors(found) == {"app.t": (9, 1), "app.u": (2, 0)}


def test_events_not_after_the_folded_position_are_replays() -> None:
    line = (encode(event(Op.CREATE, 3, {"id": 1}, {"id": 1})) + "\n").encode()
    assert parse_line(line, (3, 0)) == []
    assert len(parse_line(line, (2, 9))) == 1


def test_segments_cover_every_complete_line_once(tmp_path: Path) -> None:
    events = [event(Op.CREATE, c, {"id": c}, {"id": c, "pad": "x" * (c % 7)}) for c in range(1, 60)]
    with NdjsonOutput(tmp_path, max_bytes=1000) as out:
        out.write(events[:30], 1)
    segments, offsets = plan_segments(tmp_path, {}, segment_bytes=97)
    lines = [line for s in segments for line in read_segment(s)]
    assert lines == [(encode(e) + "\n").encode() for e in events[:30]]

    with NdjsonOutput(tmp_path, max_bytes=1000) as out:
        out.write(events[30:], 1)
    with event_files(tmp_path)[-1].open("ab") as f:
        f.write(b'{"torn')  # a line still being written is left for the next run
    segments, _ = plan_segments(tmp_path, offsets, segment_bytes=97)
    lines = [line for s in segments for line in read_segment(s)]
    assert lines == [(encode(e) + "\n").encode() for e in events[30:]]


def test_state_round_trips(tmp_path: Path) -> None:
    state = CompactState([9, 1], {"events-000001.ndjson": 120}, {"app.t": "v1"})
    state.save(tmp_path)
    assert CompactState.load(tmp_path) == state
    assert CompactState.load(tmp_path / "missing") == CompactState()
