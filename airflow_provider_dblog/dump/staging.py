"""What a direct target's `stage_chunk` gives back (`direct_target.py`): the staged part's
handle and what the dump needs of the read. Apart, so targets can import it without the rest
of the dump."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key, Row, TableRef, key_of
from airflow_provider_dblog.sources.base import ChunkSource


@dataclass(frozen=True)
class StagedRead:
    """A chunk, or a part of one, read and staged by `DirectTarget.stage_chunk`."""

    handle: str
    rows: int
    last_key: Key | None
    """The key of the last row read (None if none was)."""
    invisible_txids: frozenset[int]
    """The transactions the read's snapshot did not see (`ChunkRead.invisible_txids`)."""
    columns: tuple[str, ...]
    """The columns the read had (the source table's then; empty when a row-by-row read found
    no row): stored for the window, so the tailer checks them at hw as a sequenced chunk's."""


def stage_rows_read(
    stage: Callable[[TableRef, Sequence[Row]], str],
    source: ChunkSource,
    chunk: Chunk,
    key_columns: Sequence[str],
) -> StagedRead:
    """`stage_chunk` of a target that stages rows: `source.read_chunk`, then `stage`."""
    read = source.read_chunk(chunk)
    last_key = key_of(read.rows[-1], key_columns) if read.rows else None
    columns = tuple(read.rows[0]) if read.rows else ()
    handle = stage(chunk.table, read.rows)
    return StagedRead(handle, len(read.rows), last_key, read.invisible_txids, columns)
