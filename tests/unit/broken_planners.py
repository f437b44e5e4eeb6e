"""Deliberately broken dump planners for filtered dumps: the generated histories must catch
each of them (tests/unit/core/test_reconciler_properties.py)."""

from __future__ import annotations

from dataclasses import replace

from airflow_provider_dblog.core.dump_plan import Chunk, TablePlanner
from airflow_provider_dblog.core.event import Key


class TakesASparseChunkAsTheLast(TablePlanner):
    """Broken: pages a filtered dump by the rows its filter kept. Its chunks are read like
    production's (key ranges bounded by split keys, the filter narrowing each), but each is
    completed as a LIMIT chunk of `chunk_size` rows: one that matched fewer rows is taken as
    the table's last, so the ranges after a sparse one are never read."""

    def complete(self, chunk: Chunk, rows_read: int, last_key: Key | None) -> None:
        if chunk.where is not None and chunk.keys is None and rows_read < self.chunk_size:
            chunk = replace(chunk, limit=self.chunk_size)  # fewer rows than the LIMIT: the end
        super().complete(chunk, rows_read, last_key)


class FilterDrivesLimitChunks(TablePlanner):
    """Broken: a filter does not imply `bounded`, so at parallelism 1 a filtered dump walks
    LIMIT chunks of the matching rows (`... AND (COND) ORDER BY key LIMIT n`), each starting
    after the last row the filter kept. Every row it should emit is emitted, but a chunk scans
    the table as far as it takes to find `n` matching rows: the filter drives the paging."""

    def __post_init__(self) -> None:
        bounded = self.bounded
        super().__post_init__()
        self.bounded = bounded


BROKEN_PLANNERS: tuple[type[TablePlanner], ...] = (
    TakesASparseChunkAsTheLast,
    FilterDrivesLimitChunks,
)
