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
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Protocol

from airflow_provider_dblog.core.direct import DirectRecord, DumpMode
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import ChunkRows, Window
from airflow_provider_dblog.core.verify import (
    ChunkVerdict,
    RowsRead,
    compare_chunk,
)
from airflow_provider_dblog.dump.chunk import ChunkOutcome, ChunkReadFailed, between_watermarks
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.verify.reader import RowsTarget, TargetReader

_TARGET_POLL_S = 0.02


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
    ) -> Mapping[Key, str] | None:
        """Read the source's rows of `chunk` after the inner window's lw, store what the read
        saw for the tailer's check at hw (its transactions and columns, no row), and give
        each row's hash by its key as `target.hash_rows` gives it; None when the window is
        past open (the chunk is read again)."""
        ...

    def target_hashes(
        self, store: StateStore, source: ChunkSource, target: TargetReader, chunk: Chunk
    ) -> Mapping[Key, str]:
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
        rows = ChunkRows(window_id, key_columns, (), 0, read.invisible_txids)
        if read.snapshot is not None:
            end = read.snapshot.hw if read.snapshot.exact else None
            rows = replace(rows, hw=read.snapshot.hw, snapshot_end=end)
        columns = tuple(read.rows[0]) if read.rows else ()
        if not store.windows.put_rows(window_id, rows, columns):
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
) -> ChunkVerdict | ChunkOutcome:
    """Read `chunk` (a key range with no limit, or a key list: the target reads the same) on
    both sides between the two windows, with `hasher`, and compare; a `ChunkOutcome` (not
    completed, with its reason) when the chunk must be read again."""
    outer = Window(uuid.uuid4().hex, verify_id, chunk.table, DumpMode.DIRECT)
    inner = Window(uuid.uuid4().hex, verify_id, chunk.table, DumpMode.DIRECT)
    target_read: list[Mapping[Key, str]] = []
    inner_record: list[DirectRecord] = []

    def read_source(window_id: str) -> Mapping[Key, str] | None:
        return hasher.source_hashes(store, source, target, window_id, chunk, key_columns)

    def read_both(window_id: str) -> Mapping[Key, str] | None:
        source_read = between_watermarks(
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
            before_close(dict(source_read), dict(target_read[0]))
        marker = ChunkRows(window_id, key_columns, (), 0, frozenset())
        if source.read_only:  # the outer hw: a snapshot's position, after the target's read
            snapshot = source.read_chunk(Chunk(chunk.table, chunk.seq, limit=1)).snapshot
            marker = replace(marker, hw=None if snapshot is None else snapshot.hw)
        if not store.windows.put_rows(window_id, marker):
            return None
        return source_read

    try:
        reads = between_watermarks(
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
    in_flux = record.changed_keys | inner_record[0].changed_keys
    return compare_chunk(reads, target_read[0], in_flux)


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
