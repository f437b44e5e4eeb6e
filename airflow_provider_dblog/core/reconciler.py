"""The window reconciler: Algorithm 1 of the DBLog paper, for several windows at once.

A dump reads a chunk of table T between a low watermark (lw) and a high watermark (hw) that it
writes into the source. The log reader meets both. From lw on, every log event of T removes its
key from the chunk; at hw, the chunk rows that remain are emitted, after every log event before hw
and before every log event after it. Log events themselves are emitted at once, never held.

Several windows may be open at once (chunks of disjoint key ranges); each is reconciled on its
own. The reconciler never sees a key range: which keys a chunk holds is decided by the database,
in its collation. It only records which keys of T changed while each window was open.

A table-level event of T (a truncate, a schema change) fails every window of T open when it
comes: the chunk may hold rows the truncate removed, or rows in the other schema. The dump
retries the chunk, reading the table as it is after the event.

Impossible sequences (hw before lw, a duplicate lw or hw, an hw whose lw was never seen because
the tailer restarted inside the window) end that window as `Failed`; the dump retries the chunk
with new watermarks. They never corrupt the output and never raise.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.encoded_rows import (
    DumpLine,
    EncodedRows,
    PageLines,
    changed_key_json,
)
from airflow_provider_dblog.core.event import (
    Event,
    Key,
    Op,
    Origin,
    PlainEvent,
    Row,
    SourceInfo,
    TableRef,
    freeze,
    key_of,
)
from airflow_provider_dblog.core.lines import LogLines
from airflow_provider_dblog.core.position import Position


@dataclass(frozen=True, slots=True)
class Window:
    """A watermark window as the dump registered it: one chunk of one table. A `direct`
    window's rows never reach the tailer: at hw it records what the dump needs instead (see
    `core/direct.py`)."""

    window_id: str
    dump_id: str
    table: TableRef
    mode: DumpMode = DumpMode.SEQUENCED


@dataclass(frozen=True, slots=True)
class ChunkRows:
    """What the dump read for a window, stored before it wrote hw.

    `invisible_txids` names the transactions the read's snapshot did not see. PostgreSQL can make
    a commit visible after a later one (a commit waiting for a synchronous standby is in the log
    but not yet visible); if one of them committed before lw, the read is stale and the window
    fails.

    `rows` are the rows as read, or as the reader encoded them (`EncodedRows`): the tailer
    takes a stored chunk a slice at a time, each slice a `ChunkRows` of its own whose
    `emitted_before` counts the rows the slices before it emitted, so positions go on.

    A read-only window's watermarks are log positions (`state/positional.py`): `hw` is one every
    transaction the read saw commits below; `snapshot_end` one below which the read saw every
    commit, when the server can say (MariaDB's snapshot position). A window opened at an lw
    past `snapshot_end` read a snapshot older than lw: stale.
    """

    window_id: str
    key_columns: tuple[str, ...]
    rows: Sequence[Row] | EncodedRows
    schema_version: int
    invisible_txids: frozenset[int] = frozenset()
    emitted_before: int = 0
    hw: int | None = None
    snapshot_end: int | None = None


@dataclass(frozen=True, slots=True)
class _PageWanted(EncodedRows):
    """Encoded rows `chunk_page` hands `chunk_events`: their page of lines comes back in
    `pages` rather than as an event a row."""

    pages: list[PageLines] = field(default_factory=list)


class FailureReason(StrEnum):
    HW_WITHOUT_LW = "hw_without_lw"
    DUPLICATE_LW = "duplicate_lw"
    DUPLICATE_HW = "duplicate_hw"
    STALE_READ = "stale_read"
    EXPIRED = "expired"
    WRONG_CHUNK = "wrong_chunk"
    MISSING_CHUNK = "missing_chunk"
    TRUNCATED = "truncated"
    SCHEMA_CHANGED = "schema_changed"


@dataclass(frozen=True, slots=True)
class Opened:
    window: Window
    lw_position: Position


@dataclass(frozen=True, slots=True)
class Failed:
    window: Window
    reason: FailureReason
    detail: str


@dataclass(frozen=True, slots=True)
class Closed:
    """hw was met: emit `Reconciler.chunk_events(closed, rows)` next, before any later event."""

    window: Window
    lw_position: Position
    hw_position: Position
    changed_keys: frozenset[Key]


@dataclass(slots=True)
class _OpenWindow:
    window: Window
    lw_position: Position
    changed: set[Key] = field(default_factory=set)


class _RecentCommits:
    """Commit positions of the last `capacity` transactions seen, by transaction id.

    An `OrderedDict`, whose oldest entry goes in constant time: a plain dict's first key is
    found by scanning past every entry deleted before it, tens of microseconds a transaction
    once full (at `capacity` transactions, a few seconds of an OLTP load)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._commits: OrderedDict[int, int] = OrderedDict()
        self.last: int | None = None
        """The transaction added last: its next events need no call (`Reconciler.change`)."""

    def add(self, txid: int, commit: int) -> None:
        self.last = txid
        commits = self._commits
        if txid in commits:
            return
        commits[txid] = commit
        if len(commits) > self._capacity:
            commits.popitem(last=False)

    def get(self, txid: int) -> int | None:
        return self._commits.get(txid)


class Reconciler:
    """Tracks open windows and decides what a window's chunk contributes to the output.

    Feed it, in log order: `change(event)` for every log event of a captured table,
    `low_watermark(window, position)` and `high_watermark(window, position)` for the watermark
    writes of registered windows. It is one source's reconciler: `source_name` and `db` go into
    the events it builds for dump rows.
    """

    def __init__(
        self,
        source_name: str,
        db: str,
        *,
        recent_commits: int = 100_000,
        remembered_ends: int = 10_000,
    ) -> None:
        self._source_name = source_name
        self._db = db
        self._open: dict[str, _OpenWindow] = {}
        self._open_by_table: dict[TableRef, list[_OpenWindow]] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        """The windows ended last, oldest first (see `_RecentCommits` for why ordered)."""
        self._remembered_ends = remembered_ends
        self._recent = _RecentCommits(recent_commits)
        self._changed_json: tuple[frozenset[Key], tuple[str, ...], set[bytes] | None] | None = None
        """The last window's changed keys spelled as JSON, kept across its slices."""
        self._dump_line: DumpLine | None = None
        """The envelope of the window whose pages were stamped last (a chunk has many)."""

    # -- log input --------------------------------------------------------------------------

    def change(self, event: Event) -> None:
        """A log event, which the caller emits at once. Its key leaves every open chunk of T."""
        txid = event.txid
        if txid is not None and txid != self._recent.last:
            self._recent.add(txid, event.position.commit)
        # Most log events meet no open window: the table's name is looked up only if any is.
        windows = self._open_by_table.get(event.table) if self._open_by_table else None
        if windows:
            key = event.key_value()
            for open_window in windows:
                open_window.changed.add(key)

    def log_lines(self, lines: LogLines) -> None:
        """`change` of each of a run of log events of one transaction, which the caller emits
        at once: their keys leave every open chunk of their table."""
        origin = lines.origin
        if origin.txid is not None and origin.txid != self._recent.last:
            self._recent.add(origin.txid, lines.commit)
        if not self._open_by_table:
            return
        if lines.tables is not None:  # several tables
            for table, key in zip(lines.tables, lines.keys, strict=True):
                for open_window in self._open_by_table.get(table, ()):
                    open_window.changed.add(tuple(map(freeze, key.values())))
            return
        windows = self._open_by_table.get(origin.table)
        if windows:
            keys = [tuple(map(freeze, key.values())) for key in lines.keys]  # `key_value`'s
            for open_window in windows:
                open_window.changed.update(keys)

    def table_event(self, event: Event) -> list[Failed]:
        """A table-level event (`t`, `s`), which the caller emits at once: every window of its
        table open now fails, to be read again."""
        reason = (
            FailureReason.TRUNCATED if event.op is Op.TRUNCATE else FailureReason.SCHEMA_CHANGED
        )
        what = "truncated" if event.op is Op.TRUNCATE else "changed its columns"
        detail = f"{event.table} {what} at {event.position}, inside the window"
        windows = list(self._open_by_table.get(event.table, ()))
        return [self._fail(w.window, reason, detail) for w in windows]

    def low_watermark(self, window: Window, position: Position) -> Opened | Failed:
        if window.window_id in self._open:
            return self._fail(window, FailureReason.DUPLICATE_LW, f"second lw at {position}")
        if window.window_id in self._ended:
            return Failed(window, FailureReason.DUPLICATE_LW, f"lw at {position} after the end")
        open_window = _OpenWindow(window, position)
        self._open[window.window_id] = open_window
        self._open_by_table.setdefault(window.table, []).append(open_window)
        return Opened(window, position)

    def high_watermark(self, window: Window, position: Position) -> Closed | Failed:
        open_window = self._open.get(window.window_id)
        if open_window is None:
            if window.window_id in self._ended:
                return Failed(window, FailureReason.DUPLICATE_HW, f"hw at {position} after the end")
            self._remember_end(window.window_id)
            return Failed(
                window,
                FailureReason.HW_WITHOUT_LW,
                f"hw at {position} but its lw was not seen (hw before lw, or the tailer "
                "restarted inside the window)",
            )
        self._close(open_window)
        return Closed(window, open_window.lw_position, position, frozenset(open_window.changed))

    def expire(self, window_id: str) -> Failed | None:
        """End an open window whose hw never came (the dump died); its chunk is retried."""
        open_window = self._open.get(window_id)
        if open_window is None:
            return None
        return self._fail(open_window.window, FailureReason.EXPIRED, "hw did not come in time")

    # -- chunk output -----------------------------------------------------------------------

    def chunk_events(self, closed: Closed, chunk: ChunkRows) -> list[Event] | Failed:
        """The chunk rows that survive reconciliation, as `r` events positioned after hw (and
        after the `emitted_before` rows of the chunk's earlier slices). Encoded rows give
        `EncodedEvent`s."""
        failed = self._chunk_failure(closed, chunk)
        if failed is not None:
            return failed
        if isinstance(chunk.rows, EncodedRows):
            page = self._encoded_page(closed, chunk, chunk.rows)
            if isinstance(chunk.rows, _PageWanted):
                chunk.rows.pages.append(page)
                return []
            return page.events()
        # One row costs a few objects, so the loop keeps to locals and positional arguments.
        # Every row's key is checked (a missing key column raises), but only a window in
        # which keys changed needs the hashable key.
        window = closed.window
        key_columns = chunk.key_columns
        changed = closed.changed_keys
        commit, seq = closed.hw_position.commit, closed.hw_position.seq + chunk.emitted_before
        name, db = self._source_name, self._db
        schema, table = window.table.schema, window.table.name
        dump_id, window_id, version = window.dump_id, window.window_id, chunk.schema_version
        read, dump = Op.READ, Origin.DUMP
        events: list[Event] = []
        append = events.append
        for row in chunk.rows:
            if changed and key_of(row, key_columns) in changed:
                continue
            try:
                key_row = {c: row[c] for c in key_columns}
            except KeyError:
                key_of(row, key_columns)  # raises the error a missing key column gets
                raise
            seq += 1
            source = SourceInfo(
                name, db, schema, table, Position(commit, seq), dump, dump_id, window_id
            )
            append(PlainEvent(read, key_row, None, row, source, version))
        return events

    def chunk_page(self, closed: Closed, chunk: ChunkRows) -> PageLines | Failed:
        """`chunk_events` of a slice of encoded rows as the lines of one page rather than an
        event a row: what the tailer hands its writer. It goes through `chunk_events`, so the
        page holds what `chunk_events` decides for the rows (and a reconciler that decides
        otherwise, such as the broken ones the property tests run in production, is caught)."""
        if not isinstance(chunk.rows, EncodedRows):
            raise TypeError("chunk_page takes the rows as their reader encoded them")
        wanted = _PageWanted(chunk.rows.keys, chunk.rows.values)
        decided = self.chunk_events(closed, replace(chunk, rows=wanted))
        if isinstance(decided, Failed):
            return decided
        (page,) = wanted.pages
        return page

    def _chunk_failure(self, closed: Closed, chunk: ChunkRows) -> Failed | None:
        """Why the chunk cannot be emitted (another window's rows, a stale read), if it can't."""
        window = closed.window
        if chunk.window_id != window.window_id:
            return Failed(
                window, FailureReason.WRONG_CHUNK, f"rows belong to window {chunk.window_id}"
            )
        for txid in sorted(chunk.invisible_txids):
            commit = self._recent.get(txid)
            if commit is not None and commit <= closed.lw_position.commit:
                return Failed(
                    window,
                    FailureReason.STALE_READ,
                    f"transaction {txid} committed before lw but was invisible to the read",
                )
        end = chunk.snapshot_end
        if end is not None and closed.lw_position.commit >= end:
            return Failed(
                window,
                FailureReason.STALE_READ,
                f"the read's snapshot ends at {end}, before lw at {closed.lw_position.commit + 1}",
            )
        return None

    def _encoded_page(self, closed: Closed, chunk: ChunkRows, rows: EncodedRows) -> PageLines:
        window, hw = closed.window, closed.hw_position
        line = self._dump_line
        if (
            line is None
            or line.window_id != window.window_id
            or line.commit != hw.commit
            or line.schema_version != chunk.schema_version
        ):
            line = self._dump_line = DumpLine(
                self._source_name,
                self._db,
                window.table,
                window.dump_id,
                window.window_id,
                hw.commit,
                chunk.schema_version,
            )
        first_seq = hw.seq + chunk.emitted_before + 1
        changed = closed.changed_keys
        if not changed:
            return line.page(rows, first_seq)
        spelled = self._spelled(changed, chunk.key_columns)
        if spelled is not None:
            return line.page(rows, first_seq, spelled)
        # A key holding a list or an object: compare each row's key decoded, as a `Key`.
        kept = [
            (key, values)
            for key, values in zip(rows.keys, rows.values, strict=True)
            if key_of(json.loads(key), chunk.key_columns) not in changed
        ]
        return line.page(EncodedRows([k for k, _ in kept], [v for _, v in kept]), first_seq)

    def _spelled(self, changed: frozenset[Key], key_columns: tuple[str, ...]) -> set[bytes] | None:
        cached = self._changed_json
        if cached is None or cached[0] is not changed or cached[1] != key_columns:
            cached = self._changed_json = (
                changed,
                key_columns,
                changed_key_json(changed, key_columns),
            )
        return cached[2]

    # -- introspection ----------------------------------------------------------------------

    def open_windows(self) -> Iterable[tuple[Window, Position]]:
        return ((w.window, w.lw_position) for w in self._open.values())

    # -- internals --------------------------------------------------------------------------

    def _fail(self, window: Window, reason: FailureReason, detail: str) -> Failed:
        open_window = self._open.get(window.window_id)
        if open_window is not None:
            self._close(open_window)
        else:
            self._remember_end(window.window_id)
        return Failed(window, reason, detail)

    def _close(self, open_window: _OpenWindow) -> None:
        window = open_window.window
        del self._open[window.window_id]
        siblings = self._open_by_table[window.table]
        siblings.remove(open_window)
        if not siblings:
            del self._open_by_table[window.table]
        self._remember_end(window.window_id)

    def _remember_end(self, window_id: str) -> None:
        self._ended[window_id] = None
        if len(self._ended) > self._remembered_ends:
            self._ended.popitem(last=False)
