"""The writer thread: the only thing that writes the output, in batches, in hand-over order.

The session hands it events, runs of events as their lines (`Lines`: a page of a chunk, a
binlog rows event's changes) and marks through a bounded buffer; log events one at a time
(`put_event`), which go in as lists of up to `batch_events` too, handed over when the list is
full or before the next other item, so order is kept. A
mark takes effect only once everything handed over before it is durable: `TransactionEnd`
moves the durable commit (what may be acknowledged to the source), `WindowDurable` closes the
window in the store (what lets the dump move its progress), `SchemaDurable` saves a table's
schema and version in the store (what a restarted tailer numbers from), `DirectDurable` records a
direct window whose table's schema event was not durable yet at its hw (what lets the dump write
rows read with that schema's columns).

A writer that fails keeps its error and stops taking items; `put` and `check` raise that error
in the session's thread, so the reader never blocks on a dead writer.
"""

from __future__ import annotations

import operator
import queue
import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from typing import Final, Protocol

from prometheus_client import Histogram

from airflow_provider_dblog.core.direct import DirectRecord
from airflow_provider_dblog.core.encoded_rows import EncodedEvent
from airflow_provider_dblog.core.event import Event
from airflow_provider_dblog.core.lines import Lines, LogLines, LogRuns
from airflow_provider_dblog.core.log import TransactionEnd
from airflow_provider_dblog.core.schema_versions import KnownSchema
from airflow_provider_dblog.outputs.base import Output
from airflow_provider_dblog.tailer.metrics import output_failure
from airflow_provider_dblog.tailer.settings import TailerSettings

_WRITTEN: dict[type, bool] = {}
"""Whether items of a type go to the output (events, runs of lines) or are marks."""

STOP: Final = object()
"""The last item a session hands over when it ends cleanly: write what came before, then end."""

_WAIT_S = 0.2
"""How often a blocked hand-over or an idle writer looks up from its queue."""


@dataclass(frozen=True, slots=True)
class WindowDurable:
    """Close the window once everything handed over before it is durable."""

    window_id: str


@dataclass(frozen=True, slots=True)
class SchemaDurable:
    """Save the schema once everything handed over before it (its event) is durable."""

    known: KnownSchema


@dataclass(frozen=True, slots=True)
class DirectDurable:
    """Record a direct window (and close it) once everything handed over before it is
    durable."""

    record: DirectRecord


class DirectRecorder(Protocol):
    def record(self, record: DirectRecord, token: int) -> bool: ...


class WindowCloser(Protocol):
    def close(self, window_id: str, token: int) -> bool: ...


class SchemaSaver(Protocol):
    def save_schema(self, known: KnownSchema, token: int) -> bool: ...


class WriterStopped(RuntimeError):
    """The writer ended without an error of its own (it was halted) and takes no more items."""


class Buffer(queue.Queue[object]):
    """The hand-over, bounded by what it holds rather than by its items.

    A chunk's events go in as lists of up to `batch_events` (one lock round a list, not one an
    event); a list weighs its length, every other item one, so memory stays bounded as when
    each event was an item of its own (a `put` blocks while the weight is at the bound). A
    list of encoded chunk rows weighs a unit per KiB of their lines if that is more, so wide
    rows are bounded by their bytes, whatever the chunk size.
    """

    def _init(self, maxsize: int) -> None:
        self.queue: deque[tuple[object, int]] = deque()
        self._weight = 0

    def _qsize(self) -> int:
        return self._weight

    def _put(self, item: object) -> None:
        weight = _weight(item)  # once an item: a list of wide rows sums its lines' bytes
        self.queue.append((item, weight))
        self._weight += weight

    def _get(self) -> object:
        item, weight = self.queue.popleft()
        self._weight -= weight
        return item


_LINE = operator.attrgetter("line")


_LOG_LINES = (LogLines, LogRuns)


class _Held(list[object]):
    """The log events `Writer.put_event` and `put_lines` held, handed over as one item that
    weighs `weight`: each event of a `LogLines` counts, as when each was an item."""

    __slots__ = ("weight",)

    weight: int


def _weight(item: object) -> int:
    if isinstance(item, Lines):
        return max(len(item), len(item.data) >> 10)
    if type(item) is _Held:
        return max(1, item.weight)
    if not isinstance(item, list):
        return 1
    if item and type(item[0]) is EncodedEvent:
        return max(len(item), sum(map(len, map(_LINE, item))) >> 10)
    return max(1, len(item))


