"""The tailer's writer thread: what it writes in which batches, when marks take effect, and
that a writer that fails never leaves the session waiting on it."""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any

import pytest

from airflow_provider_dblog.core.direct import DirectRecord
from airflow_provider_dblog.core.encoded_rows import EncodedEvent, PageLines, encode_rows
from airflow_provider_dblog.core.event import (
    Event,
    LogOrigin,
    Op,
    Origin,
    PlainEvent,
    SourceInfo,
    TableRef,
)
from airflow_provider_dblog.core.lines import LogLines
from airflow_provider_dblog.core.log import TransactionEnd
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import ChunkRows, Closed, Reconciler, Window
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.core.schema_versions import KnownSchema
from airflow_provider_dblog.outputs.base import Output, OutputUnavailable
from airflow_provider_dblog.tailer import TailerSettings
from airflow_provider_dblog.tailer.writer import (
    STOP,
    Buffer,
    DirectDurable,
    SchemaDurable,
    WindowDurable,
    Writer,
    WriterStopped,
    take_batch,
)

pytestmark = pytest.mark.unit


def event(commit: int, seq: int) -> Event:
    source = SourceInfo("src", "db", "app", "t", Position(commit, seq), Origin.LOG)
    return PlainEvent(Op.UPDATE, {"id": seq}, None, {"id": seq}, source, 1)


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
    """The writer closes windows through `store.windows` and saves schemas through
    `store.tailer`: here, into the journal's entries."""

    def __init__(self, entries: list[Any]) -> None:
        self.entries = entries

    def close(self, window_id: str, token: int) -> bool:
        self.entries.append(("closed", window_id))
        return True

    def save_schema(self, known: KnownSchema, token: int) -> bool:
        self.entries.append(("schema", known.table, known.version))
        return True

    def record(self, record: DirectRecord, token: int) -> bool:
        self.entries.append(("recorded", record.window_id))
        return True


def new_writer(output: Journal, settings: TailerSettings) -> Writer:
    """A writer with token 1 whose store moves (windows closed, schemas saved, direct windows
    recorded) go into the output's journal."""
    return Writer(
        output, output.windows, 1, settings, schemas=output.windows, directs=output.windows
    )


def run_writer(items: list[object], batch_events: int) -> tuple[list[Any], Writer]:
    """All items queued before the writer runs, so its batches do not depend on timing."""
    journal = Journal()
    settings = TailerSettings(batch_events=batch_events, buffer_items=1000)
    writer = new_writer(journal, settings)
    for item in [*items, STOP]:
        writer.put(item)
    writer.run()
    assert writer.failure is None
    return journal.entries, writer


def test_a_chunk_handed_as_lists_is_written_as_if_event_by_event() -> None:
    log_before, chunk, log_after = event(1, 0), [event(2, i) for i in range(1, 8)], event(3, 0)
    marks: list[object] = [TransactionEnd(1), WindowDurable("w1"), TransactionEnd(3)]
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
    entries, _ = run_writer([chunk, WindowDurable("w1")], 2)
    assert entries == [
        [Position(2, 1), Position(2, 2)],
        [Position(2, 3), Position(2, 4)],
        [Position(2, 5)],
        ("closed", "w1"),
    ]


def test_a_schema_is_saved_only_after_its_event_is_written_and_before_the_commit_moves() -> None:
    """A restarted tailer numbers from the saved schema: saved early, a lost event would never
    be emitted again; the checkpoint follows the durable commit, so it never passes an unsaved
    schema."""
    schema = TableSchema((Column("id", "integer", False, None),), ("id",))
    known = KnownSchema(TableRef("app", "t"), 2, schema, Position(3, 0))
    items = [event(3, 0), SchemaDurable(known), event(3, 1), TransactionEnd(3)]
    entries, writer = run_writer(items, 10)
    assert entries == [[Position(3, 0), Position(3, 1)], ("schema", TableRef("app", "t"), 2)]
    assert writer.durable_commit == 3


