"""One verify chunk: the source read between lw and hw, the target read once it has applied the
log through hw, and the keys the log changed from lw until after that read (`core/verify.py`).

The tailer keeps both records, as for a direct dump's window (`state/direct.py`): at a direct
window's hw it records the keys of its table that changed inside it and hw's position, and emits
no row. A verify chunk nests two such windows:

    outer lw, inner lw, source read, inner hw, [wait: target applied through inner hw],
    target read, outer hw

The inner window gives hw (its read is checked as any chunk read: a stale read fails it); the
outer one, opened before it and closed after the target's read, gives the keys in flux. On a
read-only source both are log positions the tailer arms and closes (ADR 0006); the outer's hw
is the position of a snapshot taken after the target's read.

Any failure (a window that fails or expires, a target that does not catch up in time) ends both
windows; the chunk is read again with new ones.

The two reads are a `ChunkHasher`'s: in this process (`IN_PROCESS`), or by Spark tasks that
hash a part of the chunk each (`spark_chunk.SparkChunkHasher`); only hashes reach the compare,
or, in this process from a target whose rows are the source's JSON (`RowsTarget`), the rows
themselves, compared as their hashes would be (`core.verify.RowsRead`).

In this process, a key range of a source and a target whose databases both sum a chunk's rows
(`SummingChunkSource`, `SumsTarget`) is first read as two sums (`SERVER_SUMS`): no row leaves
either database. Only a chunk whose sums differ is read again, as rows, in new windows.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from functools import partial
from typing import Protocol, cast

from airflow_provider_dblog.core.direct import DirectRecord, DumpMode
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import ChunkRows, Window
from airflow_provider_dblog.core.verify import (
    ChunkSum,
    ChunkVerdict,
    RowsRead,
    compare_chunk,
    sums_verdict,
)
from airflow_provider_dblog.dump.chunk import ChunkOutcome, ChunkReadFailed, between_watermarks
from airflow_provider_dblog.sources.base import (
    ChunkRead,
    ChunkSource,
    ChunkSumRead,
    SummingChunkSource,
)
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.verify.reader import RowsTarget, SumsTarget, TargetReader

_TARGET_POLL_S = 0.02


SideRead = Mapping[Key, str] | ChunkSum
"""One side's read of a chunk: its row hashes by key, or its rows summed by its database."""

BeforeClose = Callable[[dict[Key, str], dict[Key, str]], None]
"""Called with the source's and the target's row hashes after the target's read, before the
outer window closes: what it does to the target is inside the window (`repair.py`)."""


