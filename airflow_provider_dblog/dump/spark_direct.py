"""Direct dumps on Spark: a chunk's key sub-ranges read by Spark tasks, their rows kept by Spark
until the tailer recorded the window, then staged into the direct target by Spark tasks; the
driver commits the chunk once (`direct.py` runs the window, `direct_target.py` says what a
target is). No row passes through Redis, the tailer or the driver. The tasks' functions live in
this package, not in `spark_jobs/`, because the package is what executors are sent.

A task cannot wait for the driver mid-task, so a chunk is two Spark jobs on one persisted RDD of
one element per sub-range (`KEEP`: executor memory, spilled to the executor's local disk when
large; one chunk, `chunk_size` rows at most, per window in flight):
1. read: each task reads its sub-range on its own connection and stores only the read's
   invisible transactions for the window (`WindowStore.append_rows` with no row); the job
   brings back each part's count and last key, not its rows. The driver writes hw and waits for
   the tailer's record.
2. write: each task takes its part from Spark's cache (Spark runs it where the block is), drops
   the recorded keys, `stage`s the rest positioned just after hw and returns the handle; the
   driver commits the handles, and only then does the dump's progress move.

Failures. A task that dies in the read job is run again by Spark: the window is still open, so
its read is still before hw (its part is stored once). A part whose cached block was lost before
the write job (its executor died) would be read again after hw, a state that is not the state at
hw: that read finds the window past open, the part says so, the write job fails and the chunk is
retried with new watermarks (`ChunkJobFailed`), as a failed window. A driver killed mid-chunk
takes the cache with it and leaves the window open to expire; the next run resumes from the last
completed chunk. What a failed chunk staged already is harmless (`direct.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from pyspark import RDD, SparkContext, StorageLevel

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.direct import DirectRecord
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key, Row, TableRef, key_of
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.dump.direct import KeptChunk
from airflow_provider_dblog.dump.direct_target import DirectTarget, direct_target_for
from airflow_provider_dblog.dump.spark_chunk import ChunkJobFailed, sub_ranges
from airflow_provider_dblog.sources.base import ChunkSource, SourceUnavailable
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import StateStore, WindowStore

KEEP = StorageLevel.MEMORY_AND_DISK
"""Where a direct chunk's rows wait for the record: executor memory, or its local disk."""


@dataclass(frozen=True)
class KeptPart:
    """One sub-range as its read task kept it. `stored` is None when the window was past open
    at the read (the chunk is retried), `unavailable` says why the source could not be read."""

    index: int
    stored: int | None
    last_key: Key | None
    unavailable: str | None
    rows: Sequence[Row] = ()

    def summary(self) -> KeptPart:
        """The part without its rows: what the read job brings back to the driver."""
        return KeptPart(self.index, self.stored, self.last_key, self.unavailable)


def read_kept_parts(
    config: Config,
    window_id: str,
    key_columns: tuple[str, ...],
    parts: Iterable[tuple[int, Chunk]],
) -> Iterator[KeptPart]:
    """A read task: read its parts and store their invisible transactions for the window; the
    rows stay in the element Spark caches. Runs on an executor; reads passwords from its
    environment. A source gone is news for the driver, not a task failure (as `read_parts`)."""
    source = source_for(config.source).chunk_source()
    client = config.redis_client()
    windows = WindowStore(client, config.source.name)
    try:
        for index, part in parts:
            try:
                read = source.read_chunk(part)
            except SourceUnavailable as exc:
                yield KeptPart(index, None, None, str(exc))
                return
            stored = windows.append_rows(window_id, index, (), key_columns, read.invisible_txids)
            if stored is None:
                yield KeptPart(index, None, None, None)
                continue
            last = key_of(read.rows[-1], key_columns) if read.rows else None
            yield KeptPart(index, len(read.rows), last, None, read.rows)
    finally:
        source.close()
        client.close()


def stage_kept_parts(
    config: Config,
    table: TableRef,
    key_columns: tuple[str, ...],
    record: DirectRecord,
    parts: Iterable[KeptPart],
) -> Iterator[str]:
    """A write task: its parts' survivors staged into the target, positioned after hw; yields
    the handles. A part read again after hw (its cached block was lost) fails the task."""
    target = direct_target_for(config)
    try:
        for part in parts:
            if part.stored is None:
                raise ChunkJobFailed(
                    f"part {part.index} of window {record.window_id} was lost before its rows "
                    "were written (read again, the window was past open)"
                )
            survivors = record.survivors(part.rows, key_columns)
            yield target.stage(table, survivors, record.rows_position)
    finally:
        target.close()


@dataclass
class _KeptBySpark:
    """A chunk whose parts Spark keeps (`KeptChunk`)."""

    sc: SparkContext
    config: Config
    target: DirectTarget
    table: TableRef
    key_columns: tuple[str, ...]
    kept: RDD[KeptPart]
    parts: Sequence[KeptPart]

    @property
    def rows(self) -> int:
        return sum(part.stored or 0 for part in self.parts)

    @property
    def last_key(self) -> Key | None:
        keys = [part.last_key for part in self.parts if part.last_key is not None]
        return keys[-1] if keys else None

    def write(self, record: DirectRecord) -> int:
        task = functools.partial(
            stage_kept_parts, self.config, self.table, self.key_columns, record
        )
        try:
            handles = self.kept.mapPartitions(task).collect()
        except Exception as exc:  # py4j's error for a failed job: the chunk is retried
            raise ChunkJobFailed(
                f"the write job of window {record.window_id} failed: {exc}"
            ) from exc
        return self.target.commit(self.table, handles)

    def discard(self) -> None:
        self.kept.unpersist(blocking=False)


@dataclass(frozen=True)
class SparkDirectReader:
    """The `DirectChunkReader` of the Spark dump: a chunk's sub-ranges read and kept by Spark
    tasks (see the module docstring); the driver's `target` commits and prunes."""

    sc: SparkContext
    config: Config
    dump_id: str
    tasks: int
    default_chunk_size: int
    target: DirectTarget

    def read(
        self,
        store: StateStore,
        source: ChunkSource,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> KeptChunk | None:
        controls = store.dumps.controls(self.dump_id)
        chunk_size = controls.chunk_size if controls else self.default_chunk_size
        parts = sub_ranges(source, chunk, self.tasks, chunk_size)
        task = functools.partial(read_kept_parts, self.config, window_id, key_columns)
        self.sc.setJobDescription(
            f"dblog direct dump {self.dump_id}: {chunk.table} chunk {chunk.seq}"
        )
        kept = (
            self.sc.parallelize(list(enumerate(parts)), len(parts))
            .mapPartitions(task)
            .persist(KEEP)
        )
        try:
            summaries = sorted(kept.map(KeptPart.summary).collect(), key=lambda p: p.index)
        except Exception as exc:  # py4j's error for a failed job: the chunk is retried
            kept.unpersist(blocking=False)
            raise ChunkJobFailed(f"the Spark job of chunk {chunk.seq} failed: {exc}") from exc
        unavailable = [p.unavailable for p in summaries if p.unavailable is not None]
        if unavailable or any(p.stored is None for p in summaries):
            kept.unpersist(blocking=False)
            if unavailable:
                raise SourceUnavailable(f"a Spark task could not read the source: {unavailable[0]}")
            return None
        return _KeptBySpark(
            self.sc, self.config, self.target, chunk.table, key_columns, kept, summaries
        )

    def prune_tombstones(self, table: TableRef, before: Position) -> int:
        return self.target.prune_tombstones(table, before)
