"""The log tailer: the one writer of the ordered output.

It reads the source's log, feeds the core's `Reconciler`, and hands events in order to a writer
thread through a bounded buffer, so a slow output slows the read but memory stays bounded. It
never waits for a dump: chunk rows are in Redis before their hw is in the log. Positions are
acknowledged to the source, checkpointed, and windows marked complete only after the output has
made their events durable.

Only the lease holder writes: a standby waits for the lease, and a tailer that lost it stops
(its store writes would be refused by the fencing token anyway).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from airflow_provider_dblog.core.event import Event, TableRef
from airflow_provider_dblog.core.log import Change, Idle, LogItem, TransactionEnd, WatermarkWrite
from airflow_provider_dblog.core.reconciler import Closed, Failed, FailureReason, Reconciler
from airflow_provider_dblog.outputs.base import Output, OutputUnavailable
from airflow_provider_dblog.sources.base import LogReader, SourceUnavailable
from airflow_provider_dblog.state import FencedOut, StateStore, StateStoreUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TailerSettings:
    window_ttl_s: float = 120.0
    """An open window whose hw has not come by then expires; the dump retries the chunk."""
    batch_events: int = 2000
    """At most this many events per output write (each write made durable before its marks)."""
    buffer_items: int = 20_000
    """The buffer between the reader and the writer holds about this many events and marks."""
    lease_ttl_ms: int = 10_000
    heartbeat_s: float = 1.0
    reconnect_max_s: float = 30.0


@dataclass
class _Complete:
    """Mark a window complete once everything before it is durable."""

    window_id: str


_STOP = object()


class _Buffer(queue.Queue[object]):
    """The reader's hand-off to the writer, bounded by what it holds rather than by its items.

    A chunk's events go in as lists of up to `batch_events` (one lock round a list, not one an
    event); a list weighs its length, every other item one, so memory stays bounded as when
    each event was an item of its own (a `put` blocks while the weight is at the bound).
    """

    def _init(self, maxsize: int) -> None:
        super()._init(maxsize)
        self._weight = 0

    def _qsize(self) -> int:
        return self._weight

    def _put(self, item: object) -> None:
        super()._put(item)
        self._weight += _weight(item)

    def _get(self) -> object:
        item = super()._get()
        self._weight -= _weight(item)
        return item


def _weight(item: object) -> int:
    return max(1, len(item)) if isinstance(item, list) else 1


@dataclass
class _Stats:
    events: int = 0
    dump_rows: int = 0
    last_commit: int = 0
    last_ts_ms: int = 0
    caught_up: bool = False
    """The source had nothing more to send and everything handed over was durable."""
    windows_closed: int = 0
    windows_failed: int = 0
    started: float = field(default_factory=time.monotonic)


class _Writer(threading.Thread):
    """Writes batches to the output; applies commit and window marks once a batch is durable."""

    def __init__(self, output: Output, store: StateStore, token: int, settings: TailerSettings):
        super().__init__(name="dblog-writer", daemon=True)
        self._output = output
        self._store = store
        self._token = token
        self._settings = settings
        self.queue: queue.Queue[object] = _Buffer(settings.buffer_items)
        """Events, lists of a chunk's events, `TransactionEnd` and `_Complete` marks, `_STOP`."""
        self.durable_commit = 0
        self.error: BaseException | None = None
        self.idle = threading.Event()

    def run(self) -> None:
        limit = max(1, self._settings.batch_events)
        carried: list[object] | None = None
        """The rest of a list of events that did not fit into the last batch: the next one's
        start (nothing after it was taken from the queue)."""
        try:
            while True:
                item = self.queue.get() if carried is None else carried
                carried = None
                if item is _STOP:
                    return
                self.idle.clear()
                # Up to `limit` events and marks, as when each event was an item of its own.
                batch: list[object] = []
                room = limit
                stop = False
                while True:
                    if item is _STOP:
                        stop = True
                        break
                    if isinstance(item, list):
                        if len(item) > room:
                            batch.extend(item[:room])
                            carried = item[room:]
                            break
                        batch.extend(item)
                        room -= len(item)
                    else:
                        batch.append(item)
                        room -= 1
                    if room <= 0:
                        break
                    try:
                        item = self.queue.get_nowait()
                    except queue.Empty:
                        break
                self._flush(batch)
                if stop:
                    return
                if carried is None and self.queue.empty():
                    self.idle.set()
        except BaseException as exc:
            self.error = exc
            self.idle.set()

    def _flush(self, batch: list[object]) -> None:
        events = [i for i in batch if isinstance(i, Event)]
        if events:
            self._output.write(events, self._token)
        for item in batch:
            if isinstance(item, TransactionEnd):
                self.durable_commit = max(self.durable_commit, item.commit)
            elif isinstance(item, _Complete):
                self._store.windows.close(item.window_id, self._token)


