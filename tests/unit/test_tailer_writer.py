"""The tailer's writer thread: what it writes in which batches, and when marks take effect."""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any, cast

import pytest

from airflow_provider_dblog.core.event import Event, Op, Origin, SourceInfo
from airflow_provider_dblog.core.log import TransactionEnd
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.outputs.base import Output
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import _STOP, TailerSettings, _Buffer, _Complete, _Writer

pytestmark = pytest.mark.unit


def event(commit: int, seq: int) -> Event:
    source = SourceInfo("src", "db", "app", "t", Position(commit, seq), Origin.LOG)
    return Event(Op.UPDATE, {"id": seq}, None, {"id": seq}, source, 1)


class Journal(Output):
    """Records every write and every window closed, in the order they happen."""

    def __init__(self) -> None:
        self.entries: list[Any] = []
        self.windows = ClosedWindows(self.entries)

    def write(self, events: Sequence[Event], token: int) -> None:
        self.entries.append([e.position for e in events])

    def close(self) -> None:
        pass


class ClosedWindows:
    """The writer closes windows through `store.windows`: here, into the journal's entries."""

    def __init__(self, entries: list[Any]) -> None:
        self.entries = entries

    def close(self, window_id: str, token: int) -> bool:
        self.entries.append(("closed", window_id))
        return True


def run_writer(items: list[object], batch_events: int) -> tuple[list[Any], _Writer]:
    """All items queued before the writer starts, so its batches do not depend on timing."""
    journal = Journal()
    settings = TailerSettings(batch_events=batch_events, buffer_items=1000)
    writer = _Writer(journal, cast(StateStore, journal), 1, settings)
    for item in [*items, _STOP]:
        writer.queue.put(item)
    writer.run()
    assert writer.error is None
    return journal.entries, writer


def test_a_chunk_handed_as_lists_is_written_as_if_event_by_event() -> None:
    log_before, chunk, log_after = event(1, 0), [event(2, i) for i in range(1, 8)], event(3, 0)
    marks: list[object] = [TransactionEnd(1), _Complete("w1"), TransactionEnd(3)]
    one_by_one = [log_before, marks[0], *chunk, marks[1], log_after, marks[2]]
    as_lists = [log_before, marks[0], chunk[:3], chunk[3:6], chunk[6:], marks[1]]
    as_lists += [log_after, marks[2]]
    for batch_events in (1, 2, 3, 4, 5, 100):
        expected, _ = run_writer(one_by_one, batch_events)
        entries, writer = run_writer(as_lists, batch_events)
        assert entries == expected, batch_events
        assert writer.durable_commit == 3
    entries, _ = run_writer(as_lists, 4)
    assert entries == [
        [Position(1, 0), Position(2, 1), Position(2, 2)],
        [Position(2, 3), Position(2, 4), Position(2, 5), Position(2, 6)],
        [Position(2, 7), Position(3, 0)],
        ("closed", "w1"),
    ]


def test_a_window_is_closed_only_after_its_last_event_is_written() -> None:
    chunk = [event(2, i) for i in range(1, 6)]
    entries, _ = run_writer([chunk, _Complete("w1")], 2)
    assert entries == [
        [Position(2, 1), Position(2, 2)],
        [Position(2, 3), Position(2, 4)],
        [Position(2, 5)],
        ("closed", "w1"),
    ]


def test_the_buffer_is_bounded_by_events_not_items() -> None:
    buffer = _Buffer(5)
    buffer.put([event(1, i) for i in range(4)])
    assert buffer.qsize() == 4 and not buffer.full()
    buffer.put(TransactionEnd(1))
    assert buffer.full()
    with pytest.raises(queue.Full):
        buffer.put(event(2, 0), timeout=0.01)
    assert isinstance(buffer.get_nowait(), list)
    assert buffer.qsize() == 1
    buffer.put([])  # weighs one, like any item, so a waiting reader still sees it
    assert buffer.qsize() == 2
    assert isinstance(buffer.get_nowait(), TransactionEnd)
    assert buffer.get_nowait() == [] and buffer.empty()
