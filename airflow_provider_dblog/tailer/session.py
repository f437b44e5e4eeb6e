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
types: see `TableSchema.signature`).

Windows. The open ones, and how one fails, are kept in `windows.py`; at a window's hw the
reads' stored columns and transactions are checked and its rows emitted, or a direct window
recorded, in `closer.py`. Read-only windows (`state/positional.py`) have no watermark in the
log: between two transactions, at most every `_POSITIONAL_POLL_S` and at every idle beat, and at
the first boundary after a dump wakes it (`wake`, which also ends a PostgreSQL reader's idle
wait), the session asks the store for them and `positional.py` arms, closes or fails them; the
rows of one it closes go in the gap after the last commit read (`_gap`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Protocol

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
from airflow_provider_dblog.core.lines import LogLines, LogRuns
from airflow_provider_dblog.core.log import (
    Change,
    Idle,
    SchemaDescription,
    TransactionEnd,
    Truncate,
    WatermarkWrite,
)
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import Failed, Reconciler
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.core.schema_versions import SchemaTracker
from airflow_provider_dblog.outputs.base import Output
from airflow_provider_dblog.sources.base import (
    AnnouncesWaits,
    LogReader,
    StampsSchemaVersions,
    Wakeable,
)
from airflow_provider_dblog.state import FencedOut, StateStore
from airflow_provider_dblog.tailer.closer import WindowCloser
from airflow_provider_dblog.tailer.metrics import TailerStats
from airflow_provider_dblog.tailer.positional import PositionalWindows
from airflow_provider_dblog.tailer.settings import TailerSettings
from airflow_provider_dblog.tailer.windows import OpenWindows
from airflow_provider_dblog.tailer.writer import SchemaDurable, Writer

log = logging.getLogger(__name__)


class StopSignal(Protocol):
    """What a session asks at each transaction boundary: whether to end there (a
    `threading.Event`, or the tailer's stop-or-reload)."""

    def is_set(self) -> bool: ...


_BOUNDARIES = (TransactionEnd, Idle)
"""Where a session may stop."""

_POSITIONAL_POLL_S = 0.05
"""How often, at most, the session asks for read-only windows to arm or close while there are
some: a read-only chunk waits about this long twice, and an idle log's beats (`Idle`) come
about as often."""
_QUIET_POLLS = 5
"""While none is about, it asks this many times less often: under a write load each question
is a Redis round trip the log's reading waits for."""

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
        """Where each table's last schema event of this session is (`WindowCloser`)."""
        self._windows = OpenWindows(store.windows, leadership.token, stats)
        self._closer = WindowCloser(
            store=store,
            reader=reader,
            reconciler=self._reconciler,
            writer=self._writer,
            schemas=self._schemas,
            schema_at=self._schema_at,
            schema_change=self._schema_change,
            windows=self._windows,
            token=leadership.token,
            stats=stats,
        )
        self._positional = PositionalWindows(
            store=store,
            reader=reader,
            reconciler=self._reconciler,
            windows=self._windows,
            closer=self._closer,
            token=leadership.token,
        )
        self._acknowledged = 0
        self._handed_commit = 0
        self._next_beat = 0.0
        self._next_checkpoint = 0.0
        self._delivered = 0
        """Every commit below it has been read (0: nothing yet)."""
        self._gap = 0
        """A commit position no transaction has, above every one read and below every one to
        come: where a read-only window's rows go out."""
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
                elif isinstance(item, (LogLines, LogRuns)):  # changes read together
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

    def log_lines(self, item: LogLines | LogRuns) -> None:
        """`change` of each of a run of changes, or of the runs of whole transactions, as one:
        a look at the open windows a run, one hand-over of their lines."""
        if not self._stamped:  # only a reader that stamps versions builds these; in case not
            for event in item.events():
                self.change(Change(event))
            return
        runs = item.runs if isinstance(item, LogRuns) else (item,)
        for run in runs:
            self._reconciler.log_lines(run)
        stats = self._stats
        by_table = stats.events_by_table
        counts = item.counts if type(item) is LogRuns else None  # the reader's, if it counted
        for counted, count in (counts or _counts(runs)).items():
            by_table[counted] = by_table.get(counted, 0) + count
        self._writer.put_lines(item)
        stats.events += len(item)
        stats.last_ts_ms = runs[-1].origin.ts_ms or stats.last_ts_ms
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
                self._windows.fail(opened)
            else:
                self._windows.opened(window.window_id)
            return
        self._windows.ended(window.window_id)
        closed = self._reconciler.high_watermark(window, item.position)
        if isinstance(closed, Failed):
            self._windows.fail(closed)
        else:
            self._closer.close(closed)

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

    # -- table-level events -------------------------------------------------------------------

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
        # a chunk could have read; the check at hw (`WindowCloser`) still compares them.
        self._table_event(event, ends_windows=known.version > 1 or after_ddl)
        self._writer.put(SchemaDurable(known))
        self._schema_at[table] = position

    def _table_event(self, event: Event, *, ends_windows: bool = True) -> None:
        """Emit a table-level event at once; the windows of its table it ends are retried."""
        for failed in self._reconciler.table_event(event) if ends_windows else ():
            self._windows.ended(failed.window.window_id)
            self._windows.fail(failed)
        self._writer.put(event)
        self._stats.events += 1
        self._stats.count(event.source.schema, event.source.table, event.op)
        self._stats.caught_up = False

    # -- read-only windows, acknowledgements, housekeeping ------------------------------------

    def _poll_positional(self, now: float) -> None:
        """Ask the store for the read-only windows waiting on this tailer (a commit boundary:
        no transaction is half read) and hand them to `PositionalWindows.move`."""
        if not self._delivered:
            return  # no position read yet to arm at
        self._woken = False  # before asking: a wake from now on is seen next time
        found = self._store.positional.pending()
        quiet = not found and not self._windows.armed
        self._next_poll = now + _POSITIONAL_POLL_S * (_QUIET_POLLS if quiet else 1)
        self._positional.move(found, self._delivered, self._gap)

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
        for window_id, since in list(self._windows.opened_at.items()):
            if now - since > self._settings.window_ttl_s:
                self._windows.ended(window_id)
                expired = self._reconciler.expire(window_id)
                if expired is not None:
                    self._windows.fail(expired)
        self._store.tailer.beat(owner, self._stats.metrics())


def _counts(runs: Sequence[LogLines]) -> dict[tuple[str, str, Op], int]:
    """How many of the runs' events are of each (schema, table, operation)."""
    counts: dict[tuple[str, str, Op], int] = {}
    for run in runs:
        origin, count = run.origin, len(run.keys)
        if run.ops is None and run.tables is None:
            counted = (origin.schema, origin.table_name, run.op)
            counts[counted] = counts.get(counted, 0) + count
            continue
        ops = repeat(run.op, count) if run.ops is None else run.ops  # several operations
        tables = repeat(origin.table, count) if run.tables is None else run.tables  # or tables
        for table, op in zip(tables, ops, strict=True):
            counted = (table.schema, table.name, op)
            counts[counted] = counts.get(counted, 0) + 1
    return counts


class WriterStuck(RuntimeError):
    """The writer thread did not come out of the output in time."""
