"""Schema versions: one more per real change, none for a repeat or a replay."""

from __future__ import annotations

import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.core.schema_versions import KnownSchema, SchemaTracker, replayable

pytestmark = pytest.mark.unit

T = TableRef("public", "t")
OTHER = TableRef("public", "other")
ID = Column("id", "integer", False, None)
V1 = TableSchema((ID,), ("id",))
V2 = TableSchema((ID, Column("flag", "integer", True, "7")), ("id",))
V3 = TableSchema((*V2.columns, Column("legacy", "text", True, "'old'")), ("id",))


def test_a_table_starts_at_version_one_and_a_repeat_changes_nothing() -> None:
    tracker = SchemaTracker()
    assert tracker.version(T) == 0 and tracker.schema(T) is None
    first = tracker.observe(T, V1, Position(10, 0))
    assert first == KnownSchema(T, 1, V1, Position(10, 0))
    assert tracker.observe(T, V1, Position(20, 0)) is None
    assert tracker.version(T) == 1 and tracker.version(OTHER) == 0


def test_a_change_takes_the_next_version_and_a_change_back_another() -> None:
    tracker = SchemaTracker()
    tracker.observe(T, V1, Position(10, 0))
    assert tracker.observe(T, V2, Position(20, 1)) == KnownSchema(T, 2, V2, Position(20, 1))
    changed = tracker.observe(T, V1, Position(30, 0))
    assert changed is not None and changed.version == 3
    assert tracker.schema(T) == V1


def test_versions_resume_from_the_store_and_a_replay_changes_nothing() -> None:
    """A restarted tailer reads again from an older checkpoint: descriptions at or before the
    stored schema's position were emitted already, whatever they say."""
    tracker = SchemaTracker([KnownSchema(T, 4, V2, Position(50, 2))])
    assert tracker.version(T) == 4
    assert tracker.observe(T, V1, Position(40, 0)) is None
    assert tracker.observe(T, V2, Position(50, 2)) is None
    assert tracker.version(T) == 4 and tracker.schema(T) == V2
    later = tracker.observe(T, V1, Position(60, 0))
    assert later is not None and later.version == 5


def test_defaults_and_nullability_ride_along_but_change_nothing() -> None:
    """They come from the catalog when the log is read, so a replay may see later ones: only
    names and types, which the log itself carries, make a change."""
    tracker = SchemaTracker()
    tracker.observe(T, V2, Position(10, 0))
    flag_default = TableSchema((ID, Column("flag", "integer", True, "8")), ("id",))
    flag_not_null = TableSchema((ID, Column("flag", "integer", False, "7")), ("id",))
    assert tracker.observe(T, flag_default, Position(11, 0)) is None
    assert tracker.observe(T, flag_not_null, Position(12, 0)) is None
    wider = TableSchema((ID, Column("flag", "bigint", True, "7")), ("id",))
    changed = tracker.observe(T, wider, Position(13, 0))
    assert changed is not None and changed.version == 2


def test_a_replay_stamps_the_version_in_effect_where_the_log_is_read_again() -> None:
    """A tailer restarted from checkpoint 15 after a column was added (v3 at 30) and dropped
    (v4 at 50) reads rows of before the add, with the column, and after the drop again: each
    takes the version it took when first read, so the SQL target knows the column went."""
    history = [
        KnownSchema(T, 2, V2, Position(10, 0)),
        KnownSchema(T, 3, V3, Position(30, 2)),
        KnownSchema(T, 4, V2, Position(50, 0)),
    ]
    tracker = SchemaTracker(history, resume=15)
    assert tracker.version(T) == 2 and tracker.schema(T) == V2
    assert tracker.versions == {T: 2}
    assert tracker.observe(T, V2, Position(20, 0)) is None and tracker.version(T) == 2
    assert tracker.observe(T, V3, Position(30, 2)) is None
    assert tracker.versions == {T: 3} and tracker.schema(T) == V3
    assert tracker.observe(T, V2, Position(50, 0)) is None and tracker.version(T) == 4
    assert tracker.observe(T, V2, Position(60, 0)) is None and tracker.version(T) == 4
    later = tracker.observe(T, V3, Position(70, 0))
    assert later == KnownSchema(T, 5, V3, Position(70, 0))


def test_a_replay_past_the_last_schema_without_its_description_catches_up() -> None:
    """The last schema was emitted at a chunk's hw (the catalog asked): the replay's next
    description of the same columns comes later and puts the tracker at the latest again."""
    tracker = SchemaTracker(
        [KnownSchema(T, 1, V1, Position(10, 0)), KnownSchema(T, 2, V2, Position(30, 0))],
        resume=20,
    )
    assert tracker.version(T) == 1
    assert tracker.observe(T, V2, Position(40, 0)) is None
    assert tracker.version(T) == 2 and tracker.schema(T) == V2


def test_without_a_checkpoint_or_before_every_kept_schema() -> None:
    """No checkpoint: the latest is in effect. A checkpoint older than every schema kept: the
    version before the first, its columns unknown (rows go out as read)."""
    history = [KnownSchema(T, 3, V1, Position(30, 0)), KnownSchema(T, 4, V2, Position(40, 0))]
    assert SchemaTracker(history).version(T) == 4
    before = SchemaTracker(history, resume=20)
    assert before.version(T) == 2 and before.schema(T) is None
    first = SchemaTracker([KnownSchema(T, 1, V1, Position(30, 0))], resume=20)
    assert first.version(T) == 0 and first.schema(T) is None


def test_the_store_keeps_what_a_replay_from_the_checkpoint_can_meet() -> None:
    history = [
        KnownSchema(T, 1, V1, Position(10, 0)),
        KnownSchema(T, 2, V2, Position(20, 4)),
        KnownSchema(T, 3, V3, Position(30, 0)),
    ]
    assert replayable(history, None) == history
    assert replayable(history, 5) == history
    assert replayable(history, 20) == history[1:], "v2 is in effect after every seq of 20"
    assert replayable(history, 29) == history[1:]
    assert replayable(history, 99) == history[2:]
