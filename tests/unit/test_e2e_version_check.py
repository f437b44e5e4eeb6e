"""The end-to-end tests' stale-row check (`versions_back`) on hand-built event streams: it
catches the stale chunk row that the position and final-state checks let through."""

from __future__ import annotations

from airflow_provider_dblog.core.event import Event, Op, Origin, PlainEvent, Row, SourceInfo
from airflow_provider_dblog.core.position import Position
from tests.integration.e2e_support import (
    VERSION_COLUMN,
    backwards,
    materialize,
    row_key,
    versions_back,
)


def event(commit: int, op: Op, key: int, version: int | None, origin: Origin = Origin.LOG) -> Event:
    source = SourceInfo("src", "db", "public", "accounts", Position(commit, 0), origin)
    after: Row | None = None
    if op is not Op.DELETE:
        after = {"id": key, "owner": f"v{version}"}
        if version is not None:
            after[VERSION_COLUMN] = version
    return PlainEvent(op, {"id": key}, None, after, source, 1)


def test_a_stale_chunk_row_later_overwritten_is_seen_by_its_version_only() -> None:
    """Key 1 is written at versions 3 and 5; a chunk row read before version 5 committed (a
    stale read) is emitted after it; then the key is written again at 7. Positions still go up
    and the final state is right, so only the versions show the stale row."""
    events = [
        event(10, Op.READ, 2, None, Origin.DUMP),
        event(11, Op.UPDATE, 1, 3),
        event(12, Op.UPDATE, 1, 5),
        event(13, Op.READ, 1, 3, Origin.DUMP),
        event(14, Op.UPDATE, 1, 7),
    ]
    assert backwards(events) == []
    assert materialize(events)[row_key("accounts", [1])][VERSION_COLUMN] == 7
    problems = versions_back(events)
    assert len(problems) == 1
    assert "from version 5 back to 3" in problems[0] and "dump" in problems[0]


def test_a_stale_row_after_a_delete_goes_back_to_the_version_stamped_before_it() -> None:
    events = [
        event(10, Op.CREATE, 1, 2),
        event(11, Op.UPDATE, 1, 4),  # the writer's stamp just before the delete
        event(11, Op.DELETE, 1, None),
        event(12, Op.READ, 1, 2, Origin.DUMP),
        event(13, Op.CREATE, 1, 9),
    ]
    assert versions_back(events) == ["('accounts', '[1]') went from version 4 back to 2 "
                                     "(dump event at [12, 0])"]  # fmt: skip


def test_seeded_rows_duplicates_and_newer_rows_pass() -> None:
    """Rows written before the workload have no version (0); a row written again unchanged
    (at least once delivery) and a dump row newer than the log's are in order."""
    events = [
        event(10, Op.READ, 1, None, Origin.DUMP),
        event(11, Op.UPDATE, 1, 3),
        event(11, Op.UPDATE, 1, 3),
        event(12, Op.READ, 1, 4, Origin.DUMP),
        event(13, Op.DELETE, 1, None),
        event(14, Op.CREATE, 1, 6),
        event(15, Op.READ, 2, None, Origin.DUMP),
        event(16, Op.UPDATE, 2, 1),
    ]
    assert versions_back(events) == []