class ChunkHasher(Protocol):
    """Reads a verify chunk's two sides as row hashes by key."""

    def source_hashes(
        self,
        store: StateStore,
        source: ChunkSource,
        target: TargetReader,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> SideRead | None:
        """Read the source's rows of `chunk` after the inner window's lw, store what the read
        saw for the tailer's check at hw (its transactions and columns, no row), and give
        each row's hash by its key as `target.hash_rows` gives it (or, summing, the rows'
        sum); None when the window is past open (the chunk is read again)."""
        ...

    def target_hashes(
        self, store: StateStore, source: ChunkSource, target: TargetReader, chunk: Chunk
    ) -> SideRead:
        """The target's rows of `chunk` as `target.read_hashes` gives them."""
        ...


class InProcessHasher:
    """The `ChunkHasher` of `dblog verify`: both reads on the slot's own connections, as rows
    when the target's rows are the source's JSON (`RowsTarget`)."""

    def source_hashes(
        self,
        store: StateStore,
        source: ChunkSource,
        target: TargetReader,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> Mapping[Key, str] | None:
        read = source.read_chunk(chunk)
        columns = tuple(read.rows[0]) if read.rows else ()
        if not _read_stored(store, window_id, key_columns, read, columns):
            return None
        if isinstance(target, RowsTarget):
            return RowsRead(read.rows, key_columns)
        return target.hash_rows(chunk.table, key_columns, read.rows)

    def target_hashes(
        self, store: StateStore, source: ChunkSource, target: TargetReader, chunk: Chunk
    ) -> Mapping[Key, str]:
        if isinstance(target, RowsTarget):
            return target.read_rows(chunk)
        return target.read_hashes(chunk)


IN_PROCESS = InProcessHasher()


class ServerSums:
    """The `ChunkHasher` that has each side's database sum the chunk's rows: of a
    `SummingChunkSource` and a `SumsTarget` (`summable`)."""

    def source_hashes(
        self,
        store: StateStore,
        source: ChunkSource,
        target: TargetReader,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> SideRead | None:
        read = cast(SummingChunkSource, source).sum_chunk(chunk)
        columns = tuple(name for name, _ in read.sum.columns) if read.sum.rows else ()
        if not _read_stored(store, window_id, key_columns, read, columns):
            return None
        return read.sum

    def target_hashes(
        self, store: StateStore, source: ChunkSource, target: TargetReader, chunk: Chunk
    ) -> SideRead:
        summed = cast(SumsTarget, target).sum_rows(chunk)
        return {} if summed is None else summed  # not a sum: the rows are compared


SERVER_SUMS = ServerSums()

NO_GATE: AbstractContextManager[object] = nullcontext()
"""A `rows_gate` that lets any number of chunks read rows at once."""


def summable(source: ChunkSource, target: TargetReader) -> bool:
    """Whether both sides' databases can sum a chunk's rows (`ServerSums`)."""
    return callable(getattr(source, "sum_chunk", None)) and callable(
        getattr(target, "sum_rows", None)
    )


def _read_stored(
    store: StateStore,
    window_id: str,
    key_columns: tuple[str, ...],
    read: ChunkRead | ChunkSumRead,
    columns: tuple[str, ...],
) -> bool:
    """Store what the source read saw (its transactions, its snapshot, the columns it read
    with) for the tailer's check at hw; False when the window is past open."""
    rows = ChunkRows(window_id, key_columns, (), 0, read.invisible_txids)
    if read.snapshot is not None:
        end = read.snapshot.hw if read.snapshot.exact else None
        rows = replace(rows, hw=read.snapshot.hw, snapshot_end=end)
    return store.windows.put_rows(window_id, rows, columns)


def verify_chunk(
    store: StateStore,
    source: ChunkSource,
    target: TargetReader,
    verify_id: str,
    chunk: Chunk,
    key_columns: tuple[str, ...],
    *,
    window_timeout_s: float,
    before_close: BeforeClose | None = None,
    hasher: ChunkHasher = IN_PROCESS,
    rows_gate: AbstractContextManager[object] = NO_GATE,
) -> ChunkVerdict | ChunkOutcome:
    """Read `chunk` (a key range with no limit, or a key list: the target reads the same) on
    both sides between the two windows, with `hasher`, and compare; a `ChunkOutcome` (not
    completed, with its reason) when the chunk must be read again. A key range read in this
    process is first compared as two sums where both sides can sum it (`summable`); the read
    of rows happens inside `rows_gate`, which bounds how many chunks hold rows at once."""
    read = partial(
        _verify_once, store, source, target, verify_id, chunk, key_columns,
        window_timeout_s=window_timeout_s, before_close=before_close,
    )  # fmt: skip
    sums = hasher is IN_PROCESS and before_close is None and chunk.keys is None
    if sums and summable(source, target):
        summed = read(SERVER_SUMS)
        if summed is not None:
            return summed
    with rows_gate:
        verdict = read(hasher)
    assert verdict is not None  # rows and hashes always give one
    return verdict


def _verify_once(
    store: StateStore,
    source: ChunkSource,
    target: TargetReader,
    verify_id: str,
    chunk: Chunk,
    key_columns: tuple[str, ...],
    hasher: ChunkHasher,
    *,
    window_timeout_s: float,
    before_close: BeforeClose | None,
) -> ChunkVerdict | ChunkOutcome | None:
    """`verify_chunk` with one hasher; None when it read two sums that differ."""
    outer = Window(uuid.uuid4().hex, verify_id, chunk.table, DumpMode.DIRECT)
    inner = Window(uuid.uuid4().hex, verify_id, chunk.table, DumpMode.DIRECT)
    target_read: list[SideRead] = []
    inner_record: list[DirectRecord] = []

    def read_source(window_id: str) -> SideRead | None:
        return hasher.source_hashes(store, source, target, window_id, chunk, key_columns)

    def read_both(window_id: str) -> SideRead | None:
        source_read: SideRead | ChunkOutcome = between_watermarks(
            store, source, inner, chunk, read_source,
            window_timeout_s=window_timeout_s, ended="recorded",
        )  # fmt: skip
        record = _record(store, inner)
        if isinstance(source_read, ChunkOutcome):
            raise ChunkReadFailed(source_read.reason or "the source read's window failed")
        if record is None:
            raise ChunkReadFailed(f"window {inner.window_id} closed without its record")
        inner_record.append(record)
        _wait_applied(store, target, record.hw_position, window_timeout_s)
        target_read.append(hasher.target_hashes(store, source, target, chunk))
        if before_close is not None:
            assert not isinstance(source_read, ChunkSum)
            assert not isinstance(target_read[0], ChunkSum)
            before_close(dict(source_read), dict(target_read[0]))
        marker = ChunkRows(window_id, key_columns, (), 0, frozenset())
        if source.read_only:  # the outer hw: a snapshot's position, after the target's read
            snapshot = source.read_chunk(Chunk(chunk.table, chunk.seq, limit=1)).snapshot
            marker = replace(marker, hw=None if snapshot is None else snapshot.hw)
        if not store.windows.put_rows(window_id, marker):
            return None
        return source_read

    try:
        reads: SideRead | ChunkOutcome = between_watermarks(
            store, source, outer, chunk, read_both,
            window_timeout_s=window_timeout_s, ended="recorded",
        )  # fmt: skip
    except ChunkReadFailed as exc:
        _record(store, outer)
        return ChunkOutcome(False, 0, None, str(exc))
    record = _record(store, outer)
    if isinstance(reads, ChunkOutcome):
        return reads
    if record is None:
        return ChunkOutcome(False, 0, None, f"window {outer.window_id} closed without its record")
    if isinstance(reads, ChunkSum):
        summed = target_read[0]
        return sums_verdict(reads, summed) if isinstance(summed, ChunkSum) else None
    theirs = target_read[0]
    assert not isinstance(theirs, ChunkSum)
    in_flux = record.changed_keys | inner_record[0].changed_keys
    return compare_chunk(reads, theirs, in_flux)


def _record(store: StateStore, window: Window) -> DirectRecord | None:
    """What the tailer recorded for the window, if it did; it holds nothing back after that
    (a verify commits no row: `DirectWindowStore.committed` at once)."""
    record = store.directs.record_of(window.window_id)
    store.directs.committed(window.window_id)
    return record


def _wait_applied(store: StateStore, target: TargetReader, hw: Position, timeout_s: float) -> None:
    """Until the target holds every event up to hw (`TargetReader.applied_through`)."""
    deadline = time.monotonic() + timeout_s
    while not target.applied_through(hw, store.tailer.load_checkpoint()):
        if time.monotonic() > deadline:
            raise ChunkReadFailed(
                f"{target.name} did not apply the log through hw within {timeout_s}s "
                "(is dblog tail running, and for the lake its compaction?)"
            )
        time.sleep(_TARGET_POLL_S)
