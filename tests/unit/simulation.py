"""A model of DBLog's moving parts around the pure core, for property-based tests.

A source database (tables as dicts), its change log (a list of committed transactions and
watermark writes), dumps that plan chunks with `TablePlanner` and read them between watermarks
(a filtered dump's chunks read only the rows matching its filter, one of `FILTERS`),
the window states they share with the tailer (`ModelWindows`, the state machine of
`state.WindowStore` and `state.PositionalWindowStore`), and `ModelTailer`, a synchronous model of
the production `Session`. The histories in `histories.py` drive these, and drive the production
`Session` with the same `Source` and `Dump` (tests/integration/tailer/test_properties.py).

Read-only dumps (`Dump.read_only`) write no watermark: the tailer arms their windows at its read
position between two transactions, the read stores its rows with an hw taken from the source's
log position (`Snapshot` says how), and the tailer closes the window once it has read every
commit below hw, its rows positioned in the gap after the last commit it read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from airflow_provider_dblog.core.direct import DirectRecord, DumpMode
from airflow_provider_dblog.core.dump_plan import Chunk, DumpKind, TablePlanner, TableProgress
from airflow_provider_dblog.core.event import (
    Event,
    Key,
    Op,
    Origin,
    PlainEvent,
    SourceInfo,
    TableRef,
)
from airflow_provider_dblog.core.log import Change, LogItem, TransactionEnd, WatermarkWrite
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import ChunkRows, Closed, Failed, Reconciler, Window

TABLE_A = TableRef("app", "accounts")  # key (id)
TABLE_B = TableRef("app", "orders")  # key (region, n)
TABLE_C = TableRef("app", "invoices")  # key (id): the same key values as accounts
TABLES = (TABLE_A, TABLE_B, TABLE_C)
KEY_COLUMNS = {TABLE_A: ("id",), TABLE_B: ("region", "n"), TABLE_C: ("id",)}
SOURCE_NAME, DB = "sim", "db"

WriteKind = Literal["upsert", "delete", "move"]

Snapshot = Literal["invisible", "exact"]
"""How a read-only dump's read says where its snapshot lies (`sources.base.ReadSnapshot`):
`invisible` as PostgreSQL's, hw the log's end read after the snapshot, the committed
transactions the read missed named; `exact` as MariaDB's, a snapshot of every commit below a
log position, which is hw and `snapshot_end` both, and nothing named."""
RowOp = tuple[WriteKind, TableRef, Key, Key]
"""One row operation of a transaction: kind, table, key, and the key a `move` moves the row to
(ignored by the other kinds)."""


FILTERS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "v % 2 = 0": lambda row: row["v"] % 2 == 0,
    "v % 2 = 1": lambda row: row["v"] % 2 == 1,
    "v % 3 = 0": lambda row: row["v"] % 3 == 0,
}
"""The filters a dump may carry (`Chunk.where`), as the model source evaluates them. Every write
of a row gives it the next version of the source, so a write may flip whether it matches."""


def matches(where: str | None, row: dict[str, Any]) -> bool:
    """Whether `row` is one a chunk with filter `where` (None: no filter) reads."""
    return where is None or FILTERS[where](row)


def row_for(table: TableRef, key: Key, version: int) -> dict[str, Any]:
    columns = KEY_COLUMNS[table]
    row: dict[str, Any] = dict(zip(columns, key, strict=True))
    row["v"] = version
    return row


@dataclass
class Transaction:
    txid: int
    commit: int
    changes: list[tuple[Op, TableRef, Key, dict[str, Any] | None, dict[str, Any] | None]]


@dataclass
class Watermark:
    value: str
    commit: int


LogEntry = Transaction | Watermark


def log_items(entry: LogEntry) -> list[LogItem]:
    """What a log reader hands the tailer for one log entry, its commit boundary last."""
    if isinstance(entry, Watermark):
        return [
            WatermarkWrite(entry.value, Position(entry.commit, 0)),
            TransactionEnd(entry.commit),
        ]
    items: list[LogItem] = []
    for seq, (op, table, key, before, after) in enumerate(entry.changes):
        source = SourceInfo(
            SOURCE_NAME,
            DB,
            table.schema,
            table.name,
            Position(entry.commit, seq),
            Origin.LOG,
            txid=entry.txid,
        )
        key_row = dict(zip(KEY_COLUMNS[table], key, strict=True))
        items.append(Change(PlainEvent(op, key_row, before, after, source, 1)))
    items.append(TransactionEnd(entry.commit))
    return items


@dataclass
class ChunkRead:
    rows: list[dict[str, Any]]
    invisible_txids: frozenset[int]
    hw: int | None = None
    """A read-only read's: every transaction it saw commits below it."""
    snapshot_end: int | None = None
    """An exact read's: it saw every transaction that commits below it."""


