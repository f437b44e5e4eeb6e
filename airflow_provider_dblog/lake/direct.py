"""The lake side of a direct dump: Spark tasks stage the rows of their key sub-range as they read
them (Parquet files beside the lake), and the driver, once the tailer recorded the window,
commits the chunk's staged files into the table with one merge. Tasks never commit: one commit
per chunk, made by the one process that knows the window closed.

Protocol, in order, for one chunk:
1. each task, right after its read (before hw): `stage_rows(root, table, schema, rows)` -> a
   handle (a path, picklable): the rows as read, without a position;
2. the driver, with every task's handle and the window's record:
   `commit_staged(root, table, handles, schema, record, key_columns)` drops the keys the tailer
   recorded in the window, positions the rest at the record's rows position and merges them;
   the rows the merge wrote (inserted or updated). The staged files are removed after the
   commit, or by `discard_staged` when the chunk is given up.

Staging before the record costs nothing if the chunk is retried (its files are discarded) and
lets a task end as soon as it read: no task waits for the tailer, and no row is kept in Spark.
The key filter and the position are columnar work on the driver (an anti join, constant
columns), next to the merge that reads the files anyway.

Every row is positioned just after hw, so a row the log changed after hw (a later position) is
never overwritten by the dump's, and a delete after hw, folded first, leaves a tombstone the
dump's row does not pass (`LakeTable`). Committing the same handles again is harmless (the merge
is idempotent); a handle whose file is gone was committed and removed already and is skipped.

Columns. The tailer checked at hw that the chunk was read with the table's columns then, so the
rows carry exactly those: a staged file holds the columns its read had. A column the read has
and the table lacks (an ADD COLUMN the compaction has not folded yet) is added by the commit,
marked unfolded, so the fold still writes its default into the rows before the ALTER; a commit
that creates the table (from the catalog, maybe after an ALTER the read came before) marks
unfolded the columns its rows lack. A column the table has and the read lacks is null in the
chunk's rows (dropped in the source since), or the constant default of an ADD COLUMN
positioned after hw the compaction folded before this commit (`LakeTable.added_defaults`).

The staging directory must be on storage every executor and the driver reach at the same path
(a shared file system), like the lake root itself. Files of a chunk that was never committed (a
driver killed between staging and commit) stay in `<root>/_dblog_staged/`;
`remove_stale_staged` removes those older than a given age (each compaction run does, at a day).

`LakeDirectTarget` is the same, shaped as the dump's `DirectTarget` (per table: stage, commit,
discard, prune), for a deployment whose `[lake] root` names the lake.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.direct import DirectRecord
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Row, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.direct_target import StagedRead
from airflow_provider_dblog.lake.catalog import source_lake_schema
from airflow_provider_dblog.lake.schema import LakeSchema, LakeSchemaError
from airflow_provider_dblog.lake.table import LakeTable
from airflow_provider_dblog.sources.base import ChunkSource

STAGED = "_dblog_staged"


def staging_dir(root: str | Path, table: TableRef) -> Path:
    return Path(root) / STAGED / str(table)


def stage_rows(root: str | Path, table: TableRef, schema: LakeSchema, rows: Sequence[Row]) -> str:
    """Write `rows` (JSON values, as `ChunkSource.read_chunk` returns them) as one Parquet file
    of the source columns under the lake's staging directory; its path is the handle."""
    return stage_table(root, table, schema.values_to_arrow(rows))


def stage_table(root: str | Path, table: TableRef, batch: pa.Table) -> str:
    """Write `batch` (`LakeSchema.values_to_arrow`'s, or `values_from_text`'s) as one Parquet
    file under the lake's staging directory; its path is the handle."""
    directory = staging_dir(root, table)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{uuid.uuid4().hex}.parquet"
    partial = path.with_suffix(".partial")
    pq.write_table(batch, partial)
    os.replace(partial, path)  # a handle names a complete file or none
    return str(path)


def commit_staged(
    root: str | Path,
    table: TableRef,
    handles: Sequence[str],
    schema: LakeSchema,
    record: DirectRecord,
    key_columns: Sequence[str],
) -> int:
    """Merge the staged files of one chunk into the table in one commit, but the rows of the
    keys `record` says changed in the window, all positioned at its rows position; the rows
    written (inserted or updated). Creates the table from `schema` if it does not exist yet
    (the columns the staged rows lack marked unfolded), and adds the columns of `schema` it
    lacks (an ALTER the compaction has not folded yet), marked unfolded
    (`LakeTable.add_columns`)."""
    present = [h for h in handles if Path(h).exists()]
    if not present:
        return 0
    values = pa.concat_tables([pq.read_table(h) for h in present], promote_options="default")
    if record.changed_keys and values.num_rows:
        values = _without_keys(values, schema.keys_to_arrow(record.changed_keys, key_columns))
    position = record.rows_position
    unread = [n for n in schema.names if n not in values.column_names]
    lake = LakeTable.open_or_create(root, table, schema, unread=unread)
    schema = schema.extended(lake.schema.columns)  # the compaction may have added some since
    defaults = lake.added_defaults(position)  # of an ALTER after hw the compaction folded
    batch = schema.positioned(values, position.commit, position.seq, "r", defaults)
    written = lake.merge(batch, metadata={"dblog.operation": "direct dump"})
    discard_staged(present)
    return written.rows


