"""A verify chunk's two reads as Spark jobs (`chunk.ChunkHasher`), the chunk cut into the key
sub-ranges a Spark dump's is (`dump.spark_chunk.sub_ranges`), one task a part.

Inside the inner window each task reads its part of the source, stores what the read saw for
the tailer's check at hw (its transactions and columns, no row, as a direct dump's task does)
and hashes the rows as the target would hold them (`TargetReader.hash_rows`). Once the target
caught up, each task reads its part of the target as hashes (`TargetReader.read_hashes`). Only
hashes reach the driver, which compares them as `dblog verify` does: the parts are disjoint
key ranges (or slices of a key list) that together are the chunk, so each side's hashes are the
ones the in-process read would give.

A task opens the target's reader from the configuration as the driver does
(`verify.targets.target_reader_for`): the workers need the SQL target's `dsn_env` in their
environment, or the lake's root and event files at the same path. A worker keeps the reader
for its next task, as it keeps its source and Redis connections (`dump/task_connections.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyspark import SparkContext

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.core.event import Key
from airflow_provider_dblog.dump.spark_chunk import Away, ChunkJobFailed, sub_ranges
from airflow_provider_dblog.dump.task_connections import task_connections
from airflow_provider_dblog.sources.base import ChunkSource, SourceError, SourceUnavailable
from airflow_provider_dblog.state import StateStore, StateStoreUnavailable
from airflow_provider_dblog.verify.reader import TargetReader
from airflow_provider_dblog.verify.targets import target_reader_for


@dataclass(frozen=True)
class HashedPart:
    """One part as its task read it: `hashes` by key (None: the inner window was past open,
    the chunk is read again), or why a server could not be reached (`unavailable`: the
    source, the target or Redis away) or refused the worker (`refused`: a TLS file it lacks,
    the target's `dsn_env` not set on it)."""

    index: int
    hashes: dict[Key, str] | None
    unavailable: Away | None = None
    refused: str | None = None


@dataclass
class _KeptTarget:
    config: Config
    target: str
    reader: TargetReader
    healthy: bool = True


_kept: _KeptTarget | None = None
"""The target reader the last task of this worker handed on."""


@contextmanager
def _task_target(config: Config, target: str) -> Iterator[_KeptTarget]:
    """The target reader this worker kept for `config` and `target`, or a new one; kept for
    the next task when this one ends without an error and `healthy`."""
    global _kept
    kept, _kept = _kept, None
    if kept is not None and (kept.config, kept.target) != (config, target):
        kept.reader.close()
        kept = None
    if kept is None:
        kept = _KeptTarget(config, target, target_reader_for(config, target))
    try:
        yield kept
    except BaseException:
        kept.reader.close()
        raise
    if kept.healthy:
        _kept = kept
    else:
        kept.reader.close()


def hash_source_parts(
    config: Config,
    target: str,
    window_id: str,
    key_columns: tuple[str, ...],
    parts: Iterable[tuple[int, Chunk]],
) -> list[HashedPart]:
    """A task: read its parts of the source, store each read's transactions and columns for the
    inner window, and hash the rows as `target` would hold them. A server gone, or refusing
    the worker, is news for the driver, not a task failure (as `dump.spark_chunk.read_parts`)."""
    hashed: list[HashedPart] = []
    with task_connections(config) as connections:
        for index, part in parts:
            try:
                with _task_target(config, target) as kept:
                    read = connections.source.read_chunk(part)
                    snapshot = read.snapshot
                    stored = connections.windows.append_rows(
                        window_id,
                        index,
                        (),
                        key_columns,
                        read.invisible_txids,
                        tuple(read.rows[0]) if read.rows else (),
                        hw=None if snapshot is None else snapshot.hw,
                        snapshot_end=snapshot.hw if snapshot and snapshot.exact else None,
                    )
                    hashes = None
                    if stored is not None:
                        hashes = kept.reader.hash_rows(part.table, key_columns, read.rows)
            except (SourceUnavailable, StateStoreUnavailable) as exc:
                connections.healthy = False
                hashed.append(HashedPart(index, None, unavailable=exc))
                break
            except DBLogError as exc:
                connections.healthy = False
                hashed.append(HashedPart(index, None, refused=str(exc)))
                break
            hashed.append(HashedPart(index, hashes))
    return hashed


def hash_target_parts(
    config: Config, target: str, parts: Iterable[tuple[int, Chunk]]
) -> list[HashedPart]:
    """A task: read its parts of the target as row hashes by key."""
    hashed: list[HashedPart] = []
    with _task_target(config, target) as kept:
        for index, part in parts:
            try:
                hashed.append(HashedPart(index, kept.reader.read_hashes(part)))
            except SourceUnavailable as exc:
                kept.healthy = False
                hashed.append(HashedPart(index, None, unavailable=exc))
                break
            except DBLogError as exc:
                kept.healthy = False
                hashed.append(HashedPart(index, None, refused=str(exc)))
                break
    return hashed


@dataclass(frozen=True)
class SparkChunkHasher:
    """The `ChunkHasher` of a Spark verify: each side of a chunk one Spark job of one task per
    sub-range, cut at the run's current chunk size (`verify-throttle` may change it)."""

    sc: SparkContext
    config: Config
    verify_id: str
    target: str
    tasks: int
    default_chunk_size: int

    def source_hashes(
        self,
        store: StateStore,
        source: ChunkSource,
        target: TargetReader,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> dict[Key, str] | None:
        task = functools.partial(
            hash_source_parts, self.config, self.target, window_id, key_columns
        )
        return _combine(self._job(store, source, chunk, task, "source"), "the source")

    def target_hashes(
        self, store: StateStore, source: ChunkSource, target: TargetReader, chunk: Chunk
    ) -> dict[Key, str]:
        task = functools.partial(hash_target_parts, self.config, self.target)
        hashes = _combine(self._job(store, source, chunk, task, "target"), target.name)
        assert hashes is not None, "a target's part is always read"
        return hashes

    def _job(
        self,
        store: StateStore,
        source: ChunkSource,
        chunk: Chunk,
        task: Callable[[Iterable[tuple[int, Chunk]]], list[HashedPart]],
        side: str,
    ) -> list[HashedPart]:
        controls = store.verifies.controls(self.verify_id)
        chunk_size = controls.chunk_size if controls else self.default_chunk_size
        parts = sub_ranges(source, chunk, self.tasks, chunk_size)
        description = f"dblog verify {self.verify_id}: {chunk.table} chunk {chunk.seq}, {side}"
        self.sc.setJobDescription(description)
        try:
            rdd: Any = self.sc.parallelize(list(enumerate(parts)), len(parts))
            results: list[HashedPart] = rdd.mapPartitions(task).collect()
        except Exception as exc:  # py4j's error for a failed job: the chunk is read again
            raise ChunkJobFailed(f"the Spark job of chunk {chunk.seq} failed: {exc}") from exc
        return results


def _combine(parts: Sequence[HashedPart], side: str) -> dict[Key, str] | None:
    """One side's hashes from its parts', in key order (None if a part found the window past
    open). A server a task could not reach is raised as its error (the run ends as `dblog
    verify` ends on it); one that refused a worker, as `SourceError`."""
    refused = [p.refused for p in parts if p.refused is not None]
    if refused:
        raise SourceError(f"a Spark task cannot read {side}: {refused[0]}")
    away = [p.unavailable for p in parts if p.unavailable is not None]
    if away:
        raise type(away[0])(f"a Spark task could not reach {side}: {away[0]}")
    hashes: dict[Key, str] = {}
    for part in sorted(parts, key=lambda p: p.index):
        if part.hashes is None:
            return None
        hashes.update(part.hashes)
    return hashes