@dataclass
class Source:
    """The database: current table contents, the log of committed changes, and the committed
    transactions a read cannot see yet.

    An invisible transaction is in the log (the tailer meets it) and in `tables`, but a chunk
    read sees its rows as they were before it and names it in `invisible_txids`, as
    `PostgresChunkSource.read_chunk` does. A later write to one of its keys first makes it
    visible, as PostgreSQL's row lock makes that writer wait for it.
    """

    tables: dict[TableRef, dict[Key, dict[str, Any]]] = field(
        default_factory=lambda: {t: {} for t in TABLES}
    )
    log: list[LogEntry] = field(default_factory=list)
    invisible: list[Transaction] = field(default_factory=list)
    versions: dict[tuple[TableRef, Key], list[tuple[int, dict[str, Any] | None]]] = field(
        default_factory=dict
    )
    """Each row's values after every commit that wrote it (None: deleted)."""
    _commit: int = 100
    _txid: int = 1000
    _version: int = 0

    def next_commit(self) -> int:
        self._commit += 10
        return self._commit

    @property
    def log_end(self) -> int:
        """Where the log ends now: every commit below it is in the log, and the next one
        starts just above it (MySQL's `Idle(end - 1)`; PostgreSQL's WAL end likewise lies
        between two commits)."""
        return self._commit + 9

    def write(
        self, ops: tuple[RowOp, ...], *, invisible: bool = False
    ) -> set[tuple[TableRef, Key]]:
        """Commit one transaction (operations that do not apply are skipped); with `invisible`,
        one that chunk reads do not see until `reveal`. A `move` changes a row's primary key,
        which the log shows as a delete of the old key then a create of the new one. Returns
        the rows it wrote."""
        written: set[tuple[TableRef, Key]] = set()
        for _, table, key, to_key in ops:
            written |= {(table, key), (table, to_key)}
        self.invisible = [
            tx
            for tx in self.invisible
            if not any((table, key) in written for _, table, key, _, _ in tx.changes)
        ]
        self._txid += 1
        tx = Transaction(self._txid, 0, [])
        for kind, table, key, to_key in ops:
            rows = self.tables[table]
            self._version += 1
            before = rows.get(key)
            if kind == "upsert":
                after = row_for(table, key, self._version)
                rows[key] = after
                op = Op.UPDATE if before is not None else Op.CREATE
                tx.changes.append((op, table, key, before, after))
            elif before is None:
                continue
            elif kind == "delete":
                del rows[key]
                tx.changes.append((Op.DELETE, table, key, before, None))
            elif to_key not in rows:
                del rows[key]
                moved = row_for(table, to_key, self._version)
                rows[to_key] = moved
                tx.changes.append((Op.DELETE, table, key, before, None))
                tx.changes.append((Op.CREATE, table, to_key, None, moved))
        if tx.changes:
            tx.commit = self.next_commit()
            self.log.append(tx)
            for _, table, key, _, row in tx.changes:
                self.versions.setdefault((table, key), []).append((tx.commit, row))
            if invisible:
                self.invisible.append(tx)
        return written

    def reveal(self) -> None:
        """Every committed transaction becomes visible (the standby answered)."""
        self.invisible.clear()

    def row_at(self, table: TableRef, key: Key, commit: int) -> dict[str, Any] | None:
        """The row as of `commit` (after every transaction committed up to it)."""
        row = None
        for at, after in self.versions.get((table, key), []):
            if at > commit:
                break
            row = after
        return row

    def watermark(self, value: str) -> None:
        self.log.append(Watermark(value, self.next_commit()))

    def read_chunk(self, chunk: Chunk) -> ChunkRead:
        """The chunk as a read sees it now, and the committed transactions it missed."""
        rows = self.tables[chunk.table]
        if self.invisible:
            rows = dict(rows)
        for tx in reversed(self.invisible):
            for _, table, key, before, _ in reversed(tx.changes):
                if table != chunk.table:
                    continue
                if before is None:
                    rows.pop(key, None)
                else:
                    rows[key] = before
        txids = frozenset(tx.txid for tx in self.invisible)
        return ChunkRead(self._select(rows, chunk), txids)

    def read_positional(self, chunk: Chunk, snapshot: Snapshot) -> ChunkRead:
        """A read-only dump's read: `invisible`, as `read_chunk` with hw the log's end read
        after the snapshot; `exact`, a snapshot of every commit below the first one a read
        cannot see yet (all of them when none), which is its hw and its end."""
        if snapshot == "invisible":  # hw: where the WAL's last commit record ends
            return replace(self.read_chunk(chunk), hw=self._commit + 5)
        missed = min((tx.commit for tx in self.invisible), default=None)
        end = self.log_end if missed is None else missed - 1
        return replace(self.read_at(chunk, end), hw=end, snapshot_end=end)

    def read_at(self, chunk: Chunk, commit: int) -> ChunkRead:
        """The chunk as of `commit` (every transaction committed up to it, none after), with
        no transaction named: what a replica that has applied the log up to there reads."""
        rows = {
            key: row
            for (table, key) in self.versions
            if table == chunk.table
            for row in (self.row_at(table, key, commit),)
            if row is not None
        }
        return ChunkRead(self._select(rows, chunk), frozenset())

    def _select(self, rows: dict[Key, dict[str, Any]], chunk: Chunk) -> list[dict[str, Any]]:
        """The chunk's query: its keys or key range, narrowed by its filter, then its LIMIT."""
        if chunk.keys is not None:
            keys = [k for k in chunk.keys if k in rows and matches(chunk.where, rows[k])]
            return [dict(rows[k]) for k in keys]
        keys = sorted(
            k
            for k in rows
            if (chunk.after is None or k > chunk.after)
            and (chunk.upto is None or k <= chunk.upto)
            and matches(chunk.where, rows[k])
        )
        if chunk.limit is not None:
            keys = keys[: chunk.limit]
        return [dict(rows[k]) for k in keys]

    def max_key(self, table: TableRef) -> Key | None:
        return max(self.tables[table], default=None)

    def split_keys(
        self, table: TableRef, after: Key | None, upto: Key, size: int, n: int
    ) -> list[Key]:
        keys = sorted(k for k in self.tables[table] if (after is None or k > after) and k <= upto)
        return keys[size - 1 :: size][:n]


