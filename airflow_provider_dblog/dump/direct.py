"""One chunk of a direct dump: its rows go straight from the reader into the target.

Register the window (mode direct), write lw, read the chunk and keep the rows where they were
read (this process's memory, or Spark executors'), store only the read's invisible transactions,
write hw, and wait: the tailer meets hw and records the keys that changed inside the window and
hw's position (`state/direct.py`). The readers drop those keys and stage the rest positioned
just after hw; the driver commits the chunk once (`DirectTarget`), and only then does the
runner move the dump's progress. No dump row passes through Redis or the tailer.

Failures are those of a sequenced chunk: a window that fails, expires or is abandoned, a reader
that dies (a Spark task whose kept rows were lost says so) is retried with new watermarks; a
dump killed mid-chunk resumes from its last completed chunk. A part staged by a chunk that is
then retried is harmless: each of its rows was the key's state at that window's hw, and the
target keeps the highest position per key.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from airflow_provider_dblog.core.direct import DirectRecord, DumpMode
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key, Row, TableRef, key_of
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import ChunkRows, Window
from airflow_provider_dblog.dump.chunk import ChunkOutcome, ChunkReadFailed, between_watermarks
from airflow_provider_dblog.dump.direct_target import DirectTarget
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.state import StateStore


class KeptChunk(Protocol):
    """A chunk read and kept by its readers until the tailer's record comes."""

    @property
    def rows(self) -> int:
        """Rows read."""
        ...

    @property
    def last_key(self) -> Key | None:
        """The last key read (for a LIMIT chunk, where the next one starts)."""
        ...

    def write(self, record: DirectRecord) -> int:
        """Drop the recorded keys, stage the rest positioned after hw, commit the chunk; returns
        the rows written. Raises `ChunkReadFailed` if the kept rows were lost (a reader died)."""
        ...

    def discard(self) -> None:
        """Free what the readers keep (called whether or not the chunk was written)."""
        ...


class DirectChunkReader(Protocol):
    """Reads a direct chunk after lw and keeps its rows where they are read; stores the read's
    invisible transactions for the window (`WindowStore.put_rows` or `append_rows`, no row).
    Returns None if the window is already past open: the chunk is retried."""

    def read(
        self,
        store: StateStore,
        source: ChunkSource,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> KeptChunk | None: ...

    def prune_tombstones(self, table: TableRef, before: Position) -> int:
        """Prune the target's tombstones of `table` older than the horizon `before`."""
        ...


@dataclass
class _KeptInProcess:
    table: TableRef
    key_columns: tuple[str, ...]
    read_rows: Sequence[Row]
    target: DirectTarget

    @property
    def rows(self) -> int:
        return len(self.read_rows)

    @property
    def last_key(self) -> Key | None:
        return key_of(self.read_rows[-1], self.key_columns) if self.read_rows else None

    def write(self, record: DirectRecord) -> int:
        survivors = record.survivors(self.read_rows, self.key_columns)
        handle = self.target.stage(self.table, survivors, record.rows_position)
        return self.target.commit(self.table, [handle])

    def discard(self) -> None:
        self.read_rows = ()


@dataclass
class InProcessDirectReader:
    """The `DirectChunkReader` of `dblog dump`: one query on this process's connection, the rows
    kept in memory (one chunk: `chunk_size` rows at most)."""

    target: DirectTarget

    def read(
        self,
        store: StateStore,
        source: ChunkSource,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> KeptChunk | None:
        read = source.read_chunk(chunk)
        reads = ChunkRows(window_id, key_columns, (), 0, read.invisible_txids)
        if not store.windows.put_rows(window_id, reads):
            return None
        return _KeptInProcess(chunk.table, key_columns, read.rows, self.target)

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
    """Read one chunk between a fresh lw and hw, keep its rows, and once the tailer recorded the
    window write the survivors into the target (see the module docstring)."""
    window = Window(uuid.uuid4().hex, dump_id, chunk.table, DumpMode.DIRECT)
    kept_parts: list[KeptChunk] = []

    def read_kept(window_id: str) -> KeptChunk | None:
        kept = read.read(store, source, window_id, chunk, key_columns)
        if kept is not None:
            kept_parts.append(kept)  # discarded below, whatever happens next
        return kept

    try:
        kept = between_watermarks(
            store,
            source,
            window,
            chunk,
            read_kept,
            window_timeout_s=window_timeout_s,
            ended="recorded",
        )
        if isinstance(kept, ChunkOutcome):
            return kept
        record = store.directs.record_of(window.window_id)
        if record is None:
            raise ChunkReadFailed(f"window {window.window_id} closed without its record")
        try:
            written = kept.write(record)
        finally:
            store.directs.committed(window.window_id)
        return ChunkOutcome(True, kept.rows, kept.last_key, written=written)
    finally:
        for part in kept_parts:
            part.discard()