def _without_keys(values: pa.Table, keys: pa.Table) -> pa.Table:
    """The rows of `values` whose key is not one of `keys`' rows: an anti join of the key
    columns alone (Arrow joins no list column), then the survivors taken by row number."""
    numbered = values.select(keys.column_names).append_column(
        _ROW, pa.array(range(values.num_rows), pa.int64())
    )
    kept = numbered.join(keys, keys=keys.column_names, join_type="left anti")[_ROW]
    return values.take(kept)


_ROW = "_dblog_row"


def discard_staged(handles: Sequence[str]) -> None:
    """Remove staged files (committed, or of a chunk given up)."""
    for handle in handles:
        Path(handle).unlink(missing_ok=True)


def remove_stale_staged(root: str | Path, older_than_s: float) -> int:
    """Remove staged files older than `older_than_s` (a chunk no driver will commit: run it
    with an age longer than any dump's chunk takes); the number removed."""
    limit = time.time() - older_than_s
    removed = 0
    for path in (Path(root) / STAGED).glob("*/*.parquet"):
        if path.stat().st_mtime < limit:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


class LakeDirectTarget:
    """The lake as a direct dump's target (the `DirectTarget` protocol of
    `direct_target.py`): `stage` writes a task's part as a staged file, `commit` merges a
    chunk's files in one commit (`discard` removes them instead), `prune_tombstones` prunes a
    table's tombstones. A table's lake schema is the lake table's own once it exists, the
    source catalog's (`describe`) before; a column a read has and the lake table lacks (the
    compaction has not folded its ALTER yet) is typed by the catalog and added by the commit,
    so the rows positioned after hw carry every column the source had at hw (`schema`)."""

    def __init__(self, root: str | Path, describe: Callable[[TableRef], LakeSchema]) -> None:
        self._root = root
        self._describe = describe
        self._schemas: dict[TableRef, LakeSchema] = {}
        self._committing = threading.Lock()

    @classmethod
    def from_config(cls, config: Config) -> LakeDirectTarget:
        """The lake of the deployment's `[lake] root`, new tables typed by its source."""
        if config.lake_root is None:
            raise LakeSchemaError("the configuration has no [lake] root: no lake to write")
        source = config.source
        return cls(config.lake_root, lambda table: source_lake_schema(source, table))

    def schema(self, table: TableRef, columns: Iterable[str] = ()) -> LakeSchema:
        """The schema rows read with `columns` are staged and committed with: the lake table's
        own once it exists (the catalog's before), and the catalog's type for each of `columns`
        the table lacks (an ALTER the compaction has not folded yet: the commit adds it). Kept
        until a read has a column it lacks."""
        wanted = set(columns)
        found = self._schemas.get(table)
        if found is None or not wanted <= set(found.names):
            if LakeTable.exists(self._root, table):
                found = LakeTable.open(self._root, table).schema
                if not wanted <= set(found.names):
                    found = found.extended(self._describe(table).columns)
            else:
                found = self._describe(table)
            self._schemas[table] = found
        return found

    def stage(self, table: TableRef, rows: Sequence[Row]) -> str:
        """Stage `rows`: the columns they have alone (a column they lack is the commit's to
        fill)."""
        if not rows:
            return stage_rows(self._root, table, self.schema(table), rows)
        columns = rows[0].keys()
        schema = self.schema(table, columns).restricted(columns)
        return stage_rows(self._root, table, schema, rows)

    def stage_chunk(
        self, source: ChunkSource, chunk: Chunk, key_columns: Sequence[str]
    ) -> StagedRead:
        """The rows come as the server's text in columns (`ChunkSource.read_chunk_text`), no
        Python object per row."""
        read = source.read_chunk_text(chunk)
        columns = tuple(c.name for c in read.columns)
        schema = self.schema(chunk.table, columns).restricted(columns)
        batch = schema.values_from_text(read.columns)
        handle = stage_table(self._root, chunk.table, batch)
        return StagedRead(handle, read.rows, read.last_key, read.invisible_txids, columns)

    def commit(
        self,
        table: TableRef,
        handles: Sequence[str],
        record: DirectRecord,
        key_columns: Sequence[str],
    ) -> int:
        # One commit at a time from this driver: chunks in flight together would otherwise
        # race for the table's next version and merge again after losing.
        # The staged files' columns (their Parquet footers): Spark tasks staged them with
        # schemas of their own, which may have columns this driver's lacks.
        staged = {n for h in handles if Path(h).exists() for n in pq.read_schema(h).names}
        with self._committing:
            schema = self.schema(table, staged)
            return commit_staged(self._root, table, handles, schema, record, key_columns)

    def discard(self, table: TableRef, handles: Sequence[str]) -> None:
        discard_staged(handles)

    def prune_tombstones(self, table: TableRef, before: Position) -> int:
        if not LakeTable.exists(self._root, table):
            return 0
        return LakeTable.open(self._root, table).prune_tombstones(before)

    def close(self) -> None:
        self._schemas.clear()