ENDED = frozenset({"closed", "failed", "abandoned"})


class DumpWindows(Protocol):
    """What a dump does with its windows in the state store (`WindowStore`'s dump side)."""

    def register(self, window: Window, lw: str, hw: str) -> None: ...

    def put_rows(self, window_id: str, chunk: ChunkRows) -> bool: ...

    def state(self, window_id: str) -> str:
        """registered, open, closing, closed, failed or abandoned."""
        ...

    def abandon(self, window_id: str) -> bool: ...

    def add_positional(self, window_id: str) -> None:
        """A read-only window, for the tailer to arm (`PositionalWindowStore.add`)."""
        ...

    def ready(self, window_id: str) -> bool:
        """Its read stored its rows and hw (`PositionalWindowStore.ready`); False if the
        window is no longer open."""
        ...


@dataclass(frozen=True)
class PendingPositional:
    """`state.PendingWindow`: a read-only window the tailer has to arm, close or fail."""

    window: Window
    state: str
    ready: bool
    hw: int | None


class ModelWindows:
    """The window states of `state.WindowStore` and `state.PositionalWindowStore`, in memory:
    the same moves, the same refusals."""

    def __init__(self) -> None:
        self.marks: dict[str, tuple[Window, str]] = {}  # value -> (window, lw|hw)
        self.states: dict[str, str] = {}
        self.chunks: dict[str, ChunkRows] = {}
        self.records: dict[str, DirectRecord] = {}
        self.pending: dict[str, Position] = {}
        """Direct windows recorded whose rows are not committed, with their lws."""
        self.positional: dict[str, Window] = {}
        """The read-only windows not yet seen ended."""
        self.readied: set[str] = set()
        self.last_reserved: tuple[int, int] | None = None
        """`positional:last`: the last seq handed out, at which commit."""

    # -- the dump's side ----------------------------------------------------------------------

    def register(self, window: Window, lw: str, hw: str) -> None:
        self.marks[lw] = (window, "lw")
        self.marks[hw] = (window, "hw")
        self.states[window.window_id] = "registered"

    def put_rows(self, window_id: str, chunk: ChunkRows) -> bool:
        if self.states[window_id] not in ("registered", "open"):
            return False
        self.chunks[window_id] = chunk
        return True

    def state(self, window_id: str) -> str:
        return self.states[window_id]

    def abandon(self, window_id: str) -> bool:
        return self._move(window_id, "abandoned", "registered", "open")

    def add_positional(self, window_id: str) -> None:
        window = next(w for w, _ in self.marks.values() if w.window_id == window_id)
        self.positional[window_id] = window

    def ready(self, window_id: str) -> bool:
        if self.states[window_id] != "open":
            return False
        self.readied.add(window_id)
        return True

    def record_of(self, window_id: str) -> DirectRecord | None:
        return self.records.get(window_id)

    def committed(self, window_id: str) -> None:
        self.pending.pop(window_id, None)

    # -- the tailer's side --------------------------------------------------------------------

    def lookup_watermark(self, value: str) -> tuple[Window, str] | None:
        return self.marks.get(value)

    def rows(self, window_id: str) -> ChunkRows | None:
        return self.chunks.get(window_id)

    def open(self, window_id: str) -> bool:
        return self._move(window_id, "open", "registered")

    def pending_positional(self) -> list[PendingPositional]:
        """`PositionalWindowStore.pending`: those ended leave the set."""
        found = []
        for window_id, window in list(self.positional.items()):
            state = self.states[window_id]
            if state not in ("registered", "open"):
                del self.positional[window_id]
                continue
            ready = window_id in self.readied
            chunk = self.chunks.get(window_id)
            hw = chunk.hw if ready and chunk is not None else None
            found.append(PendingPositional(window, state, ready, hw))
        return found

    def arm(self, window_id: str) -> bool:
        """`PositionalWindowStore.arm`: registered -> open."""
        return self._move(window_id, "open", "registered")

    def reserve(self, commit: int, count: int) -> int:
        """`PositionalWindowStore.reserve`: `count` seqs at `commit` after the returned one,
        never handed out before, whichever tailer asks."""
        base = 0
        if self.last_reserved is not None and self.last_reserved[0] == commit:
            base = self.last_reserved[1] + 1
        self.last_reserved = (commit, base + count)
        return base

    def claim(self, window_id: str) -> bool:
        return self._move(window_id, "closing", "open")

    def close(self, window_id: str) -> bool:
        return self._move(window_id, "closed", "closing")

    def record(self, record: DirectRecord) -> bool:
        """A direct window's hw: open -> closed with its record, one move."""
        if not self._move(record.window_id, "closed", "open"):
            return False
        self.records[record.window_id] = record
        self.pending[record.window_id] = record.lw_position
        return True

    def fail(self, window_id: str) -> bool:
        return self._move(window_id, "failed", "registered", "open", "closing")

    def _move(self, window_id: str, to: str, *allowed: str) -> bool:
        if self.states.get(window_id) not in allowed:
            return False
        self.states[window_id] = to
        if to in ENDED:
            self.chunks.pop(window_id, None)
        return True


