"""One chunk of a direct dump: its rows go straight from the reader into the target.

Register the window (mode direct), write lw, read the chunk and stage the rows where they were
read (`DirectTarget.stage_chunk`: the `dblog dump` process, or Spark tasks), store only the read's
invisible transactions and columns, write hw, and wait: the tailer meets hw, checks the read as
a sequenced chunk's (stale, or read with other columns than the table has at hw: the window
fails) and records the keys that changed inside the window and hw's position
(`state/direct.py`). The driver then commits the
chunk once (`DirectTarget.commit`: those keys dropped, the rest positioned just after hw), and
only then does the runner move the dump's progress. No dump row passes through Redis or the
tailer.

Failures are those of a sequenced chunk: a window that fails, expires or is abandoned, a reader
that dies, is retried with new watermarks, and what its readers staged is discarded; a dump
killed mid-chunk resumes from its last completed chunk (what it staged is left to
`remove_stale_staged`). Even a committed part of a retried chunk would be harmless: each of its
rows was the key's state at that window's hw, and the target keeps the highest position per key.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from airflow_provider_dblog.core.direct import DirectRecord, DumpMode
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import ChunkRows, Window
from airflow_provider_dblog.direct_target import DirectTarget, StagedRead
from airflow_provider_dblog.dump.chunk import ChunkOutcome, ChunkReadFailed, between_watermarks
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.state import StateStore


@dataclass
class StagedChunk:
    """A chunk its readers read and staged, waiting for the tailer's record: the staged parts'
    handles, and what the runner needs of the read."""

    target: DirectTarget
    table: TableRef
    key_columns: tuple[str, ...]
    handles: list[str]
    rows: int
    """Rows read."""
    last_key: Key | None
    """The last key read (for a LIMIT chunk, where the next one starts)."""

    def commit(self, record: DirectRecord) -> int:
        """Drop the recorded keys, write the rest positioned after hw, in one commit; returns
        the rows written."""
        written = self.target.commit(self.table, self.handles, record, self.key_columns)
        self.handles = []
        return written

    def discard(self) -> None:
        """Forget what was staged and not committed (called whatever happened)."""
        handles, self.handles = self.handles, []
        if handles:
            self.target.discard(self.table, handles)


def stage_recorded(
    target: DirectTarget,
    source: ChunkSource,
    chunk: Chunk,
    key_columns: tuple[str, ...],
    record: Callable[[StagedRead], bool],
) -> StagedRead | None:
    """Read `chunk` (a whole chunk, or a Spark task's part of one) and stage its rows into
    `target`, then `record` the read for its window: its invisible transactions and columns,
    no row. None if the window was already past open (`record` returned False): the staged
    part is discarded then, and when `record` raises (Redis away)."""
    read = target.stage_chunk(source, chunk, key_columns)
    try:
        recorded = record(read)
    except BaseException:
        target.discard(chunk.table, [read.handle])
        raise
    if not recorded:
        target.discard(chunk.table, [read.handle])
        return None
    return read


class DirectChunkReader(Protocol):
    """Reads a direct chunk after lw and stages its rows where they are read; stores the read's
    invisible transactions and columns for the window (`WindowStore.put_rows` or `append_rows`,
    no row).
    Returns None if the window is already past open: the chunk is retried."""

    def read(
        self,
        store: StateStore,
        source: ChunkSource,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> StagedChunk | None: ...

    def prune_tombstones(self, table: TableRef, before: Position) -> int:
        """Prune the target's tombstones of `table` older than the horizon `before`."""
        ...


@dataclass
class InProcessDirectReader:
    """The `DirectChunkReader` of `dblog dump`: one query on this process's connection, its
    rows staged from here."""

    target: DirectTarget

    def read(
        self,
        store: StateStore,
        source: ChunkSource,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> StagedChunk | None:

        def record(read: StagedRead) -> bool:
            reads = ChunkRows(window_id, key_columns, (), 0, read.invisible_txids)
            return store.windows.put_rows(window_id, reads, read.columns)

        read = stage_recorded(self.target, source, chunk, key_columns, record)
        if read is None:
            return None
        return StagedChunk(
            self.target, chunk.table, key_columns, [read.handle], read.rows, read.last_key
        )

    def prune_tombstones(self, table: TableRef, before: Position) -> int:
        return self.target.prune_tombstones(table, before)


def run_direct_chunk(
    store: StateStore,
    source: ChunkSource,
    dump_id: str,
    chunk: Chunk,
    key_columns: tuple[str, ...],
    *,
    window_timeout_s: float = 60.0,
    read: DirectChunkReader,
) -> ChunkOutcome:
    """Read one chunk between a fresh lw and hw, stage its rows, and once the tailer recorded
    the window commit the survivors into the target (see the module docstring)."""
    window = Window(uuid.uuid4().hex, dump_id, chunk.table, DumpMode.DIRECT)
    staged_chunks: list[StagedChunk] = []

    def read_staged(window_id: str) -> StagedChunk | None:
        staged = read.read(store, source, window_id, chunk, key_columns)
        if staged is not None:
            staged_chunks.append(staged)  # discarded below unless committed
        return staged

    try:
        staged = between_watermarks(
            store,
            source,
            window,
            chunk,
            read_staged,
            window_timeout_s=window_timeout_s,
            ended="recorded",
        )
        if isinstance(staged, ChunkOutcome):
            return staged
        record = store.directs.record_of(window.window_id)
        if record is None:
            raise ChunkReadFailed(f"window {window.window_id} closed without its record")
        try:
            written = staged.commit(record)
        finally:
            store.directs.committed(window.window_id)
        return ChunkOutcome(True, staged.rows, staged.last_key, written=written)
    finally:
        for part in staged_chunks:
            part.discard()
