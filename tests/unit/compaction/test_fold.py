"""The compaction's pure rules: which event of a key wins within a run, what the lake row of a
folded key holds, constant defaults, and how event files are cut."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_dblog.compaction.evolution import (
    AddedColumn,
    constant_default,
    schema_changes,
)
from airflow_provider_dblog.compaction.rules import (
    SCHEMA,
    TABLE_KEY,
    TRUNCATE,
    Change,
    Folded,
    floors,
    fold,
    parse_line,
)
from airflow_provider_dblog.compaction.segments import CompactState, plan_segments, read_segment
from airflow_provider_dblog.compaction.table_fold import lake_row
from airflow_provider_dblog.core.event import Event, Op, Origin, PlainEvent, SourceInfo, table_event
from airflow_provider_dblog.core.event_codec import encode
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.lake.schema import LakeRow
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput, event_files

pytestmark = pytest.mark.unit


def upsert(commit: int, seq: int = 0, op: str = "u", **after: object) -> Change:
    return Change(commit, seq, op, {"id": 1, **after})


def delete(commit: int, seq: int = 0) -> Change:
    return Change(commit, seq, "d", None)


def test_newest_position_wins_whatever_the_arrival_order() -> None:
    changes = [upsert(3, op="c", a="c"), upsert(1, op="c", a="a"), upsert(2, 5, op="c", a="b")]
    assert fold(changes) == Folded(3, 0, "c", {"id": 1, "a": "c"}, False)


def test_a_delete_is_a_tombstone_and_a_later_create_brings_the_key_back() -> None:
    assert fold([upsert(1, op="c", a="a"), delete(2)]) == Folded(2, 0, "d", None, False)
    back = fold([delete(2), upsert(3, op="c", a="n"), upsert(1, op="c", a="old")])
    assert back == Folded(3, 0, "c", {"id": 1, "a": "n"}, False)


def test_duplicates_are_harmless() -> None:
    once = [upsert(1, op="c", a="a", n=1), upsert(2, a="b")]
    assert fold(once + once) == fold(once) == Folded(2, 0, "u", {"id": 1, "a": "b", "n": 1}, False)


def test_an_update_without_an_earlier_image_in_the_run_is_partial() -> None:
    """Its absent columns (unchanged TOAST values) keep the lake's stored values."""
    partial = fold([upsert(2, a="b")])
    assert partial == Folded(2, 0, "u", {"id": 1, "a": "b"}, True)
    row = lake_row({"id": 1}, partial, ("id", "a", "big"), {})  # type: ignore[arg-type]
    assert row == LakeRow({"id": 1, "a": "b"}, 2, 0, "u", keep=frozenset({"big"}))
    whole = fold([upsert(1, op="r", a="a", big="B"), upsert(2, a="b")])
    assert whole == Folded(2, 0, "u", {"id": 1, "a": "b", "big": "B"}, False)


def test_a_dump_read_replaces_the_whole_row() -> None:
    found = fold([upsert(1, op="c", a="a", dropped=1), upsert(2, op="r", a="b")])
    assert found == Folded(2, 0, "r", {"id": 1, "a": "b"}, False)


def test_a_truncate_in_the_run_drops_what_comes_before_it() -> None:
    assert fold([upsert(4, op="c", a="before")], (5, 1)) is None
    assert fold([upsert(4, op="c", a="x"), upsert(5, 2, op="c", a="after")], (5, 1)) == Folded(
        5, 2, "c", {"id": 1, "a": "after"}, False
    )


def test_a_tombstone_row_and_defaults_of_added_columns() -> None:
    assert lake_row({"id": 3}, Folded(7, 1, "d", None, False, 99), ("id",), {}) == LakeRow(
        {"id": 3}, 7, 1, "d", deleted=True, ts_ms=99
    )
    added = {"n": AddedColumn((5, 0), 42)}
    before = lake_row({"id": 1}, Folded(4, 0, "r", {"id": 1}, False), ("id", "n"), added)
    after = lake_row({"id": 2}, Folded(6, 0, "c", {"id": 2}, False), ("id", "n"), added)
    assert before.values == {"id": 1, "n": 42} and after.values == {"id": 2}
    # An update folded without its row's earlier image: the default, not the stored value
    # (the lake may not hold the row at all).
    partial = lake_row({"id": 1}, Folded(4, 0, "u", {"id": 1}, True), ("id", "n", "big"), added)
    assert partial.values == {"id": 1, "n": 42} and partial.keep == {"big"}


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("5", 5),
        ("-1.5", -1.5),
        ("'abc'::text", "abc"),
        ("'it''s'::character varying", "it's"),
        ("'2024-01-01'::date", "2024-01-01"),
        ("true", True),
        ("(0)::numeric(10,2)", 0),
        ("nextval('t_id_seq'::regclass)", None),
        ("now()", None),
        ("CURRENT_TIMESTAMP", None),
        (None, None),
    ],
)
def test_constant_defaults(expression: str | None, value: object) -> None:
    assert constant_default(expression) == value


def event(op: Op, commit: int, key: dict, after: dict | None, before: dict | None = None) -> Event:
    source = SourceInfo("src", "db", "app", "t", Position(commit, 0), Origin.LOG)
    return PlainEvent(op, key, before, after, source, 1)


def line_of(event: Event) -> bytes:
    return (encode(event) + "\n").encode()


def changes_of(event: Event) -> list[tuple[str, str, Change]]:
    return parse_line(line_of(event), {})


def test_key_changing_update_deletes_the_old_key_at_the_same_position() -> None:
    moved = event(Op.UPDATE, 7, {"a": 2, "b": "x"}, {"a": 2, "b": "x"}, {"a": 1, "b": "x"})
    assert changes_of(moved) == [
        ("app.t", '{"a":2,"b":"x"}', Change(7, 0, "u", {"a": 2, "b": "x"})),
        ("app.t", '{"a":1,"b":"x"}', Change(7, 0, "d", None)),
    ]


def test_table_level_events_as_changes() -> None:
    source = SourceInfo("src", "db", "app", "t", Position(8, 3), Origin.LOG)
    truncate = table_event(Op.TRUNCATE, source, 1)
    schema = TableSchema((Column("id", "integer", False, None),), ("id",))
    assert changes_of(truncate) == [("app.t", TABLE_KEY, Change(8, 3, TRUNCATE, None))]
    [(_, key, change)] = changes_of(table_event(Op.SCHEMA, source, 2, schema))
    assert key == TABLE_KEY and change.op == SCHEMA
    assert schema_changes([change]) == [(Position(8, 3), schema)]
    found = [("app.t", Change(8, 3, "t", None)), ("app.u", Change(2, 0, "t", None))]
    found.append(("app.t", Change(9, 1, "t", None)))
    assert floors(found) == {"app.t": (9, 1), "app.u": (2, 0)}


def test_events_not_after_their_tables_progress_are_replays() -> None:
    line = line_of(event(Op.CREATE, 3, {"id": 1}, {"id": 1}))
    assert parse_line(line, {"app.t": (3, 0)}) == []
    assert len(parse_line(line, {"app.t": (2, 9)})) == 1
    assert len(parse_line(line, {"app.other": (9, 9)})) == 1


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
    state = CompactState([9, 1], {"events-000001.ndjson": 120})
    state.save(tmp_path)
    assert CompactState.load(tmp_path) == state
    assert CompactState.load(tmp_path / "missing") == CompactState()
