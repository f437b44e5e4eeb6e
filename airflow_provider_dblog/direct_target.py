"""Where a direct dump writes its rows: a target keyed by primary key that keeps, per key, the row
with the highest position (see `core/direct.py`).

A chunk's rows are staged where they were read, before the window closes: each reader (a Spark
task, or the `dblog dump` process) calls `stage_chunk` with its part of the chunk, and the
target reads it from the source (as it reads best: the lake takes PostgreSQL's rows as text
columns into Arrow) and keeps the rows as read. Once the tailer recorded the window the dump's
driver calls `commit` once with every part's handle and the record: the target drops the keys
that changed in the window and writes the rest at the record's rows position. Only after
`commit` returned does the dump move its progress; a chunk given up is `discard`ed. A handle is
text (it travels from a Spark executor back to the driver); what it holds is the target's
business: a lake stages a data file and its handle is the path, SQL apply's handle carries the
rows themselves (JSON), which the driver upserts.

Which target a deployment has is its configuration's: the lake when it has a `[lake] root`
(`lake/direct.py`, `LakeDirectTarget`), else the SQL-apply output in monotonic mode
(`outputs/sql_apply/direct.py`, `SqlDirectTarget`). A deployment whose output is a stream that
must carry rows in order (NDJSON, Redis Stream) has no direct target: a direct dump is refused
there before anything is stored. `targets.direct_target_for` opens it.

The protocol lives below the dump and the targets: `dump/`, `outputs/` and `lake/` import this
module, and it imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from airflow_provider_dblog.core.direct import DirectRecord, DumpMode
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import Key, Row, TableRef, key_of
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.sources.base import ChunkSource

if TYPE_CHECKING:  # config.py imports the tailer, which imports the outputs, which import this
    from airflow_provider_dblog.config import Config


@dataclass(frozen=True)
class StagedRead:
    """A chunk, or a part of one, read and staged by `DirectTarget.stage_chunk`: the staged
    part's handle and what the dump needs of the read."""

    handle: str
    rows: int
    last_key: Key | None
    """The key of the last row read (None if none was)."""
    invisible_txids: frozenset[int]
    """The transactions the read's snapshot did not see (`ChunkRead.invisible_txids`)."""
    columns: tuple[str, ...]
    """The columns the read had (the source table's then; empty when a row-by-row read found
    no row): stored for the window, so the tailer checks them at hw as a sequenced chunk's."""


class DirectTarget(Protocol):
    """A target direct dumps write into. Each method may be called from any process that has
    the deployment's configuration: open one with `targets.direct_target_for` where it is
    needed."""

    def stage_chunk(
        self, source: ChunkSource, chunk: Chunk, key_columns: Sequence[str]
    ) -> StagedRead:
        """Read `chunk` from `source` (a non-stale read, as `ChunkSource.read_chunk`) and keep
        its rows, as read, for the chunk's commit; the handle the driver passes to `commit`
        (or `discard`), and what the dump needs of the read."""
        ...

    def commit(
        self,
        table: TableRef,
        handles: Sequence[str],
        record: DirectRecord,
        key_columns: Sequence[str],
    ) -> int:
        """Write every staged part of one chunk of `table` but the rows whose key (the values
        of `key_columns`) `record` lists as changed in the window, all positioned at
        `record.rows_position`; returns the rows written. A row that an event at a higher
        position already reached (or deleted) must not be overwritten. Called once per chunk,
        by the driver, after every part was staged."""
        ...

    def discard(self, table: TableRef, handles: Sequence[str]) -> None:
        """Forget staged parts of a chunk that will not be committed (it is retried)."""
        ...

    def prune_tombstones(self, table: TableRef, before: Position) -> int:
        """Forget the deletes of `table` positioned before `before` (a tombstone horizon:
        `core.direct.tombstone_horizon`); returns how many were forgotten."""
        ...

    def close(self) -> None: ...


def default_mode(config: Config) -> DumpMode:
    """The mode of a dump that names none: direct in a deployment with a lake (its rows go
    into the lake tables without passing through the tailer), else sequenced, the one every
    output takes (SQL apply keeps sequenced dumps by default, so an existing deployment's dumps
    behave as they did). A read-only source's dumps are sequenced."""
    if config.lake_root is None or config.source.read_only:
        return DumpMode.SEQUENCED
    return DumpMode.DIRECT


def check_direct_target(config: Config) -> None:
    """Refuse a direct dump where no target keeps rows by key and position."""
    if direct_target_kind(config) is None:
        output = config.output.get("type")
        raise InvalidRequest(
            "a direct dump needs a target keyed by primary key that keeps the highest position "
            "per key (a [lake] root, or the sql_apply output with monotonic = true); this "
            f"deployment has no lake and its output is {output!r}, a stream that must carry the "
            "rows in order: dump with mode 'sequenced'"
        )


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


def direct_target_kind(config: Config) -> Literal["lake", "sql_apply"] | None:
    """Which direct target the deployment has (see the module docstring); None: none."""
    if config.lake_root is not None:
        return "lake"
    output = config.output
    if output.get("type") == "sql_apply" and output.get("monotonic") is True:
        return "sql_apply"
    return None