class PositionTarget:
    """A target keyed by primary key that keeps, per key, the row with the highest position,
    and a delete as a tombstone (None) with its position until pruned: a lake table, SQL apply
    in monotonic mode. It takes the tailer's output and direct dump rows, in any order."""

    def __init__(self) -> None:
        self.rows: dict[tuple[TableRef, Key], tuple[Position, dict[str, Any] | None]] = {}
        self.taken = 0
        self.pruned = 0

    def apply(self, table: TableRef, key: Key, row: dict[str, Any] | None, at: Position) -> bool:
        held = self.rows.get((table, key))
        if held is not None and held[0] >= at:
            return False
        self.rows[(table, key)] = (at, row)
        return True

    def take(self, output: list[Event]) -> None:
        """The output's events not taken yet, in output order."""
        for event in output[self.taken :]:
            after = None if event.op is Op.DELETE else event.after
            self.apply(event.table, event.key_value(), after, event.position)
        self.taken = len(output)

    def prune(self, before: Position) -> None:
        for where, (at, row) in list(self.rows.items()):
            if row is None and at < before:
                del self.rows[where]
                self.pruned += 1

    def tables(self) -> dict[TableRef, dict[Key, dict[str, Any]]]:
        state: dict[TableRef, dict[Key, dict[str, Any]]] = {t: {} for t in TABLES}
        for (table, key), (_, row) in self.rows.items():
            if row is not None:
                state[table][key] = row
        return state


