"""A chunk of a Spark dump as one Spark job: the chunk cut into the key sub-ranges its tasks
read, what the driver raises when such a job fails, and the reader of a sequenced dump
(`SparkChunkReader`), whose tasks append their rows to the window in Redis for the tailer to
emit. The direct dump's reader (`spark_direct.py`) cuts its chunks alike. The tasks' functions
live in this package, not in `spark_jobs/`, because the package is what executors are sent."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TypeVar

from pyspark import SparkContext

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key, key_of
from airflow_provider_dblog.dump.chunk import ChunkReadFailed, StoredChunk
from airflow_provider_dblog.dump.task_connections import task_connections
from airflow_provider_dblog.sources.base import ChunkSource, SourceError, SourceUnavailable
from airflow_provider_dblog.state import StateStore, StateStoreUnavailable

T = TypeVar("T")


class ChunkJobFailed(ChunkReadFailed):
    """A chunk's Spark job failed (an executor was lost, after Spark's own task retries): the
    chunk is retried with new watermarks, as a failed window."""


def sub_ranges(source: ChunkSource, chunk: Chunk, tasks: int, chunk_size: int) -> list[Chunk]:
    """The chunk as up to `tasks` disjoint parts that together read exactly the chunk.

    A range chunk `(after, upto]` is cut at every `chunk_size / tasks`-th key (asked of the
    database); a key chunk's key list is sliced; each part keeps the chunk's filter. A LIMIT
    chunk cannot be cut before it is read (its end is unknown): it stays one part;
    `run_dump(bounded_chunks=True)` plans none.
    """
    if chunk.keys is not None:
        step = math.ceil(len(chunk.keys) / tasks)
        slices = [chunk.keys[i : i + step] for i in range(0, len(chunk.keys), step)]
        return [dataclasses.replace(chunk, keys=keys) for keys in slices] or [chunk]
    if chunk.limit is not None or chunk.upto is None or tasks <= 1:
        return [chunk]
    step = max(1, math.ceil(chunk_size / tasks))
    splits = source.split_keys(chunk.table, chunk.after, chunk.upto, step, tasks - 1)
    if splits and splits[-1] == chunk.upto:
        splits.pop()  # the last part would be (upto, upto]: empty
    bounds: list[Key | None] = [chunk.after, *splits, chunk.upto]
    return [dataclasses.replace(chunk, after=a, upto=b) for a, b in pairwise(bounds)]


Away = SourceUnavailable | StateStoreUnavailable
"""A server a task could not reach: the source (or its replica, behind) or Redis."""
PartResult = tuple[int, int | None, Key | None, Away | None, str | None]
"""What a task sends back: part index, rows stored (None: the window ended), last key read, why
the source or Redis could not be reached (None: they were; the error itself, so that a replica
behind stays `ReplicaBehind` on the driver), and why the source refuses this worker's
connection (a `SourceError`: a TLS file the worker lacks, a certificate that does not verify;
None: it did not)."""


def read_parts(
    config: Config,
    window_id: str,
    key_columns: tuple[str, ...],
    parts: Iterable[tuple[int, Chunk]],
) -> list[PartResult]:
    """One Spark task: read its parts on the worker's connections (`task_connections`) and
    append the rows to the window in Redis. Runs on an executor; reads passwords from its
    environment. A source or a Redis that went away ends the task with that news rather than
    an error: Spark retrying the task at once would only find it gone again, and a failed job
    would spend one of the chunk's attempts, while the driver waits for it (within its
    patience, spending none) and retries the chunk once it is back. A source that refuses the
    worker as configured is news too: every retry would meet it again, so the driver fails the
    dump with its message."""
    results: list[PartResult] = []
    with task_connections(config) as connections:
        for index, part in parts:
            try:
                read = connections.source.read_chunk(part)
            except SourceUnavailable as exc:
                connections.healthy = False
                results.append((index, None, None, exc, None))
                break
            except SourceError as exc:
                connections.healthy = False
                results.append((index, None, None, None, str(exc)))
                break
            snapshot = read.snapshot
            try:
                stored = connections.windows.append_rows(
                    window_id,
                    index,
                    read.rows,
                    key_columns,
                    read.invisible_txids,
                    hw=None if snapshot is None else snapshot.hw,
                    snapshot_end=snapshot.hw if snapshot is not None and snapshot.exact else None,
                )
            except StateStoreUnavailable as exc:
                connections.healthy = False
                results.append((index, None, None, exc, None))
                break
            last = key_of(read.rows[-1], key_columns) if read.rows else None
            results.append((index, stored, last, None, None))
    return results


@dataclass(frozen=True)
class SparkChunkJob:
    """What both Spark chunk readers share: a chunk read as one Spark job of one task per
    sub-range, the chunk cut at the dump's current chunk size."""

    sc: SparkContext
    config: Config
    dump_id: str
    tasks: int
    default_chunk_size: int

    def _job(
        self,
        store: StateStore,
        source: ChunkSource,
        chunk: Chunk,
        task: Callable[[Iterable[tuple[int, Chunk]]], list[T]],
        what: str,
    ) -> list[T]:
        """The results of `task` run on the chunk's numbered sub-ranges, a task each."""
        controls = store.dumps.controls(self.dump_id)
        chunk_size = controls.chunk_size if controls else self.default_chunk_size
        parts = sub_ranges(source, chunk, self.tasks, chunk_size)
        self.sc.setJobDescription(f"{what} {self.dump_id}: {chunk.table} chunk {chunk.seq}")
        try:
            return (
                self.sc.parallelize(list(enumerate(parts)), len(parts))
                .mapPartitions(task)
                .collect()
            )
        except Exception as exc:  # py4j's error for a failed job: the chunk is retried
            raise ChunkJobFailed(f"the Spark job of chunk {chunk.seq} failed: {exc}") from exc


@dataclass(frozen=True)
class SparkChunkReader(SparkChunkJob):
    """The `ChunkReader` of the Spark dump: each chunk one Spark job, one task per sub-range,
    the rows appended to the window in Redis."""

    def __call__(
        self,
        store: StateStore,
        source: ChunkSource,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> StoredChunk | None:
        task = functools.partial(read_parts, self.config, window_id, key_columns)
        return _combine(self._job(store, source, chunk, task, "dblog dump"))


def raise_source_trouble(unavailable: Sequence[Away], refused: Sequence[str]) -> None:
    """What the tasks said of the servers, as the driver raises it: `SourceError` if the source
    refused a worker (the dump fails), the task's `SourceUnavailable` (or `ReplicaBehind`) or
    `StateStoreUnavailable` if the source or Redis was away or behind (the runner waits)."""
    if refused:
        raise SourceError(f"a Spark task cannot use the source: {refused[0]}")
    if unavailable:
        first = unavailable[0]
        if isinstance(first, StateStoreUnavailable):
            raise type(first)(f"a Spark task could not reach the state store: {first}")
        raise type(first)(f"a Spark task could not read the source: {first}")


def _combine(results: Sequence[PartResult]) -> StoredChunk | None:
    """The chunk's outcome from its parts' (None if any part found the window ended); raises
    as `raise_source_trouble` if a part could not use the source."""
    raise_source_trouble(
        [r[3] for r in results if r[3] is not None], [r[4] for r in results if r[4] is not None]
    )
    if any(stored is None for _, stored, _, _, _ in results):
        return None
    ordered = sorted(results, key=lambda r: r[0])
    last_keys = [last for _, _, last, _, _ in ordered if last is not None]
    return StoredChunk(
        sum(stored or 0 for _, stored, _, _, _ in ordered), last_keys[-1] if last_keys else None
    )
