"""A model of DBLog's moving parts around the pure core, for property-based tests.

A source database (tables as dicts), its change log (a list of committed transactions and
watermark writes), a dump driver that plans chunks with `TablePlanner` and reads them between
watermarks, and a tailer that feeds the log to a `Reconciler` and writes the output. Every step
is chosen by the test, so hypothesis explores the interleavings: writes, chunk reads landing at
any point inside their windows, several windows in flight, dump crashes and window expiry,
tailer restarts from a checkpoint, and transactions that are in the log but not yet visible to
a chunk read (PostgreSQL's commit waiting for a synchronous standby).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_dblog.core.dump_plan import Chunk, DumpKind, TablePlanner, TableProgress
from airflow_provider_dblog.core.event import Event, Key, Op, Origin, SourceInfo, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import ChunkRows, Closed, Failed, Reconciler, Window

TABLE_A = TableRef("app", "accounts")  # key (id)
TABLE_B = TableRef("app", "orders")  # key (region, n)
KEY_COLUMNS = {TABLE_A: ("id",), TABLE_B: ("region", "n")}


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


@dataclass
class ChunkRead:
    rows: list[dict[str, Any]]
    invisible_txids: frozenset[int]


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
        default_factory=lambda: {TABLE_A: {}, TABLE_B: {}}
    )
    log: list[Transaction | Watermark] = field(default_factory=list)
    invisible: list[Transaction] = field(default_factory=list)
    _commit: int = 100
    _txid: int = 1000
    _version: int = 0

    def next_commit(self) -> int:
        self._commit += 10
        return self._commit

    def write(self, ops: list[tuple[str, TableRef, Key]], *, invisible: bool = False) -> None:
        """Commit one transaction of inserts/updates/deletes (invalid ones are skipped); with
        `invisible`, one that chunk reads do not see until `reveal`."""
        written = {(table, key) for _, table, key in ops}
        self.invisible = [
            tx
            for tx in self.invisible
            if not any((table, key) in written for _, table, key, _, _ in tx.changes)
        ]
        self._txid += 1
        tx = Transaction(self._txid, 0, [])
        for kind, table, key in ops:
            rows = self.tables[table]
            self._version += 1
            before = rows.get(key)
            if kind == "upsert":
                after = row_for(table, key, self._version)
                rows[key] = after
                op = Op.UPDATE if before is not None else Op.CREATE
                tx.changes.append((op, table, key, before, after))
            elif before is not None:
                del rows[key]
                tx.changes.append((Op.DELETE, table, key, before, None))
        if tx.changes:
            tx.commit = self.next_commit()
            self.log.append(tx)
            if invisible:
                self.invisible.append(tx)

    def reveal(self) -> None:
        """Every committed transaction becomes visible (the standby answered)."""
        self.invisible.clear()

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

    def _select(self, rows: dict[Key, dict[str, Any]], chunk: Chunk) -> list[dict[str, Any]]:
        if chunk.keys is not None:
            return [dict(rows[k]) for k in chunk.keys if k in rows]
        keys = sorted(
            k
            for k in rows
            if (chunk.after is None or k > chunk.after) and (chunk.upto is None or k <= chunk.upto)
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


@dataclass
class Store:
    """What Redis holds between the dump and the tailer."""

    windows: dict[str, tuple[Window, str]] = field(default_factory=dict)  # value -> (window, lw|hw)
    chunks: dict[str, ChunkRows] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)  # window_id -> closed|failed


@dataclass
class ModelTailer:
    """The model of the production tailer that the generated histories drive (a log cursor,
    the reconciler under test, an in-memory output and checkpoint)."""

    source: Source
    store: Store
    reconciler_class: type[Reconciler] = Reconciler
    at: int = 0
    output: list[Event] = field(default_factory=list)
    checkpoint: tuple[int, int] = (0, 0)  # (log index, output length)

    def __post_init__(self) -> None:
        self.reconciler = self.reconciler_class("sim", "db")
        self.pending_closed: list[tuple[int, str]] = []

    def step(self) -> bool:
        if self.at >= len(self.source.log):
            return False
        entry = self.source.log[self.at]
        self.at += 1
        if isinstance(entry, Transaction):
            for seq, (op, table, key, before, after) in enumerate(entry.changes):
                source = SourceInfo(
                    "sim",
                    "db",
                    table.schema,
                    table.name,
                    Position(entry.commit, seq),
                    Origin.LOG,
                    txid=entry.txid,
                )
                key_row = dict(zip(KEY_COLUMNS[table], key, strict=True))
                event = Event(op, key_row, before, after, source, 1)
                self.reconciler.change(event)
                self.output.append(event)
        else:
            self._watermark(entry)
        return True

    def _watermark(self, entry: Watermark) -> None:
        known = self.store.windows.get(entry.value)
        if known is None:
            return
        window, kind = known
        if self.store.status.get(window.window_id) in ("closed", "failed"):
            return
        position = Position(entry.commit, 0)
        if kind == "lw":
            result = self.reconciler.low_watermark(window, position)
            if isinstance(result, Failed):
                self.store.status[window.window_id] = "failed"
            return
        closed = self.reconciler.high_watermark(window, position)
        if isinstance(closed, Failed):
            self.store.status[window.window_id] = "failed"
            return
        assert isinstance(closed, Closed)
        events = self.reconciler.chunk_events(closed, self.store.chunks[window.window_id])
        if isinstance(events, Failed):
            self.store.status[window.window_id] = "failed"
            return
        self.output.extend(events)
        self.pending_closed.append((len(self.output), window.window_id))

    def save_checkpoint(self) -> None:
        """The output is durable up to here. Only now are closed windows marked complete, so a
        restart can never lose a chunk the dump already counted as done."""
        self.checkpoint = (self.at, len(self.output))
        for _, window_id in self.pending_closed:
            self.store.status[window_id] = "closed"
        self.pending_closed.clear()

    def restart(self) -> None:
        """Crash and restart from the checkpoint: in-memory windows are lost."""
        self.at, kept = self.checkpoint
        del self.output[kept:]
        self.pending_closed.clear()
        self.reconciler = self.reconciler_class("sim", "db")

    def expire(self, window_id: str) -> None:
        failed = self.reconciler.expire(window_id)
        if failed is not None or self.store.status.get(window_id) is None:
            self.store.status[window_id] = "failed"


@dataclass
class Flight:
    chunk: Chunk
    window: Window
    state: str = "registered"  # registered -> lw -> read -> hw
    rows: list[dict[str, Any]] = field(default_factory=list)


_ids = itertools.count()


@dataclass
class Dump:
    """A dump driver: chunks of each table between watermarks, resumable from progress."""

    source: Source
    store: Store
    kind: DumpKind
    tables: list[TableRef]
    keys: tuple[Key, ...] | None
    chunk_size: int
    parallelism: int
    bounded: bool = False
    progress: dict[TableRef, TableProgress] = field(default_factory=dict)
    flights: list[Flight] = field(default_factory=list)
    windows_failed: int = 0

    def __post_init__(self) -> None:
        self.progress = {t: TableProgress(t) for t in self.tables}
        self._restart_planners()

    def _restart_planners(self) -> None:
        self.planners = {
            t: TablePlanner(
                TableProgress.from_json(self.progress[t].to_json()),
                self.chunk_size,
                self.keys,
                bounded=self.bounded,
            )
            for t in self.tables
        }
        self.flights = []

    @property
    def done(self) -> bool:
        return all(p.done for p in self.progress.values())

    def crash(self) -> None:
        """The dump dies; a new run resumes from durable progress. Open windows expire."""
        self._restart_planners()

    def current(self) -> TablePlanner | None:
        return next((p for p in self.planners.values() if not p.done), None)

    def plan(self) -> bool:
        planner = self.current()
        if planner is None:
            return False
        if planner.needs_max_key:
            planner.begin(self.source.max_key(planner.table))
            self._save(planner)
            return True
        wanted = planner.split_keys_wanted(self.parallelism)
        splits: list[Key] = []
        if wanted:
            assert planner.progress.max_key is not None
            cursor = planner.cursor_after
            splits = self.source.split_keys(
                planner.table, cursor, planner.progress.max_key, self.chunk_size, wanted
            )
        chunks = planner.next_chunks(self.parallelism, splits)
        for chunk in chunks:
            self._fly(chunk)
        return bool(chunks)

    def _fly(self, chunk: Chunk) -> None:
        n = next(_ids)
        window = Window(f"w{n}", "dump1", chunk.table)
        self.store.windows[f"lw{n}"] = (window, "lw")
        self.store.windows[f"hw{n}"] = (window, "hw")
        self.flights.append(Flight(chunk, window))

    def advance(self, index: int) -> None:
        """Move one in-flight chunk one step: write lw, read, write hw, or see its window end."""
        flight = self.flights[index]
        n = flight.window.window_id[1:]
        if flight.state == "registered":
            self.source.watermark(f"lw{n}")
            flight.state = "lw"
        elif flight.state == "lw":
            read = self.source.read_chunk(flight.chunk)
            flight.rows = read.rows
            columns = KEY_COLUMNS[flight.chunk.table]
            self.store.chunks[flight.window.window_id] = ChunkRows(
                flight.window.window_id, columns, flight.rows, 1, read.invisible_txids
            )
            flight.state = "read"
        elif flight.state == "read":
            self.source.watermark(f"hw{n}")
            flight.state = "hw"
        else:
            status = self.store.status.get(flight.window.window_id)
            if status is None:
                return
            self.flights.pop(index)
            planner = self.planners[flight.chunk.table]
            if status == "failed":
                self.windows_failed += 1
                self._fly(flight.chunk)  # the same chunk again, with new watermarks
                return
            last = None
            if flight.rows:
                columns = KEY_COLUMNS[flight.chunk.table]
                last = tuple(flight.rows[-1][c] for c in columns)
            planner.complete(flight.chunk, len(flight.rows), last)
            self._save(planner)

    def _save(self, planner: TablePlanner) -> None:
        self.progress[planner.table] = TableProgress.from_json(planner.progress.to_json())