class ReplayDroppingOutput:
    """The events an output took, in order. A tailer that restarts re-reads what was not
    acknowledged; the output drops an event it already has at that position (a replay), as
    consumers do by position. Anything else is kept, so an order violation stays visible."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.replays = 0
        self._at: dict[Position, Event] = {}

    def take(self, events: list[Event]) -> None:
        for event in events:
            if self._at.get(event.position) == event:
                self.replays += 1
                continue
            self.events.append(event)
            self._at[event.position] = event


@dataclass(frozen=True)
class _WindowDurable:
    window_id: str


class ModelTailer:
    """A synchronous model of `tailer.session.Session`: reads the log from the last
    acknowledged position, feeds the reconciler under test, and hands events and marks over
    as the writer would. Normally everything handed over is durable at once; while `held`,
    nothing is (the writer is stuck in the output), and a restart drops it.

    Read-only windows as `Session._poll_positional` moves them, at every commit boundary (a
    transaction's end, and the log's end when `tail` reaches it, as an `Idle`): armed at the
    read position, closed once it passed their hw, failed when armed by an earlier session.
    `bounds` keeps where each one it closed opened and closed, as log positions: its rows are
    checked against the source at those (`histories.check_windows`)."""

    def __init__(
        self, source: Source, windows: ModelWindows, reconciler_class: type[Reconciler]
    ) -> None:
        self.source = source
        self.windows = windows
        self.reconciler_class = reconciler_class
        self.output = ReplayDroppingOutput()
        self.acks = [0]
        self.held = False
        self.lost_batches = 0
        self.bounds: dict[str, tuple[int, int]] = {}
        """Each read-only window closed: the commit its lw lies at and its rows' commit."""
        self._restart_at(0)

    def _restart_at(self, commit: int) -> None:
        self.reconciler = self.reconciler_class(SOURCE_NAME, DB)
        self.pending: list[Event | _WindowDurable | TransactionEnd] = []
        self.delivered = 0
        """Every commit below it has been read (0: nothing yet)."""
        self.gap = 0
        """A commit no transaction has, above every one read, below every one to come."""
        self.armed: dict[str, int] = {}
        """The read-only windows this session armed, still open, with the commit of their lw."""
        self.arm_from: int | None = None
        """`PositionalWindows._arm_from`: the log's end when the session first met a window
        to arm."""
        self.at = next(
            (i for i, entry in enumerate(self.source.log) if entry.commit > commit),
            len(self.source.log),
        )

    @property
    def events(self) -> list[Event]:
        return self.output.events

    @property
    def replays(self) -> int:
        return self.output.replays

    def tail(self, entries: int, idle_first: bool = False) -> None:
        """Read up to `entries` log entries; with `idle_first`, the reader first says it is at
        the end of what it has read (a keepalive that came before the next transaction)."""
        if idle_first and self.at:
            self._idle(self.source.log[self.at - 1].commit + 9)
        for _ in range(entries):
            if self.at >= len(self.source.log):
                break
            entry = self.source.log[self.at]
            self.at += 1
            for item in log_items(entry):
                if isinstance(item, Change):
                    self.reconciler.change(item.event)
                    self.pending.append(item.event)
                elif isinstance(item, WatermarkWrite):
                    self._watermark(item)
                elif isinstance(item, TransactionEnd):
                    self.pending.append(item)
                    self.delivered = self.gap = item.commit + 1
                    self._poll_positional()
            if not self.held:
                self._flush()
        if self.at >= len(self.source.log):
            self._idle(self.source.log_end)

    def _idle(self, log_end: int) -> None:
        """`Session.idle`: every commit below the log's end is read; none lies at its end less
        one."""
        if log_end > self.delivered:
            self.delivered, self.gap = log_end, log_end - 1
        self._poll_positional()
        if not self.held:
            self._flush()

    def _poll_positional(self) -> None:
        if not self.delivered:
            return
        for pending in self.windows.pending_positional():
            window_id = pending.window.window_id
            if pending.state == "registered":
                if self.arm_from is None:
                    self.arm_from = self.source.log_end
                if self.delivered >= self.arm_from:
                    self._arm(pending.window)
            elif window_id not in self.armed:
                self.windows.fail(window_id)  # armed by an earlier session
            elif pending.ready and pending.hw is None:
                del self.armed[window_id]
                self.windows.fail(window_id)
            elif pending.hw is not None and self.delivered >= pending.hw:
                self._close_positional(pending.window)

    def arm_at(self) -> int:
        """The read position a window is armed at: every commit below it read."""
        return self.delivered

    def _arm(self, window: Window) -> None:
        if not self.windows.arm(window.window_id):
            return
        lw = self.arm_at() - 1
        opened = self.reconciler.low_watermark(window, Position(lw, 0))
        if isinstance(opened, Failed):
            self.windows.fail(window.window_id)
            return
        self.armed[window.window_id] = self.delivered - 1

    def _close_positional(self, window: Window) -> None:
        lw = self.armed.pop(window.window_id)
        chunk = self.windows.rows(window.window_id)
        if chunk is None:
            self.windows.fail(window.window_id)
            return
        base = self.windows.reserve(self.gap, len(chunk.rows) + 1)
        closed = self.reconciler.high_watermark(window, Position(self.gap, base))
        if isinstance(closed, Failed):
            self.windows.fail(window.window_id)
            return
        self.bounds[window.window_id] = (lw, self.gap)
        self._closed(closed, chunk)

    def _watermark(self, item: WatermarkWrite) -> None:
        known = self.windows.lookup_watermark(item.value)
        if known is None:
            return
        window, kind = known
        if kind == "lw":
            if not self.windows.open(window.window_id):
                return
            opened = self.reconciler.low_watermark(window, item.position)
            if isinstance(opened, Failed):
                self.windows.fail(window.window_id)
            return
        closed = self.reconciler.high_watermark(window, item.position)
        if isinstance(closed, Failed):
            self.windows.fail(window.window_id)
            return
        assert isinstance(closed, Closed)
        chunk = self.windows.rows(window.window_id)
        if chunk is None:
            self.windows.fail(window.window_id)
            return
        self._closed(closed, chunk)

    def _closed(self, closed: Closed, chunk: ChunkRows) -> None:
        """Emit a closed window's rows, or record a direct one's."""
        window = closed.window
        if window.mode is DumpMode.DIRECT:
            self._record(closed, chunk)
            return
        events = self.reconciler.chunk_events(closed, chunk)
        if isinstance(events, Failed):
            self.windows.fail(window.window_id)
            return
        if not self.windows.claim(window.window_id):
            return
        self.pending.extend(events)
        self.pending.append(_WindowDurable(window.window_id))

    def _record(self, closed: Closed, chunk: ChunkRows) -> None:
        """`WindowCloser._record_direct`: the reads' transactions checked, then the record."""
        window_id = closed.window.window_id
        if isinstance(self.reconciler.chunk_events(closed, replace(chunk, rows=())), Failed):
            self.windows.fail(window_id)
            return
        record = DirectRecord(
            window_id, closed.lw_position, closed.hw_position, closed.changed_keys
        )
        self.windows.record(record)

    def checkpoint(self) -> int:
        return self.acks[-1]

    def _flush(self) -> None:
        self.output.take([e for e in self.pending if isinstance(e, Event)])
        for item in self.pending:
            if isinstance(item, _WindowDurable):
                self.windows.close(item.window_id)
            elif isinstance(item, TransactionEnd) and item.commit > self.acks[-1]:
                self.acks.append(item.commit)
        self.pending.clear()

    def hold(self) -> None:
        self.held = True

    def release(self) -> None:
        self.held = False
        self._flush()

    def restart(self, acks_lost: int) -> None:
        """The session ends with what it held not durable; the next reads from the last
        acknowledged position, or an earlier one if the source lost the last acknowledgements."""
        self.lost_batches += any(isinstance(item, Event) for item in self.pending)
        self.held = False
        self._restart_at(self.acks[max(0, len(self.acks) - 1 - acks_lost)])

    def expire(self) -> None:
        """Every open window's hw is late: each expires and fails."""
        for window, _ in list(self.reconciler.open_windows()):
            self.armed.pop(window.window_id, None)
            if self.reconciler.expire(window.window_id) is not None:
                self.windows.fail(window.window_id)

    def finish(self) -> None:
        self.release()
        self.tail(len(self.source.log))


