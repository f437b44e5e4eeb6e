"""One connected stretch of a leader's work: the log read from the source, reconciled, and handed
to the writer, until the source, Redis or the output goes away, the lease is lost, or `stop`.

A session owns what lives only as long as its connections: the log reader, the reconciler and
its open windows, the writer thread, the fencing token, the schema versions (loaded from the
store, where each is saved once its schema event is durable) and the position acknowledged so
far. Positions are acknowledged to the source and checkpointed, and windows closed, only once
the writer made their events durable.

Table-level events. A truncate and a schema change are emitted at their log position; each ends
the open windows of its table (the reconciler fails them and their chunks are read again). A
schema description becomes an `s` event only if it changes the table's columns (names, order,
types: see `TableSchema.signature`). A chunk read
with other columns than the last schema event of its table says the log has not shown an ALTER
yet (pgoutput describes a table only before its next change): the catalog is asked, and if it
agrees with the read its schema is emitted at hw, just before the rows (a direct dump's rows,
written by the dump, are positioned after hw); otherwise the window fails and the chunk is read
again. A chunk whose parts were read with different columns fails too. (A table the log never
described has no schema to compare with: its rows go out as read.)

Read-only windows (`state/positional.py`) have no watermark in the log: between two
transactions, at most every `_POSITIONAL_POLL_S` and at every idle beat, and at the first
boundary after a dump wakes it (`wake`, which also ends a PostgreSQL reader's idle wait), the
session asks the store for them. It arms a registered one at its read position (lw: every
commit below it read), closes an open one once it has read every commit below the hw its reads
stored, and fails one armed by an earlier session (whose changes since lw this one never saw).
The rows of a window it closes take positions in the gap after the last commit read (`_gap`), at
seqs the store hands out once, so a later tailer closing a window in the same gap places its
rows after them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from airflow_provider_dblog.core.direct import DirectRecord, DumpMode
from airflow_provider_dblog.core.encoded_rows import EncodedRows
from airflow_provider_dblog.core.event import (
    EncodedLogEvent,
    Event,
    Op,
    Origin,
    PlainEvent,
    SourceInfo,
    TableRef,
    table_event,
)
from airflow_provider_dblog.core.lines import LogLines
from airflow_provider_dblog.core.log import (
    Change,
    Idle,
    SchemaDescription,
    TransactionEnd,
    Truncate,
    WatermarkWrite,
)
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import (
    ChunkRows,
    Closed,
    Failed,
    FailureReason,
    Reconciler,
    Window,
)
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.core.schema_versions import SchemaTracker
from airflow_provider_dblog.outputs.base import Output
from airflow_provider_dblog.sources.base import (
    AnnouncesWaits,
    LogReader,
    StampsSchemaVersions,
    Wakeable,
)
from airflow_provider_dblog.state import (
    FencedOut,
    MissingRows,
    PendingWindow,
    StateStore,
    StoredRows,
    WindowState,
)
from airflow_provider_dblog.tailer.metrics import TailerStats
from airflow_provider_dblog.tailer.settings import TailerSettings
from airflow_provider_dblog.tailer.writer import (
    DirectDurable,
    SchemaDurable,
    WindowDurable,
    Writer,
)

log = logging.getLogger(__name__)


class StopSignal(Protocol):
    """What a session asks at each transaction boundary: whether to end there (a
    `threading.Event`, or the tailer's stop-or-reload)."""

    def is_set(self) -> bool: ...


_BOUNDARIES = (TransactionEnd, Idle)

_POSITIONAL_POLL_S = 0.05
"""How often, at most, the session asks for read-only windows to arm or close while there are
some: a read-only chunk waits about this long twice, and an idle log's beats (`Idle`) come
about as often."""
_QUIET_POLLS = 5
"""While none is about, it asks this many times less often: under a write load each question
is a Redis round trip the log's reading waits for."""
"""Where a session may stop."""

_CHANGES_BETWEEN_CHECKS = 63
"""`Session.run` looks at the writer, the durable commit and the clock after every 64th
`Change` in a row (and after every other item)."""


@dataclass(frozen=True, slots=True)
class Leadership:
    """Who leads, with which token: every store write and output write of a session carries it."""

    owner: str
    token: int


class Session:
    """Reads the log with `reader` and writes `output` under `leadership`, until `run` ends.

    `reconciler` builds the session's reconciler from the source name and database: the
    property tests pass deliberately broken ones, to show the histories catch them.
    """

    def __init__(
        self,
        *,
        source_name: str,
        db: str,
        reader: LogReader,
        store: StateStore,
        output: Output,
        leadership: Leadership,
        settings: TailerSettings,
        stats: TailerStats,
        reconciler: Callable[[str, str], Reconciler] = Reconciler,
    ) -> None:
        self._reader = reader
        self._store = store
        self._leadership = leadership
        self._settings = settings
        self._stats = stats
        self._source_name = source_name
        self._db = db
        self._reconciler = reconciler(source_name, db)
        self._schemas = SchemaTracker(
            store.tailer.load_schemas(), resume=store.tailer.load_checkpoint()
        )
        self._writer = Writer(
            output,
            store.windows,
            leadership.token,
            settings,
            schemas=store.tailer,
            directs=store.directs,
            batch_seconds=stats.output_batch_seconds,
            batches_failed=stats.output_batches_failed,
        )
        if isinstance(reader, AnnouncesWaits):
            reader.before_waiting(self._writer.hand_over)
            self._writer.commits_wait_for_hand_over = True
        self._stamped = False
        """The reader builds row events with `self._schemas`' versions: none to stamp here."""
        if isinstance(reader, StampsSchemaVersions):
            reader.use_schema_versions(self._schemas.versions)
            self._stamped = True
        self._schema_at: dict[TableRef, Position] = {}
        """Where each table's last schema event of this session is (`_record_direct`)."""
        self._opened_at: dict[str, float] = {}
        """The windows open now (lw met, not ended), with when their lw was met."""
        self._stats.open_windows = 0
        self._acknowledged = 0
        self._handed_commit = 0
        self._next_beat = 0.0
        self._next_checkpoint = 0.0
        self._delivered = 0
        """Every commit below it has been read (0: nothing yet)."""
        self._gap = 0
        """A commit position no transaction has, above every one read and below every one to
        come: where a read-only window's rows go out."""
        self._armed: set[str] = set()
        """The read-only windows this session armed that are still open."""
        self._arm_from: int | None = None
        """The log's end when this session first looked for read-only windows: it arms none
        before it has read up to there, past whatever an earlier session emitted (a change it
        reads again would drop the chunk's row, and the output would drop the change)."""
        self._next_poll = 0.0
        self._woken = False
        """A dump added or readied a read-only window since the last poll (`wake`)."""

    @property
    def _token(self) -> int:
        return self._leadership.token

    def wake(self) -> None:
        """A dump added or readied a read-only window (any thread): look at the next boundary
        rather than at the next poll, and end the reader's wait for the log if it can."""
        self._woken = True
        if isinstance(self._reader, Wakeable):
            self._reader.wake()

    def run(self, stop: StopSignal) -> None:
        """Until `stop` (at a transaction boundary, everything handed over made durable and
        acknowledged), or until an error ends the session; the writer is stopped either way."""
        self._writer.start()
        changes = 0
        try:
            for item in self._reader.items():
                if isinstance(item, Change):
                    # Nearly every item: the writer's health, the acknowledgement and the
                    # heartbeat are looked at once every `_CHANGES_BETWEEN_CHECKS` in a row
                    # (a hand-over to a failed writer raises its error at once anyway).
                    self.change(item)
                    changes += 1
                    if changes & _CHANGES_BETWEEN_CHECKS:
                        continue
                    self._writer.check()
                elif isinstance(item, LogLines):  # a rows event's changes, checked as one
                    self.log_lines(item)
                    changes += 1
                    if changes & _CHANGES_BETWEEN_CHECKS:
                        continue
                    self._writer.check()
                else:
                    self._writer.check()
                    self._other(item)
                    if isinstance(item, _BOUNDARIES) and stop.is_set():
                        break
                now = time.monotonic()
                if now >= self._next_checkpoint:
                    self._acknowledge_durable(now)
                if now >= self._next_beat:
                    self._next_beat = now + self._settings.heartbeat_s
                    self.housekeeping(now)
            self._writer.finish()
            self._acknowledge_durable(time.monotonic())
        finally:
            self._stats.open_windows = 0  # its windows end with it: the next session drops them
            stopped = self._writer.halt(self._settings.writer_stop_s)
            self._reader.close()
            if not stopped:
                raise WriterStuck(
                    f"the output writer did not stop within {self._settings.writer_stop_s}s "
                    "(stuck in the output); stopping so that no second writer writes beside it"
                )

    def _other(
        self, item: WatermarkWrite | TransactionEnd | Truncate | SchemaDescription | Idle
    ) -> None:
        """Any item but a `Change` (`run` hands those to `change` itself)."""
        if isinstance(item, WatermarkWrite):
            self.watermark(item)
        elif isinstance(item, TransactionEnd):
            self.transaction_end(item)
        elif isinstance(item, Truncate):
            self.truncate(item)
        elif isinstance(item, SchemaDescription):
            self.schema(item)
        else:
            self.idle(item)

    # -- one method per kind of log item -------------------------------------------------------

    def change(self, item: Change) -> None:
        event = item.event
        if not self._stamped:
            version = self._schemas.version(event.table)
            if event.schema_version != version:
                event = PlainEvent(
                    event.op, event.key, event.before, event.after, event.source, version
                )
        self._reconciler.change(event)
        self._writer.put_event(event)
        stats = self._stats
        stats.events += 1
        if type(event) is EncodedLogEvent:  # what its source would say, without building it
            origin = event.origin
            counted = (origin.schema, origin.table_name, event.op)
            ts_ms: int | None = origin.ts_ms
        else:
            source = event.source
            counted = (source.schema, source.table, event.op)
            ts_ms = source.ts_ms
        # `count`, inlined:
        stats.events_by_table[counted] = stats.events_by_table.get(counted, 0) + 1
        stats.last_ts_ms = ts_ms or stats.last_ts_ms
        stats.caught_up = False

    def log_lines(self, item: LogLines) -> None:
        """`change` of each of a run of changes, as one: one look at the open windows, one
        hand-over of their lines, one count."""
        if not self._stamped:  # only a reader that stamps versions builds these; in case not
            for event in item.events():
                self.change(Change(event))
            return
        self._reconciler.log_lines(item)
        self._writer.put_lines(item)
        stats, origin, count = self._stats, item.origin, len(item)
        stats.events += count
        counted = (origin.schema, origin.table_name, item.op)
        stats.events_by_table[counted] = stats.events_by_table.get(counted, 0) + count
        stats.last_ts_ms = origin.ts_ms or stats.last_ts_ms
        stats.caught_up = False

    def truncate(self, item: Truncate) -> None:
        source = self._table_source(item.table, item.position, item.txid, item.ts_ms)
        self._table_event(table_event(Op.TRUNCATE, source, self._schemas.version(item.table)))

    def schema(self, item: SchemaDescription) -> None:
        self._schema_change(
            item.table, item.schema, item.position, item.txid, item.ts_ms, after_ddl=item.after_ddl
        )

    def watermark(self, item: WatermarkWrite) -> None:
        known = self._store.windows.lookup_watermark(item.value)
        if known is None:
            return  # not ours, or a stale value from an earlier run
        window, kind = known
        if kind == "lw":
            if not self._store.windows.open(window.window_id, self._token):
                return  # abandoned by the dump, or already ended
            opened = self._reconciler.low_watermark(window, item.position)
            if isinstance(opened, Failed):
                self._fail(opened)
            else:
                self._opened_at[window.window_id] = time.monotonic()
                self._stats.windows_opened += 1
                self._stats.open_windows = len(self._opened_at)
            return
        self._window_ended(window.window_id)
        closed = self._reconciler.high_watermark(window, item.position)
        if isinstance(closed, Failed):
            self._fail(closed)
            return
        if window.mode is DumpMode.DIRECT:
            self._record_direct(closed)
            return
        self._emit_chunk(closed)

    def transaction_end(self, item: TransactionEnd) -> None:
        self._handed_commit = item.commit
        self._stats.last_commit = item.commit
        self._writer.put_commit(item)
        # The next commit lies above this one by a commit record (PostgreSQL) or a transaction's
        # events (MySQL), so commit + 1 is a position no transaction has.
        self._delivered = self._gap = item.commit + 1
        now = time.monotonic()
        if now >= self._next_poll or self._woken:
            self._poll_positional(now)

    def idle(self, item: Idle) -> None:
        """The reader is at the log's end for now. A server says so between two commits of a
        busy stream too, so the checkpoint still waits for `checkpoint_s`; at an idle log the
        reader's idle items keep coming (a second apart at most), and the next one saves it."""
        self._writer.hand_over()
        drained = self._writer.idle.is_set() and self._writer.durable_commit >= self._handed_commit
        self._stats.caught_up = drained
        now = time.monotonic()
        if drained and item.log_end > self._acknowledged and now >= self._next_checkpoint:
            self._acknowledge(item.log_end, now)
        if item.log_end > self._delivered:
            # Every commit below the log's end is read; none lies at the end less one.
            self._delivered, self._gap = item.log_end, item.log_end - 1
        if now >= self._next_poll or self._woken:
            self._poll_positional(now)

    # -- table-level events, chunks, windows, acknowledgements ---------------------------------

    def _table_source(
        self, table: TableRef, position: Position, txid: int | None, ts_ms: int | None
    ) -> SourceInfo:
        return SourceInfo(
            name=self._source_name,
            db=self._db,
            schema=table.schema,
            table=table.name,
            position=position,
            origin=Origin.LOG,
            txid=txid,
            ts_ms=ts_ms,
        )

    def _schema_change(
        self,
        table: TableRef,
        schema: TableSchema,
        position: Position,
        txid: int | None = None,
        ts_ms: int | None = None,
        *,
        after_ddl: bool = False,
    ) -> None:
        known = self._schemas.observe(table, schema, position)
        if known is None:
            return  # the columns did not change, or this stretch of log was emitted before
        source = self._table_source(table, position, txid, ts_ms)
        event = table_event(Op.SCHEMA, source, known.version, known.schema)
        # A table's first description, unless a DDL statement came with it, changes no columns
        # a chunk could have read; the check at hw (`_emit_chunk`) still compares them.
        self._table_event(event, ends_windows=known.version > 1 or after_ddl)
        self._writer.put(SchemaDurable(known))
        self._schema_at[table] = position

    def _table_event(self, event: Event, *, ends_windows: bool = True) -> None:
        """Emit a table-level event at once; the windows of its table it ends are retried."""
        for failed in self._reconciler.table_event(event) if ends_windows else ():
            self._window_ended(failed.window.window_id)
            self._fail(failed)
        self._writer.put(event)
        self._stats.events += 1
        self._stats.count(event.source.schema, event.source.table, event.op)
        self._stats.caught_up = False

    def _emit_chunk(self, closed: Closed) -> None:
        """Emit a closed window's surviving rows, a stored page at a time: the rows come
        encoded by the reader, so each is dropped or stamped with its position into the page's
        lines, handed to the writer as one item, and no more than a page of the chunk is held
        here at once."""
        window = closed.window
        stored = self._stored_rows(window, "chunk rows are not in the store")
        if stored is None or not self._chunk_columns_known(closed, stored):
            return
        chunk = self._checked(closed, stored, self._schemas.version(window.table))
        if chunk is None:
            return
        if not self._store.windows.claim(window.window_id, self._token):
            return  # the dump abandoned it first: its rows are never emitted
        emitted = 0
        try:
            for rows in self._store.windows.row_slices(stored):
                page = self._reconciler.chunk_page(
                    closed, replace(chunk, rows=rows, emitted_before=emitted)
                )
                if isinstance(page, Failed):  # the checks passed above: not met in practice
                    self._fail(page)
                    return
                if len(page):
                    self._writer.put(page)
                emitted += len(page)
        except MissingRows as exc:
            self._fail(Failed(window, FailureReason.MISSING_CHUNK, str(exc)))
            return
        self._writer.put(WindowDurable(window.window_id))
        self._stats.dump_rows += emitted
        self._stats.windows_closed += 1
        self._count_chunk(window.table, emitted, stored.rows - emitted)

    def _record_direct(self, closed: Closed) -> None:
        """hw of a direct window: no row to fetch or emit. The reads stored only their invisible
        transactions and columns before hw, checked here as for any chunk (a stale read, or one
        with other columns than the table's at hw, fails the window; the catalog's schema that
        agrees with the read is emitted at hw, before the dump's rows, positioned after it);
        then the keys changed inside the window and hw's position are recorded and the window
        closed, in one move, without waiting for the output (`state/direct.py` says why), but
        for a table whose schema event is not durable yet."""
        window = closed.window
        stored = self._stored_rows(window, "the reads' transactions are not in the store")
        if (
            stored is None
            or not self._chunk_columns_known(closed, stored)
            or self._checked(closed, stored, 0) is None
        ):
            return
        record = DirectRecord(
            window.window_id, closed.lw_position, closed.hw_position, closed.changed_keys
        )
        schema_at = self._schema_at.get(window.table)
        if schema_at is not None and schema_at.commit > self._writer.durable_commit:
            # The table's schema event is not durable yet (emitted at this hw, or a moment
            # ago from the log): recorded once it is, so the target has the columns before
            # the dump writes rows read with them, and a tailer that dies first records nothing.
            self._writer.put(DirectDurable(record))
            self._stats.windows_closed += 1
        elif self._store.directs.record(record, self._token):
            self._stats.windows_closed += 1

    def _stored_rows(self, window: Window, missing: str) -> StoredRows | None:
        """What the reads stored for the window (rows aside); None when the window failed
        instead, for `missing` (nothing stored) or rows stored in another format."""
        try:
            stored = self._store.windows.stored_rows(window.window_id)
        except MissingRows as exc:
            missing = str(exc)
            stored = None
        if stored is None:
            self._fail(Failed(window, FailureReason.MISSING_CHUNK, missing))
        return stored

    def _checked(self, closed: Closed, stored: StoredRows, version: int) -> ChunkRows | None:
        """The chunk without its rows once the reconciler's checks pass on it (a stale read,
        rows of another window); None when the window failed instead."""
        chunk = ChunkRows(
            closed.window.window_id,
            stored.key_columns,
            EncodedRows((), ()),
            version,
            stored.invisible_txids,
            snapshot_end=stored.snapshot_end,
        )
        checked = self._reconciler.chunk_events(closed, chunk)
        if isinstance(checked, Failed):
            self._fail(checked)
            return None
        return chunk

    def _count_chunk(self, table: TableRef, emitted: int, dropped: int) -> None:
        stats, counted = self._stats, (table.schema, table.name)
        stats.count(table.schema, table.name, Op.READ, emitted)
        stats.chunk_rows_emitted[counted] = stats.chunk_rows_emitted.get(counted, 0) + emitted
        stats.chunk_rows_dropped[counted] = stats.chunk_rows_dropped.get(counted, 0) + dropped

    def _chunk_columns_known(self, closed: Closed, stored: StoredRows) -> bool:
        """Whether the chunk was read with the columns of the last schema event of its table,
        once the catalog has been asked about an ALTER the log has not shown yet; False when
        the window failed instead. The same check for a sequenced chunk's rows and for a
        direct read's columns (stored beside its invisible transactions)."""
        table = closed.window.table
        known = self._schemas.schema(table)
        if not stored.columns or known is None:
            return True  # nothing to mix, or a table the log has not described yet
        if len(stored.columns) > 1:  # parts read on both sides of an ALTER
            detail = "the chunk's rows were read with different columns"
            self._fail(Failed(closed.window, FailureReason.SCHEMA_CHANGED, detail))
            return False
        (read_with,) = stored.columns
        columns = set(read_with)
        if set(known.names) == columns:
            return True
        now = self._reader.describe(table)
        if set(now.names) != columns:
            detail = (
                f"the chunk was read with columns {sorted(columns)}, {table} has "
                f"{sorted(now.names)} now"
            )
            self._fail(Failed(closed.window, FailureReason.SCHEMA_CHANGED, detail))
            return False
        self._schema_change(table, now, closed.hw_position)
        return True

    def _window_ended(self, window_id: str) -> None:
        """`TailerStats.open_windows` follows every window that opens or ends, not the next
        heartbeat: `dblog_tailer_windows_open` may be scraped at any moment."""
        self._opened_at.pop(window_id, None)
        self._armed.discard(window_id)
        self._stats.open_windows = len(self._opened_at)

    # -- read-only windows ---------------------------------------------------------------------

    def _poll_positional(self, now: float) -> None:
        """Arm, close or fail the read-only windows waiting on this tailer (a commit boundary:
        no transaction is half read)."""
        if not self._delivered:
            return  # no position read yet to arm at
        self._woken = False  # before asking: a wake from now on is seen next time
        found = self._store.positional.pending()
        quiet = not found and not self._armed
        self._next_poll = now + _POSITIONAL_POLL_S * (_QUIET_POLLS if quiet else 1)
        for pending in found:
            window_id = pending.window.window_id
            if pending.state is WindowState.REGISTERED:
                if self._arm_from is None:
                    self._arm_from = self._reader.log_end()
                if self._delivered >= self._arm_from:
                    self._arm(pending)
            elif window_id not in self._armed:
                self._window_ended(window_id)
                detail = "armed before the tailer restarted: its changes since lw were not seen"
                self._fail(Failed(pending.window, FailureReason.HW_WITHOUT_LW, detail))
            elif pending.ready and pending.hw is None:
                detail = "its reads stored no hw: the server did not say where their snapshot lies"
                self._end_armed(pending.window, FailureReason.MISSING_CHUNK, detail)
            elif pending.hw is not None and self._delivered >= pending.hw:
                self._close_positional(pending)

    def _arm(self, pending: PendingWindow) -> None:
        window = pending.window
        if not self._store.positional.arm(window.window_id, self._token, self._delivered):
            return  # abandoned by the dump meanwhile
        opened = self._reconciler.low_watermark(window, Position(self._delivered - 1, 0))
        if isinstance(opened, Failed):
            self._fail(opened)
            return
        self._armed.add(window.window_id)
        self._opened_at[window.window_id] = time.monotonic()
        self._stats.windows_opened += 1
        self._stats.open_windows = len(self._opened_at)

    def _end_armed(self, window: Window, reason: FailureReason, detail: str) -> None:
        """Fail an armed window before its hw: it leaves the reconciler too."""
        self._window_ended(window.window_id)
        self._reconciler.expire(window.window_id)
        self._fail(Failed(window, reason, detail))

    def _close_positional(self, pending: PendingWindow) -> None:
        """hw is behind the read: the window ends in the gap after the last commit read, its
        rows at seqs reserved for them."""
        window = pending.window
        try:
            stored = self._store.windows.stored_rows(window.window_id)
        except MissingRows as exc:
            self._end_armed(window, FailureReason.MISSING_CHUNK, str(exc))
            return
        if stored is None:
            self._end_armed(window, FailureReason.MISSING_CHUNK, "chunk rows are not in the store")
            return
        self._window_ended(window.window_id)
        base = self._store.positional.reserve(self._gap, stored.rows + 1, self._token)
        closed = self._reconciler.high_watermark(window, Position(self._gap, base))
        if isinstance(closed, Failed):
            self._fail(closed)
        elif window.mode is DumpMode.DIRECT:
            self._record_direct(closed)
        else:
            self._emit_chunk(closed)

    def _fail(self, failed: Failed) -> None:
        window_id = failed.window.window_id
        replayed = self._replayed(failed)
        reason = f"{failed.reason}: {failed.detail}"
        self._store.windows.fail(window_id, reason, self._token)
        if replayed:
            log.info("window %s: its hw met again after a restart (%s)", window_id, failed.detail)
            self._stats.windows_replayed += 1
            return
        log.info("window %s failed: %s (%s)", window_id, failed.reason, failed.detail)
        self._stats.windows_failed += 1
        by_reason = self._stats.windows_failed_by_reason
        by_reason[failed.reason] = by_reason.get(failed.reason, 0) + 1

    def _replayed(self, failed: Failed) -> bool:
        """An hw without lw of a window an earlier session opened or ended: a restarted tailer
        re-reads the log from its checkpoint and meets it again. Not a failure to page anyone
        for (an open one is still failed, so that its dump retries the chunk)."""
        if failed.reason is not FailureReason.HW_WITHOUT_LW:
            return False
        status = self._store.windows.state(failed.window.window_id)
        return status is not None and status.state not in (
            WindowState.REGISTERED,
            WindowState.ABANDONED,
        )

    def _acknowledge_durable(self, now: float) -> None:
        durable = self._writer.durable_commit
        if durable > self._acknowledged:
            self._acknowledge(durable, now)

    def _acknowledge(self, commit: int, now: float) -> None:
        """Tell the reader `commit` is durable and save the checkpoint with the reader's resume
        point, under the fence: the next session's reader starts there."""
        self._acknowledged = commit
        self._next_checkpoint = now + self._settings.checkpoint_s
        resume = self._reader.acknowledge(commit)
        self._store.tailer.save_checkpoint(commit, self._token, resume)

    def housekeeping(self, now: float) -> None:
        """Renew the lease, expire windows whose hw never came, beat."""
        owner = self._leadership.owner
        if not self._store.tailer.renew_lease(owner, self._token, self._settings.lease_ttl_ms):
            raise FencedOut(f"tailer {owner} lost its lease (token {self._token})")
        for window_id, since in list(self._opened_at.items()):
            if now - since > self._settings.window_ttl_s:
                self._window_ended(window_id)
                expired = self._reconciler.expire(window_id)
                if expired is not None:
                    self._fail(expired)
        self._store.tailer.beat(owner, self._stats.metrics())


class WriterStuck(RuntimeError):
    """The writer thread did not come out of the output in time."""