def test_a_direct_window_held_back_is_recorded_only_after_its_schema_event_is_written() -> None:
    """A direct window whose table's schema event was not durable at its hw: its record waits
    for it, so the dump writes rows read with the new columns only into a target that has them."""
    schema = TableSchema((Column("id", "integer", False, None),), ("id",))
    known = KnownSchema(TableRef("app", "t"), 2, schema, Position(4, 0))
    record = DirectRecord("w1", Position(3, 0), Position(4, 0), frozenset())
    items = [event(4, 0), SchemaDurable(known), DirectDurable(record), event(4, 1)]
    entries, _ = run_writer(items, 1)
    assert entries == [
        [Position(4, 0)],
        ("schema", TableRef("app", "t"), 2),
        ("recorded", "w1"),
        [Position(4, 1)],
    ]


def test_the_buffer_is_bounded_by_events_not_items() -> None:
    buffer = Buffer(5)
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


def drain(items: list[object]) -> Any:
    """`next_item` over a list: None once it is empty, as an empty queue answers."""
    pending = list(items)
    return lambda: pending.pop(0) if pending else None


def test_take_batch_fills_up_to_the_limit_and_carries_the_rest_of_a_list() -> None:
    chunk = [event(2, i) for i in range(1, 6)]
    batch = take_batch(event(1, 0), drain([TransactionEnd(1), chunk, event(3, 0)]), 4)
    assert batch.items == [event(1, 0), TransactionEnd(1), chunk[0], chunk[1]]
    assert batch.carried == chunk[2:] and not batch.stop
    rest = take_batch(batch.carried, drain([event(3, 0)]), 4)
    assert rest.items == [*chunk[2:], event(3, 0)] and rest.carried is None


def test_take_batch_stops_at_stop_and_at_an_empty_queue() -> None:
    stopped = take_batch(event(1, 0), drain([STOP, event(2, 0)]), 10)
    assert stopped.items == [event(1, 0)] and stopped.stop and stopped.carried is None
    assert take_batch(STOP, drain([]), 10).stop
    short = take_batch(event(1, 0), drain([]), 10)
    assert short.items == [event(1, 0)] and not short.stop
    assert take_batch([event(1, 0), event(1, 1)], drain([]), 0).items == [event(1, 0)]


def encoded(count: int, width: int) -> list[Event]:
    """A chunk's rows of about `width` bytes each as the tailer hands them over: encoded."""
    rows = [{"id": i, "pad": "x" * width} for i in range(count)]
    closed = Closed(
        Window("w", "d", TableRef("app", "t")), Position(1, 0), Position(2, 0), frozenset()
    )
    events = Reconciler("src", "db").chunk_events(
        closed, ChunkRows("w", ("id",), encode_rows(rows, ("id",)), 1)
    )
    assert isinstance(events, list)
    return events


def test_encoded_chunk_rows_take_a_batch_unit_per_kib() -> None:
    """Small encoded rows and the log events behind them share one write (one fsync); wide
    ones are cut at about `limit` KiB; a buffer holds wide rows by their bytes."""
    small = encoded(1000, 50)  # ~300 bytes a line: ~300 KiB in all
    batch = take_batch(small, drain([TransactionEnd(2), event(3, 0)]), 400)
    assert batch.items == [*small, TransactionEnd(2), event(3, 0)] and batch.carried is None
    wide = encoded(10, 3000)  # ~3 KiB a line
    cut = take_batch(wide, drain([event(3, 0)]), 10)
    assert cut.items == wide[:3] and cut.carried == wide[3:]
    assert take_batch(wide, drain([]), 1).items == wide[:1], "at least one row a batch"
    buffer = Buffer(100)
    buffer.put(wide)
    buffer.put(small[:10])
    assert (
        buffer.qsize() == sum(len(e.line) for e in wide if isinstance(e, EncodedEvent)) // 1024 + 10
    )
    assert buffer.qsize() > 20


