"""Direct dumps on Spark: a chunk's key sub-ranges read by Spark tasks, each of which stages its
rows into the direct target as soon as it read them; once the tailer recorded the window the
driver commits the chunk once (`direct.py` runs the window, `direct_target.py` says what a target
is). No row passes through Redis or the tailer. The tasks' functions live in this package, not
in `spark_jobs/`, because the package is what executors are sent.

A chunk is one Spark job of one task per sub-range: each task reads and stages its sub-range on
its worker's connections (`task_connections.py`; `DirectTarget.stage_chunk`: the rows as read,
unfiltered, unpositioned), stores only the read's invisible transactions and columns for the
window (`WindowStore.append_rows` with no row) and brings back its count, last key and handle.
The driver writes hw, waits for the tailer's record and commits the handles with it (the
recorded keys dropped there), and only then does the dump's progress move. A task never waits
for the tailer or the driver, so a chunk needs no more task slots than the cluster has free,
and no row is kept in Spark between jobs.

Failures. A task that dies is run again by Spark: the window is still open, so its read is
still before hw (its part is stored once, and the handle of the run that finished is the one
collected; a dead run's staged file is left to `remove_stale_staged`). A part read when the
window was already past open says so and the chunk is retried with new watermarks, as a failed
window; so is a job that fails (`ChunkJobFailed`). A task that finds the source or Redis away
says so instead of failing: the driver waits for it, spending no attempt. The handles of a
chunk that is not committed are discarded. A driver killed mid-chunk leaves the window open to
expire; the next run resumes from the last completed chunk.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.direct_target import DirectTarget, StagedRead
from airflow_provider_dblog.dump.direct import StagedChunk, stage_recorded
from airflow_provider_dblog.dump.spark_chunk import Away, SparkChunkJob, raise_source_trouble
from airflow_provider_dblog.dump.task_connections import task_connections
from airflow_provider_dblog.sources.base import ChunkSource, SourceError, SourceUnavailable
from airflow_provider_dblog.state import StateStore, StateStoreUnavailable


@dataclass(frozen=True)
class StagedPart:
    """One sub-range as its task staged it. `stored` is None when the window was past open at
    the read (the chunk is retried), `unavailable` says why the source or Redis could not be
    reached, `refused` why the source refused this worker as configured
    (`spark_chunk.PartResult`)."""

    index: int
    stored: int | None
    last_key: Key | None
    unavailable: Away | None
    handle: str | None = None
    refused: str | None = None


def stage_parts(
    config: Config,
    open_target: Callable[[Config], DirectTarget],
    window_id: str,
    key_columns: tuple[str, ...],
    parts: Iterable[tuple[int, Chunk]],
) -> list[StagedPart]:
    """A task: read its parts, store their invisible transactions and columns for the window
    and stage their rows into the target. Runs on an executor; reads passwords from its
    environment. A source or Redis gone is news for the driver, not a task failure (as
    `spark_chunk.read_parts`)."""
    staged: list[StagedPart] = []
    with task_connections(config) as connections:
        target = connections.target(open_target)
        for index, part in parts:

            def record(read: StagedRead, index: int = index) -> bool:
                stored = connections.windows.append_rows(
                    window_id, index, (), key_columns, read.invisible_txids, read.columns
                )
                return stored is not None

            try:
                read = stage_recorded(target, connections.source, part, key_columns, record)
            except (SourceUnavailable, StateStoreUnavailable) as exc:
                connections.healthy = False
                staged.append(StagedPart(index, None, None, exc))
                break
            except SourceError as exc:
                connections.healthy = False
                staged.append(StagedPart(index, None, None, None, refused=str(exc)))
                break
            if read is None:
                staged.append(StagedPart(index, None, None, None))
                continue
            staged.append(StagedPart(index, read.rows, read.last_key, None, read.handle))
    return staged


@dataclass(frozen=True)
class SparkDirectReader(SparkChunkJob):
    """The `DirectChunkReader` of the Spark dump: a chunk's sub-ranges read and staged by Spark
    tasks (see the module docstring); the driver's `target` commits, discards and prunes. Each
    task opens its own with `open_target` (`targets.direct_target_for`, which composes the
    targets above this package)."""

    target: DirectTarget
    open_target: Callable[[Config], DirectTarget]

    def read(
        self,
        store: StateStore,
        source: ChunkSource,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> StagedChunk | None:
        task = functools.partial(stage_parts, self.config, self.open_target, window_id, key_columns)
        staged = sorted(
            self._job(store, source, chunk, task, "dblog direct dump"), key=lambda p: p.index
        )
        chunk_staged = StagedChunk(
            self.target,
            chunk.table,
            key_columns,
            [p.handle for p in staged if p.handle is not None],
            sum(p.stored or 0 for p in staged),
            next((p.last_key for p in reversed(staged) if p.last_key is not None), None),
        )
        unavailable = [p.unavailable for p in staged if p.unavailable is not None]
        refused = [p.refused for p in staged if p.refused is not None]
        if unavailable or refused or any(p.stored is None for p in staged):
            chunk_staged.discard()
            raise_source_trouble(unavailable, refused)
            return None
        return chunk_staged

    def prune_tombstones(self, table: TableRef, before: Position) -> int:
        return self.target.prune_tombstones(table, before)