class Tailer:
    """Runs one source's tailer until `stop` is set.

    `open_reader()` opens the log from where the source keeps it (PostgreSQL: the slot's
    confirmed flush position), so a restarted tailer re-reads what was not acknowledged.
    `output` is an open output, or a function that opens one: then it is opened only once this
    tailer holds the lease (a standby must not take, e.g., the NDJSON directory's lock) and
    closed when `run` returns.
    """

    def __init__(
        self,
        source_name: str,
        db: str,
        open_reader: Callable[[], LogReader],
        store: StateStore,
        output: Output | Callable[[], Output],
        owner: str,
        settings: TailerSettings | None = None,
    ) -> None:
        self._source_name = source_name
        self._db = db
        self._open_reader = open_reader
        self._store = store
        self._open_output = output
        self._output: Output | None = output if isinstance(output, Output) else None
        self._owner = owner
        self._settings = settings or TailerSettings()
        self.stats = _Stats()

    def start(self, stop: threading.Event, ready_timeout_s: float = 30.0) -> threading.Thread:
        """`run(stop)` in a daemon thread, returned once a tailer of this source has beaten
        (it holds the lease and reads): for the demo and tests, which need it up first."""
        thread = threading.Thread(target=self.run, args=(stop,), name="dblog-tailer", daemon=True)
        thread.start()
        deadline = time.monotonic() + ready_timeout_s
        while self._store.tailer.health() is None:
            if not thread.is_alive():
                raise RuntimeError(f"the tailer of {self._source_name} stopped before it beat")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the tailer of {self._source_name} did not beat in time")
            time.sleep(0.05)
        return thread

    def run(self, stop: threading.Event) -> None:
        """Lead while holding the lease; after losing it, wait again as a standby."""
        while not stop.is_set():
            token = self._wait_for_lease(stop)
            if token is None:
                return
            try:
                self._lead(stop, token)
            except FencedOut as exc:
                log.warning("%s; waiting for the lease again as a standby", exc)

    def _lead(self, stop: threading.Event, token: int) -> None:
        log.info("tailer %s holds the lease (token %d)", self._owner, token)
        delay = 0.5
        opened_here = self._output is None
        try:
            if self._output is None:
                assert not isinstance(self._open_output, Output)
                self._output = self._open_output()
            while not stop.is_set():
                try:
                    self._run_session(stop, token)
                    return
                except SourceUnavailable as exc:
                    log.warning("source unavailable (%s); reconnecting in %.1fs", exc, delay)
                except StateStoreUnavailable as exc:
                    log.warning("state store unavailable (%s); reconnecting in %.1fs", exc, delay)
                except OutputUnavailable as exc:
                    log.warning("output unavailable (%s); retrying in %.1fs", exc, delay)
                if stop.wait(delay):
                    return
                delay = min(delay * 2, self._settings.reconnect_max_s)
                self._renew(token)
        finally:
            if opened_here and self._output is not None:
                self._output.close()
                self._output = None
            with contextlib.suppress(StateStoreUnavailable):
                self._store.tailer.release_lease(self._owner, token)

    # -- one connected session ----------------------------------------------------------------

    def _run_session(self, stop: threading.Event, token: int) -> None:
        reconciler = Reconciler(self._source_name, self._db)
        assert self._output is not None
        writer = _Writer(self._output, self._store, token, self._settings)
        writer.start()
        reader = self._open_reader()
        opened_at: dict[str, float] = {}
        schema_versions: dict[TableRef, int] = {}
        acknowledged = 0
        handed_commit = 0
        next_beat = 0.0
        try:
            for item in self._items(reader, stop):
                if writer.error is not None:
                    raise writer.error
                if isinstance(item, Change):
                    event = item.event
                    reconciler.change(event)
                    schema_versions[event.table] = event.schema_version
                    writer.queue.put(event)
                    self.stats.events += 1
                    self.stats.last_ts_ms = event.source.ts_ms or self.stats.last_ts_ms
                    self.stats.caught_up = False
                elif isinstance(item, WatermarkWrite):
                    self._watermark(item, reconciler, writer, token, opened_at, schema_versions)
                elif isinstance(item, TransactionEnd):
                    handed_commit = item.commit
                    self.stats.last_commit = item.commit
                    writer.queue.put(item)
                elif isinstance(item, Idle):
                    drained = writer.idle.is_set() and writer.durable_commit >= handed_commit
                    self.stats.caught_up = drained
                    if drained and item.log_end > acknowledged:
                        reader.acknowledge(item.log_end)
                        acknowledged = item.log_end
                if writer.durable_commit > acknowledged:
                    acknowledged = writer.durable_commit
                    reader.acknowledge(acknowledged)
                    self._store.tailer.save_checkpoint(acknowledged, token)
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + self._settings.heartbeat_s
                    self._housekeeping(reconciler, token, opened_at, now)
            writer.queue.put(_STOP)
            writer.join()
            if writer.error is not None:
                raise writer.error
            if writer.durable_commit > acknowledged:
                reader.acknowledge(writer.durable_commit)
                self._store.tailer.save_checkpoint(writer.durable_commit, token)
        finally:
            if writer.is_alive():
                writer.queue.put(_STOP)
            reader.close()

    def _items(self, reader: LogReader, stop: threading.Event) -> Iterator[LogItem]:
        for item in reader.items():
            yield item
            if stop.is_set() and isinstance(item, TransactionEnd | Idle):
                return

    def _watermark(
        self,
        item: WatermarkWrite,
        reconciler: Reconciler,
        writer: _Writer,
        token: int,
        opened_at: dict[str, float],
        schema_versions: dict[TableRef, int],
    ) -> None:
        known = self._store.windows.lookup_watermark(item.value)
        if known is None:
            return  # not ours, or a stale value from an earlier run
        window, kind = known
        if kind == "lw":
            if not self._store.windows.open(window.window_id, token):
                return  # abandoned by the dump, or already ended
            result = reconciler.low_watermark(window, item.position)
            if isinstance(result, Failed):
                self._fail(result, token)
            else:
                opened_at[window.window_id] = time.monotonic()
            return
        opened_at.pop(window.window_id, None)
        closed = reconciler.high_watermark(window, item.position)
        if isinstance(closed, Failed):
            self._fail(closed, token)
            return
        self._emit_chunk(closed, reconciler, writer, token, schema_versions)

    def _emit_chunk(
        self,
        closed: Closed,
        reconciler: Reconciler,
        writer: _Writer,
        token: int,
        schema_versions: dict[TableRef, int],
    ) -> None:
        window = closed.window
        chunk = self._store.windows.rows(window.window_id)
        if chunk is None:
            missing = Failed(window, FailureReason.MISSING_CHUNK, "chunk rows are not in the store")
            self._fail(missing, token)
            return
        version = schema_versions.get(window.table, chunk.schema_version)
        events = reconciler.chunk_events(closed, replace(chunk, schema_version=version))
        if isinstance(events, Failed):
            self._fail(events, token)
            return
        if not self._store.windows.claim(window.window_id, token):
            return  # the dump abandoned it first: its rows are never emitted
        step = max(1, self._settings.batch_events)
        for start in range(0, len(events), step):
            writer.queue.put(events[start : start + step])
        writer.queue.put(_Complete(window.window_id))
        self.stats.dump_rows += len(events)
        self.stats.windows_closed += 1

    def _fail(self, failed: Failed, token: int) -> None:
        log.info("window %s failed: %s (%s)", failed.window.window_id, failed.reason, failed.detail)
        self.stats.windows_failed += 1
        self._store.windows.fail(
            failed.window.window_id, f"{failed.reason}: {failed.detail}", token
        )

    def _housekeeping(
        self, reconciler: Reconciler, token: int, opened_at: dict[str, float], now: float
    ) -> None:
        if not self._store.tailer.renew_lease(self._owner, token, self._settings.lease_ttl_ms):
            raise FencedOut(f"tailer {self._owner} lost its lease (token {token})")
        for window_id, since in list(opened_at.items()):
            if now - since > self._settings.window_ttl_s:
                del opened_at[window_id]
                expired = reconciler.expire(window_id)
                if expired is not None:
                    self._fail(expired, token)
        lag_ms = 0
        if self.stats.last_ts_ms and not self.stats.caught_up:
            lag_ms = int(time.time() * 1000) - self.stats.last_ts_ms
        self._store.tailer.beat(
            self._owner,
            {
                "events": self.stats.events,
                "dump_rows": self.stats.dump_rows,
                "last_commit": self.stats.last_commit,
                "lag_ms": max(0, lag_ms),
                "open_windows": len(opened_at),
                "windows_closed": self.stats.windows_closed,
                "windows_failed": self.stats.windows_failed,
            },
        )

    # -- lease --------------------------------------------------------------------------------

    def _wait_for_lease(self, stop: threading.Event) -> int | None:
        ttl = self._settings.lease_ttl_ms
        standby = False
        while not stop.is_set():
            try:
                token = self._store.tailer.acquire_lease(self._owner, ttl)
            except StateStoreUnavailable as exc:
                log.warning("state store unavailable (%s); cannot take the lease yet", exc)
                token = None
            if token is not None:
                return token
            if not standby:
                standby = True
                log.info("tailer %s is a standby: another tailer holds the lease", self._owner)
            stop.wait(ttl / 4000)
        return None

    def _renew(self, token: int) -> None:
        """Before reconnecting: still the leader? (Redis may still be down: try again later.)"""
        with contextlib.suppress(StateStoreUnavailable):
            if not self._store.tailer.renew_lease(self._owner, token, self._settings.lease_ttl_ms):
                raise FencedOut(f"tailer {self._owner} lost its lease (token {token})")