@dataclass(frozen=True, slots=True)
class Batch:
    items: list[object]
    """Events and marks, in hand-over order."""
    carried: object | None
    """The rest of a list or a page that did not fit: the next batch's start."""
    stop: bool
    """`STOP` was met: write this batch, then end."""


def take_batch(first: object, next_item: Callable[[], object | None], limit: int) -> Batch:
    """Up to `limit` events and marks from `first` on, then from `next_item()` (None: nothing
    more to take now), as when each event of a list was an item of its own. A list or a page
    that does not fit is split; nothing after it is taken. Encoded chunk rows take a unit per
    KiB of their lines rather than one a row (`_fitting`); a run of lines (`Lines`: a page of
    them, a rows event's changes) too."""
    items: list[object] = []
    room = max(1, limit)
    item: object | None = first
    while item is not None:
        if item is STOP:
            return Batch(items, None, True)
        if isinstance(item, Lines):
            taken = max(1, len(item.data) >> 10)
            if taken > room:
                fits, rest = item.cut(room << 10)
                if rest is not None:
                    items.append(fits)
                    return Batch(items, rest, False)
            items.append(item)
            room -= taken
        elif isinstance(item, list):
            count, taken = _fitting(item, room)
            if count < len(item):
                items.extend(item[:count])
                return Batch(items, item[count:], False)
            items.extend(item)
            room -= taken
        else:
            items.append(item)
            room -= 1
        if room <= 0:
            break
        item = next_item()
    return Batch(items, None, False)


def _fitting(item: list[object], room: int) -> tuple[int, int]:
    """How many of the list's events go into a batch with `room` left (at least one) and the
    room the whole list takes if they all do: one an event, but a unit per KiB of lines for
    encoded chunk rows (at least one), so that a chunk of small rows and the log events behind
    it share one write (one fsync), and a batch of wide rows stays about `limit` KiB."""
    if type(item) is _Held and item.weight > len(item):  # some are `LogLines` or `LogRuns`
        events = list(accumulate(len(i) if isinstance(i, _LOG_LINES) else 1 for i in item))
        return max(1, bisect_right(events, room)), events[-1]
    if not item or type(item[0]) is not EncodedEvent:
        return min(len(item), room), len(item)
    ends = list(accumulate(map(len, map(_LINE, item))))
    return max(1, bisect_right(ends, room << 10)), max(1, ends[-1] >> 10)


