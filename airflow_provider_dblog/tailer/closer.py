"""What a session does at a window's hw: check what the dump's reads stored, then emit the
chunk's surviving rows (a sequenced window) or record the window (a direct one).

Both kinds are checked alike, so that a direct read is held to what a sequenced chunk's rows
are: the reconciler's checks (a stale read, rows of another window), and the columns the read
had against the table's last schema event. A chunk read with other columns than that event
says the log has not shown an ALTER yet (pgoutput describes a table only before its next
change): the catalog is asked, and if it agrees with the read its schema is emitted at hw,
just before the rows (a direct dump's rows, written by the dump, are positioned after hw);
otherwise the window fails and the chunk is read again. A chunk whose parts were read with
different columns fails too. (A table the log never described has no schema to compare with:
its rows go out as read.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from airflow_provider_dblog.core.direct import DirectRecord, DumpMode
from airflow_provider_dblog.core.encoded_rows import EncodedRows
from airflow_provider_dblog.core.event import Op, TableRef
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
from airflow_provider_dblog.sources.base import LogReader
from airflow_provider_dblog.state import MissingRows, StateStore, StoredRows
from airflow_provider_dblog.tailer.metrics import TailerStats
from airflow_provider_dblog.tailer.windows import OpenWindows
from airflow_provider_dblog.tailer.writer import DirectDurable, WindowDurable, Writer

SchemaChange = Callable[[TableRef, TableSchema, Position], None]
"""The session's way to emit a table's schema event at a position (`Session._schema_change`)."""


class WindowCloser:
    """Closes a session's windows at their hw, once the reconciler has closed them."""

    def __init__(
        self,
        *,
        store: StateStore,
        reader: LogReader,
        reconciler: Reconciler,
        writer: Writer,
        schemas: SchemaTracker,
        schema_at: Mapping[TableRef, Position],
        schema_change: SchemaChange,
        windows: OpenWindows,
        token: int,
        stats: TailerStats,
    ) -> None:
        self._store = store
        self._reader = reader
        self._reconciler = reconciler
        self._writer = writer
        self._schemas = schemas
        self._schema_at = schema_at
        """Where each table's last schema event of the session is: a direct window of a table
        whose event is not durable yet is recorded behind it."""
        self._schema_change = schema_change
        self._windows = windows
        self._token = token
        self._stats = stats

    def close(self, closed: Closed) -> None:
        if closed.window.mode is DumpMode.DIRECT:
            self._record_direct(closed)
        else:
            self._emit_chunk(closed)

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
                    self._windows.fail(page)
                    return
                if len(page):
                    self._writer.put(page)
                emitted += len(page)
        except MissingRows as exc:
            self._windows.fail(Failed(window, FailureReason.MISSING_CHUNK, str(exc)))
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
            self._windows.fail(Failed(window, FailureReason.MISSING_CHUNK, missing))
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
            self._windows.fail(checked)
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
            self._windows.fail(Failed(closed.window, FailureReason.SCHEMA_CHANGED, detail))
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
            self._windows.fail(Failed(closed.window, FailureReason.SCHEMA_CHANGED, detail))
            return False
        self._schema_change(table, now, closed.hw_position)
        return True
