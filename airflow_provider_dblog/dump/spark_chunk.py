"""One chunk of a Spark dump as Spark jobs: the chunk cut into the key sub-ranges its tasks
read, and what the driver raises when such a job fails. Shared by the sequenced reader
(`spark_jobs/dump.py`) and the direct one (`spark_direct.py`)."""

from __future__ import annotations

import math
from itertools import pairwise

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key
from airflow_provider_dblog.dump.chunk import ChunkReadFailed
from airflow_provider_dblog.sources.base import ChunkSource


class ChunkJobFailed(ChunkReadFailed):
    """A chunk's Spark job failed (a task's Redis went away, an executor was lost, after Spark's
    own task retries): the chunk is retried with new watermarks, as a failed window."""


def sub_ranges(source: ChunkSource, chunk: Chunk, tasks: int, chunk_size: int) -> list[Chunk]:
    """The chunk as up to `tasks` disjoint parts that together read exactly the chunk.

    A range chunk `(after, upto]` is cut at every `chunk_size / tasks`-th key (asked of the
    database); a key chunk's key list is sliced. A LIMIT chunk cannot be cut before it is read
    (its end is unknown): it stays one part; `run_dump(bounded_chunks=True)` plans none.
    """
    if chunk.keys is not None:
        step = math.ceil(len(chunk.keys) / tasks)
        slices = [chunk.keys[i : i + step] for i in range(0, len(chunk.keys), step)]
        return [Chunk(chunk.table, chunk.seq, keys=keys) for keys in slices] or [chunk]
    if chunk.limit is not None or chunk.upto is None or tasks <= 1:
        return [chunk]
    step = max(1, math.ceil(chunk_size / tasks))
    splits = source.split_keys(chunk.table, chunk.after, chunk.upto, step, tasks - 1)
    if splits and splits[-1] == chunk.upto:
        splits.pop()  # the last part would be (upto, upto]: empty
    bounds: list[Key | None] = [chunk.after, *splits, chunk.upto]
    return [Chunk(chunk.table, chunk.seq, after=a, upto=b) for a, b in pairwise(bounds)]