class Writer(threading.Thread):
    """Writes batches to the output with the leader's fencing token; applies marks once a
    batch is durable."""

    def __init__(
        self,
        output: Output,
        windows: WindowCloser,
        token: int,
        settings: TailerSettings,
        *,
        schemas: SchemaSaver,
        directs: DirectRecorder,
        batch_seconds: Histogram | None = None,
        batches_failed: dict[str, int] | None = None,
    ) -> None:
        super().__init__(name="dblog-writer", daemon=True)
        self._output = output
        self._batch_seconds = batch_seconds
        """Observes how long each output write takes (once per batch)."""
        self._batches_failed = batches_failed
        """Counts each output write that raised, by `output_failure` (`TailerStats`)."""
        self._windows = windows
        self._schemas = schemas
        self._directs = directs
        self._token = token
        self._limit = max(1, settings.batch_events)
        self._queue = Buffer(settings.buffer_items)
        self._halted = threading.Event()
        self._ended = False
        """The thread left `run` (set there: cheaper to look at than `is_alive`)."""
        self._pending = _Held()
        """Log events `put_event` holds, not handed over yet (the session's thread only)."""
        self._room = self._limit
        """How many more items `_pending` takes: `batch_events` less the events beyond the
        first of each `LogLines` it holds and the ends `put_commit` was given."""
        self._end: TransactionEnd | None = None
        """The last transaction end `put_commit` was given, not handed over yet."""
        self.durable_commit = 0
        self.failure: BaseException | None = None
        self.idle = threading.Event()
        """Set when everything handed over so far is written (or the writer failed)."""
        self.idle.set()
        self.commits_wait_for_hand_over = False
        """Set when the session calls `hand_over` each time its reader has read all there
        is for now: `put_commit` then holds ends until that call rather than waking an idle
        writer for every transaction."""

    # -- the session's side -------------------------------------------------------------------

    def put_event(self, event: Event) -> None:
        """Hand a log event over: held in a list handed over once it holds `batch_events`, or
        before the next item `put` or `hand_over` hands over (one lock round a list, not one
        an event)."""
        pending = self._pending
        pending.append(event)
        if len(pending) >= self._room:
            self.hand_over()

    def put_lines(self, lines: LogLines | LogRuns) -> None:
        """Hand a run of log events over as one (`LogLines`, or `LogRuns` of several), held
        with the events `put_event` holds and weighing as many."""
        self._room -= len(lines) - 1
        pending = self._pending
        pending.append(lines)
        if len(pending) >= self._room:
            self.hand_over()

    def put_commit(self, end: TransactionEnd) -> None:
        """Hand a transaction's end over with the events held once `batch_events` are held
        (ends count as events), before the next item `put` hands over, or, unless
        `commits_wait_for_hand_over`, at once if the writer has nothing left to write (its
        next batch starts now). The transactions read while the writer writes thus go out in
        its next batch, one write and one fsync (group commit), and a run of small
        transactions costs one hand-over, not one each. Held ends reach the writer at the
        latest with the session's next `hand_over` (the reader's idle beat, or its announced
        wait: `AnnouncesWaits`). Only the last end held goes: an end says that everything
        before it is durable once written, and the last says it of all the others'."""
        self._end = end
        self._room -= 1
        if len(self._pending) >= self._room or (
            not self.commits_wait_for_hand_over and self.idle.is_set()
        ):
            self.hand_over()

    def put(self, item: object) -> None:
        """Hand an item over after the events held, waiting while the buffer is full, but never
        on a dead writer."""
        self.hand_over()
        self._hand(item)

    def hand_over(self) -> None:
        """Hand over the events `put_event` holds, and the end `put_commit` holds after them."""
        if self._end is not None:
            self._pending.append(self._end)
            self._end = None
        if self._pending:
            pending, self._pending = self._pending, _Held()
            pending.weight = len(pending) + self._limit - self._room
            self._room = self._limit
            self._hand(pending)

    def _hand(self, item: object) -> None:
        while True:
            self.check()
            try:
                self._queue.put(item, timeout=_WAIT_S)
                return
            except queue.Full:
                continue

    def check(self) -> None:
        """Raise the writer's error, if it failed."""
        if self.failure is not None:
            raise self.failure
        if self._ended or self._halted.is_set():
            raise WriterStopped("the writer thread has stopped")

    def finish(self) -> None:
        """Write everything handed over, then end; raises the writer's error if it failed."""
        self.put(STOP)
        while self.is_alive():
            self.join(_WAIT_S)
        if self.failure is not None:
            raise self.failure

    def halt(self, timeout_s: float) -> bool:
        """Stop at the next batch boundary, dropping what is still buffered (it was never
        acknowledged, so it is read again). False if the writer is still inside the output
        after `timeout_s`."""
        self._halted.set()
        if self.ident is not None:
            self.join(timeout_s)
        return not self.is_alive()

    # -- the thread ---------------------------------------------------------------------------

    def run(self) -> None:
        carried: object | None = None
        try:
            while not self._halted.is_set():
                first: object | None = carried if carried is not None else self._next(_WAIT_S)
                if first is None:
                    continue
                self.idle.clear()
                batch = take_batch(first, self._next_now, self._limit)
                carried = batch.carried
                self._flush(batch.items)
                if batch.stop:
                    return
                if carried is None and self._queue.empty():
                    self.idle.set()
        except BaseException as exc:
            self.failure = exc
        finally:
            self._ended = True
            self.idle.set()

    def _next(self, timeout_s: float) -> object | None:
        try:
            return self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def _next_now(self) -> object | None:
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def _flush(self, items: list[object]) -> None:
        events: list[Event | Lines] = []
        marks: list[object] = []
        for item in items:
            written = _WRITTEN.get(type(item))
            if written is None:  # once a type: `isinstance` of the `Event` ABC is a Python call
                written = _WRITTEN[type(item)] = isinstance(item, (Event, Lines))
            if written:
                events.append(item)  # type: ignore[arg-type]
            else:
                marks.append(item)
        if events:
            started = time.perf_counter()
            try:
                self._output.write_items(events, self._token)
            except BaseException as exc:
                if (failed := self._batches_failed) is not None:
                    reason = output_failure(exc)
                    failed[reason] = failed.get(reason, 0) + 1
                raise
            if self._batch_seconds is not None:
                self._batch_seconds.observe(time.perf_counter() - started)
        for item in marks:
            if isinstance(item, TransactionEnd):
                self.durable_commit = max(self.durable_commit, item.commit)
            elif isinstance(item, WindowDurable):
                self._windows.close(item.window_id, self._token)
            elif isinstance(item, SchemaDurable):
                self._schemas.save_schema(item.known, self._token)
            elif isinstance(item, DirectDurable):
                self._directs.record(item.record, self._token)