def page(count: int, width: int) -> PageLines:
    """A page of a chunk's rows of about `width` bytes each, stamped as the tailer hands it."""
    rows = [{"id": i, "pad": "x" * width} for i in range(count)]
    closed = Closed(
        Window("w", "d", TableRef("app", "t")), Position(1, 0), Position(2, 0), frozenset()
    )
    stamped = Reconciler("src", "db").chunk_page(
        closed, ChunkRows("w", ("id",), encode_rows(rows, ("id",)), 1)
    )
    assert isinstance(stamped, PageLines)
    return stamped


def test_a_page_takes_a_batch_unit_per_kib_and_is_cut_where_the_batch_ends() -> None:
    """A page of small rows and the log events behind it share one write; a wide page is cut
    at a line at about `limit` KiB, its rest the next batch's start; the buffer weighs it as
    many rows or KiB, whichever is more."""
    small = page(1000, 50)
    batch = take_batch(small, drain([TransactionEnd(2), event(3, 0)]), 400)
    assert batch.items == [small, TransactionEnd(2), event(3, 0)] and batch.carried is None
    wide = page(10, 3000)
    cut = take_batch(wide, drain([event(3, 0)]), 10)
    (fits,) = cut.items
    assert isinstance(fits, PageLines) and isinstance(cut.carried, PageLines)
    assert (fits.first, fits.last, cut.carried.first, cut.carried.last) == (1, 3, 4, 10)
    assert fits.data + cut.carried.data == wide.data
    buffer = Buffer(100)
    buffer.put(wide)
    buffer.put(small)
    assert buffer.qsize() == len(wide.data) // 1024 + 1000


def test_pages_reach_an_output_that_takes_events_as_one_event_a_line() -> None:
    stamped = page(5, 10)
    entries, _ = run_writer([event(1, 0), stamped, WindowDurable("w"), event(3, 0)], 3)
    assert entries == [
        [Position(1, 0), *(Position(2, s) for s in range(1, 6))],
        ("closed", "w"),
        [Position(3, 0)],
    ]


class Failing(Journal):
    """An output whose every write fails the way `error` says."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    def write(self, events: Sequence[Event], token: int) -> None:
        raise self.error


@pytest.mark.parametrize("error", [RuntimeError("disk on fire"), OutputUnavailable("gone")])
def test_a_failed_writer_raises_its_error_in_the_session_instead_of_blocking(
    error: BaseException,
) -> None:
    """The reader keeps handing items over a buffer of two: once the writer has died on its
    first write, `put` raises the writer's own error rather than waiting on a full buffer."""
    output = Failing(error)
    writer = new_writer(output, TailerSettings(buffer_items=2))
    writer.start()
    with pytest.raises(type(error), match=str(error)):
        for i in range(10_000):
            writer.put(event(1, i))
    writer.join()
    assert writer.failure is error
    assert writer.idle.is_set()
    assert writer.halt(1.0)


def test_finish_writes_everything_and_halt_drops_what_is_buffered() -> None:
    journal = Journal()
    writer = new_writer(journal, TailerSettings(batch_events=10))
    writer.start()
    writer.put([event(1, 0), event(1, 1)])
    writer.put(TransactionEnd(1))
    writer.finish()
    assert journal.entries == [[Position(1, 0), Position(1, 1)]]
    assert writer.durable_commit == 1

    halted = new_writer(journal, TailerSettings())
    halted.put(event(2, 0))  # buffered before the thread runs: dropped by the halt
    assert halted.halt(1.0)
    halted.start()
    halted.join()
    assert journal.entries == [[Position(1, 0), Position(1, 1)]]
    with pytest.raises(WriterStopped):
        halted.put(event(2, 1))