@dataclass
class Flight:
    chunk: Chunk
    window: Window
    lw: str
    hw: str
    state: str = "registered"  # registered -> lw -> read -> hw
    """A read-only flight's: registered -> lw (the tailer armed it) -> read -> hw (ready)."""
    rows: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Dump:
    """A dump driver: chunks of each table between watermarks, resumable from progress."""

    dump_id: str
    source: Source
    windows: DumpWindows
    kind: DumpKind
    tables: list[TableRef]
    keys: tuple[Key, ...] | None
    chunk_size: int
    parallelism: int
    bounded: bool = False
    mode: DumpMode = DumpMode.SEQUENCED
    target: PositionTarget | None = None
    """Where a direct dump writes its rows."""
    where: str | None = None
    """The dump's filter (`DumpRequest.where`), one of `FILTERS`: the planner puts it in every
    chunk, as the dump runner does."""
    planner: type[TablePlanner] = TablePlanner
    """The planner under test: production's, or a broken one (tests/unit/broken_planners.py)."""
    read_only: Snapshot | None = None
    """A read-only dump's reads (`ChunkSource.read_only`): no watermark is written, the tailer
    arms each window and closes it past the hw the read stored."""
    progress: dict[TableRef, TableProgress] = field(default_factory=dict)
    flights: list[Flight] = field(default_factory=list)
    windows_failed: int = 0
    abandoned: set[str] = field(default_factory=set)
    """Windows this dump abandoned: none of their rows may reach the output."""
    stale_prone: list[str] = field(default_factory=list)
    """Windows whose chunk read missed a committed transaction."""
    reads: dict[str, Flight] = field(default_factory=dict)
    """Every window whose rows were stored, by id."""
    chunks: list[Chunk] = field(default_factory=list)
    """Every chunk put in flight, retries included."""
    written: dict[str, dict[Key, dict[str, Any]]] = field(default_factory=dict)
    """The rows a direct dump wrote into the target, by window."""
    abandoned_after_hw: int = 0
    abandons_refused: int = 0
    _windows_made: int = 0

    def __post_init__(self) -> None:
        self.progress = {t: TableProgress(t) for t in self.tables}
        self._restart_planners()

    def _restart_planners(self) -> None:
        self.planners = {
            t: self.planner(
                TableProgress.from_json(self.progress[t].to_json()),
                self.chunk_size,
                self.keys,
                bounded=self.bounded,
                where=self.where,
            )
            for t in self.tables
        }
        self.flights = []

    @property
    def done(self) -> bool:
        return all(p.done for p in self.progress.values())

    def crash(self) -> None:
        """The dump dies; a new run resumes from durable progress. Its windows stay behind."""
        self._restart_planners()

    def plan(self) -> None:
        planner = next((p for p in self.planners.values() if not p.done), None)
        if planner is None:
            return
        if planner.needs_max_key:
            planner.begin(self.source.max_key(planner.table))
            self._save(planner)
            return
        wanted = planner.split_keys_wanted(self.parallelism)
        splits: list[Key] = []
        if wanted:
            assert planner.progress.max_key is not None
            cursor = planner.cursor_after
            splits = self.source.split_keys(
                planner.table, cursor, planner.progress.max_key, self.chunk_size, wanted
            )
        for chunk in planner.next_chunks(self.parallelism, splits):
            self._fly(chunk)

    def _fly(self, chunk: Chunk) -> None:
        self._windows_made += 1
        n = f"{self.dump_id}.{self._windows_made}"
        window = Window(f"w{n}", self.dump_id, chunk.table, self.mode)
        flight = Flight(chunk, window, f"lw{n}", f"hw{n}")
        self.windows.register(window, flight.lw, flight.hw)
        if self.read_only is not None:
            self.windows.add_positional(window.window_id)
        self.flights.append(flight)
        self.chunks.append(chunk)

    def read(self, flight: Flight) -> ChunkRead:
        """The flight's chunk read (`ChunkSource.read_chunk`)."""
        if self.read_only is None:
            return self.source.read_chunk(flight.chunk)
        return self.source.read_positional(flight.chunk, self.read_only)

    def armed(self, flight: Flight) -> None:
        """The dump saw the tailer arm a read-only flight's window (`wait_armed` returned)."""

    def _retry(self, flight: Flight) -> None:
        self.flights.remove(flight)
        self.windows_failed += 1
        self._fly(flight.chunk)  # the same chunk again, with new watermarks

    def advance(self, index: int) -> None:
        """Move one in-flight chunk one step: write lw, read and store the rows, write hw, or
        see its window end (closed: progress moves; failed or abandoned: retry the chunk)."""
        if not self.flights:
            return
        flight = self.flights[index % len(self.flights)]
        window_id = flight.window.window_id
        if flight.state == "registered" and self.read_only is not None:
            state = self.windows.state(window_id)
            if state in ("failed", "abandoned"):
                self._retry(flight)
            elif state == "open":
                self.armed(flight)
                flight.state = "lw"
        elif flight.state == "registered":
            self.source.watermark(flight.lw)
            flight.state = "lw"
        elif flight.state == "lw":
            read = self.read(flight)
            columns = KEY_COLUMNS[flight.chunk.table]
            kept = () if self.mode is DumpMode.DIRECT else read.rows  # direct: rows stay here
            chunk = ChunkRows(
                window_id,
                columns,
                kept,
                1,
                read.invisible_txids,
                hw=read.hw,
                snapshot_end=read.snapshot_end,
            )
            if not self.windows.put_rows(window_id, chunk):
                self._retry(flight)  # the tailer ended the window first
                return
            if read.invisible_txids:
                self.stale_prone.append(window_id)
            flight.rows = read.rows
            self.reads[window_id] = flight
            flight.state = "read"
        elif flight.state == "read" and self.read_only is not None:
            if not self.windows.ready(window_id):
                self._retry(flight)  # the tailer ended the window first
                return
            flight.state = "hw"
        elif flight.state == "read":
            self.source.watermark(flight.hw)
            flight.state = "hw"
        else:
            state = self.windows.state(window_id)
            if state in ("failed", "abandoned"):
                self._retry(flight)
            elif state == "closed":
                if self.mode is DumpMode.DIRECT:
                    self._write(flight)
                self.flights.remove(flight)
                planner = self.planners[flight.chunk.table]
                last = None
                if flight.rows:
                    columns = KEY_COLUMNS[flight.chunk.table]
                    last = tuple(flight.rows[-1][c] for c in columns)
                planner.complete(flight.chunk, len(flight.rows), last)
                self._save(planner)

    def _write(self, flight: Flight) -> None:
        """A direct window's rows, its recorded keys dropped, into the target after hw."""
        assert self.target is not None
        windows = self.windows
        assert isinstance(windows, ModelWindows)
        record = windows.record_of(flight.window.window_id)
        assert record is not None, "closed without its record"
        columns = KEY_COLUMNS[flight.chunk.table]
        written = self.written.setdefault(flight.window.window_id, {})
        for row in record.survivors(flight.rows, columns):
            key = tuple(row[c] for c in columns)
            self.target.apply(flight.chunk.table, key, row, record.rows_position)
            written[key] = row
        windows.committed(flight.window.window_id)

    def abandon(self, index: int) -> None:
        """The dump stops waiting for a window (it timed out, or the dump is stopping): if it
        wins the race with the tailer's claim, the chunk is retried; else it waits on."""
        if not self.flights:
            return
        flight = self.flights[index % len(self.flights)]
        if self.windows.abandon(flight.window.window_id):
            self.abandoned.add(flight.window.window_id)
            self.abandoned_after_hw += flight.state == "hw"
            self._retry(flight)
        else:
            self.abandons_refused += 1

    def give_up(self, index: int) -> None:
        """`run_chunk` after its second wait: a window still closing (the tailer that claimed
        it died before its rows were durable, and a read-only window has no hw in the log for
        the next one to fail it at) is given up, and the chunk retried."""
        flight = self.flights[index % len(self.flights)]
        if self.windows.state(flight.window.window_id) == "closing":
            self._retry(flight)

    def _save(self, planner: TablePlanner) -> None:
        self.progress[planner.table] = TableProgress.from_json(planner.progress.to_json())