def test_log_events_are_handed_over_in_lists_in_order_with_every_other_item() -> None:
    """`put_event` holds log events until a list of `batch_events` is full or another item
    is handed over: the writer sees them in the order they were handed, and a list at most
    `batch_events` long."""
    journal = Journal()
    writer = new_writer(journal, TailerSettings(batch_events=3))
    for seq in range(4):
        writer.put_event(event(1, seq))
    writer.put(TransactionEnd(1))
    writer.put_event(event(2, 0))
    writer.hand_over()
    handed = []
    while not writer._queue.empty():
        handed.append(writer._queue.get_nowait())
    assert handed == [
        [event(1, 0), event(1, 1), event(1, 2)],
        [event(1, 3)],
        TransactionEnd(1),
        [event(2, 0)],
    ]
    writer.hand_over()
    assert writer._queue.empty()


def test_transaction_ends_are_held_while_the_writer_writes_and_go_out_in_one_batch() -> None:
    """Group commit: a transaction's end goes to an idle writer at once; while the writer is
    busy, the next transactions wait with their ends and are written as one batch, each end
    taking effect only after its events."""
    journal = Journal()
    writer = new_writer(journal, TailerSettings(batch_events=100))
    writer.put_event(event(1, 1))
    writer.put_commit(TransactionEnd(1))  # idle: handed over at once
    assert writer._queue.get_nowait() == [event(1, 1), TransactionEnd(1)]
    writer.idle.clear()  # as when the writer took that batch and writes it
    for commit in (2, 3, 4):
        writer.put_event(event(commit, 1))
        writer.put_commit(TransactionEnd(commit))
    assert writer._queue.empty()
    writer.put(STOP)  # the next item hands the held ones over first
    writer.run()
    assert writer.failure is None
    assert journal.entries == [[Position(2, 1), Position(3, 1), Position(4, 1)]]
    assert writer.durable_commit == 4


def test_ends_wait_for_the_readers_announced_wait_when_it_announces_them() -> None:
    """With a reader that announces its waits, an idle writer is not woken for each
    transaction: the ends are held until the session's `hand_over` (the reader has read all
    there is for now) or until `batch_events` events and ends are held, then go out in one
    batch, behind their events, as the last end (which says what the others do)."""
    journal = Journal()
    writer = new_writer(journal, TailerSettings(batch_events=6))
    writer.commits_wait_for_hand_over = True
    for commit in (1, 2):
        writer.put_event(event(commit, 1))
        writer.put_commit(TransactionEnd(commit))
    assert writer.idle.is_set() and writer._queue.empty()
    writer.hand_over()  # the reader is about to wait
    assert writer._queue.get_nowait() == [event(1, 1), event(2, 1), TransactionEnd(2)]
    for commit in (3, 4, 5):  # the sixth fills the batch: handed over without a wait
        writer.put_event(event(commit, 1))
        writer.put_commit(TransactionEnd(commit))
    assert writer._queue.get_nowait() == [event(3, 1), event(4, 1), event(5, 1), TransactionEnd(5)]
    for commit in range(6, 12):  # ends alone (transactions of other tables) count as well
        writer.put_commit(TransactionEnd(commit))
    assert writer._queue.get_nowait() == [TransactionEnd(11)]


def test_log_lines_are_held_with_log_events_and_weigh_their_events() -> None:
    """A rows event's `LogLines` is held with the log events as one item that counts as many
    events as it holds: the list is handed over at `batch_events` events, weighs them in the
    buffer, and a batch takes as many of them as fit."""
    journal = Journal()
    writer = new_writer(journal, TailerSettings(batch_events=5))
    origin = LogOrigin("src", "db", TableRef("public", "t"), None, 0)
    keys = [{"id": 1}, {"id": 2}, {"id": 3}]
    lines = LogLines(origin, 1, Op.CREATE, 2, 0, 2, keys, None, keys, b"{}\n" * 3)
    writer.put_event(event(1, 0))
    writer.put_lines(lines)
    assert writer._queue.empty(), "4 events held, below 5"
    writer.put_event(event(3, 0))
    assert writer._queue.qsize() == 5, "handed over at 5 events, and weighs them"
    handed = writer._queue.get_nowait()
    assert handed == [event(1, 0), lines, event(3, 0)]
    batch = take_batch(handed, lambda: None, 2)
    assert batch.items == [event(1, 0)] and batch.carried == [lines, event(3, 0)]
