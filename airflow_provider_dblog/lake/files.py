"""A lake table's Delta table as stored: what it holds (its properties, rows and version) and
its data files, listed with their key ranges and read less the rows their deletion vectors
delete.

`LakeTable` (`table.py`) is the one object callers use; its code is layered by idea, each a
class over the one below: the files here, the deletion marking (`marking.py`), the merge
(`merge.py`), and the captured table's life (`table.py`).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote, urlparse

import numpy
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import ColumnProperties, DeltaTable, WriterProperties
from deltalake.exceptions import CommitFailedError

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.lake import delta_log
from airflow_provider_dblog.lake.clustered import DataFile, Key
from airflow_provider_dblog.lake.deletion_vectors import stored_rows
from airflow_provider_dblog.lake.schema import COMMIT, DELETED, LakeSchema

KEY_PROPERTY = "dblog.key"
SOURCE_PROPERTY = "dblog.source"
FLOOR_PROPERTY = "dblog.floor"
FOLDED_SCHEMA_PROPERTY = "dblog.compaction.schema"
"""The last schema event the compaction folded into the table: JSON `{"at": [commit, seq],
"columns": [name, ...]}` (`folded_schema`)."""
DELETION_VECTORS_PROPERTY = "delta.enableDeletionVectors"
"""Delta's table property: "false" turns deletion vectors off in a table that has the feature
(`deletion_vectors`)."""
PROGRESS_COMMIT = "dblog.compaction.commit"
PROGRESS_SEQ = "dblog.compaction.seq"
ATTEMPTS = 30
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class FoldedSchema:
    """A schema event the compaction folded: its position and the columns it listed."""

    at: Position
    columns: frozenset[str]


@dataclass(frozen=True, slots=True)
class Written:
    """What one merge did to the table's rows."""

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    version: int | None = None

    @property
    def rows(self) -> int:
        return self.inserted + self.updated


class TableFiles:
    """A captured table's Delta table under a lake root (a local path here), as stored."""

    def __init__(self, table: TableRef, delta: DeltaTable) -> None:
        self.table = table
        self._delta = delta
        self.directory = unquote(urlparse(delta.table_uri).path)
        """The table's directory (a local path)."""

    # -- what the table holds -------------------------------------------------------------------

    @property
    def delta(self) -> DeltaTable:
        return self._delta

    @property
    def version(self) -> int:
        return self._delta.version()

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(json.loads(self._properties()[KEY_PROPERTY]))

    @property
    def schema(self) -> LakeSchema:
        """The table's lake schema (its columns with their source types)."""
        source = self._properties()[SOURCE_PROPERTY]
        return LakeSchema.from_arrow(self.table, self.arrow_schema, self.key, source)

    @property
    def floor(self) -> Position | None:
        """The position of the last truncate folded in, if any."""
        text = self._properties().get(FLOOR_PROPERTY)
        if text is None:
            return None
        commit, seq = text.split(",")
        return Position(int(commit), int(seq))

    @property
    def folded_schema(self) -> FoldedSchema | None:
        """The last schema event the compaction folded into the table, if any."""
        text = self._properties().get(FOLDED_SCHEMA_PROPERTY)
        if text is None:
            return None
        found = json.loads(text)
        return FoldedSchema(Position.from_json(found["at"]), frozenset(found["columns"]))

    @property
    def progress(self) -> Position | None:
        """The position of the last change event the compaction folded into the table."""
        commit = self._delta.transaction_version(PROGRESS_COMMIT)
        seq = self._delta.transaction_version(PROGRESS_SEQ)
        return None if commit is None or seq is None else Position(commit, seq)

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema(self._delta.schema().to_arrow())

    def _properties(self) -> Mapping[str, str]:
        return self._delta.metadata().configuration

    def rows(self, *, include_tombstones: bool = False) -> pa.Table:
        """The table's rows (the current ones: tombstones left out unless asked for)."""
        if self.deletion_vectors:  # delta-rs's pyarrow reader refuses them, its engine not
            found = pa.table(self._delta.scan()).cast(self.arrow_schema)
        else:
            found = pa.table(self._delta.to_pyarrow_table())
        if not include_tombstones:
            found = found.filter(pc.invert(found[DELETED]))
        return found

    def refresh(self) -> None:
        self._delta.update_incremental()

    @property
    def deletion_vectors(self) -> bool:
        """Writes mark the rows they replace deleted (`MarkingTable._mark`) instead of
        rewriting files: the table has Delta's deletion vectors feature, and its
        `delta.enableDeletionVectors` does not turn them off."""
        protocol = self._delta.protocol()
        return "deletionVectors" in (protocol.writer_features or ()) and (
            self._properties().get(DELETION_VECTORS_PROPERTY) != "false"
        )

    # -- its data files -------------------------------------------------------------------------

    def _clustered(self) -> bool:
        """The table's files are kept in ranges of its first key column (`lake/clustered.py`):
        an integer or a string one. Other keys (dates, timestamps, whose statistics delta-rs
        cuts to milliseconds; decimals; floats) merge with delta-rs, a cost that follows the
        table."""
        column = self.schema.column(self.key[0])
        return column is not None and column.kind in ("int", "string")

    def _key_indexed(self) -> bool:
        """Whether the table's data files get a key index (`lake/key_index.py`): its key is
        one integer or text column."""
        return len(self.key) == 1 and self._clustered()

    def _writer_properties(self) -> WriterProperties:
        """How the files of a table kept in key ranges are written: Snappy, delta-rs's
        default (which properties given without a compression would replace with none), and
        an integer first key column, sorted in each file, delta-encoded (DELTA_BINARY_PACKED,
        no dictionary), which Parquet decodes four to five times faster than the
        dictionary's fallback to plain (a write reads that column of every file its keys may
        fall in) and stores in a few kilobytes rather than 600 KB per 100k rows. Strings
        gain nothing from it."""
        column = self.schema.column(self.key[0])
        if column is None or column.kind != "int":
            return WriterProperties(compression="SNAPPY")
        packed = ColumnProperties(dictionary_enabled=False, encoding="DELTA_BINARY_PACKED")
        return WriterProperties(compression="SNAPPY", column_properties={self.key[0]: packed})

    def _data_files(self) -> list[DataFile]:
        """The table's data files with their range of the first key column."""
        name = self.key[0]
        actions = pa.table(self._delta.get_add_actions(flatten=True))
        return [
            DataFile(path, low, high, rows, size, newest)
            for path, low, high, rows, size, newest in zip(
                actions["path"].to_pylist(),
                _stats(actions, "min." + name),
                _stats(actions, "max." + name),
                actions["num_records"].to_pylist(),
                actions["size_bytes"].to_pylist(),
                _stats(actions, "max." + COMMIT),
                strict=True,
            )
        ]

    def _read(
        self,
        paths: Sequence[str],
        schema: pa.Schema,
        adds: Mapping[str, delta_log.Action] | None = None,
    ) -> pa.Table:
        """The rows of the data files `paths` (as the log names them; `adds`, their add
        actions if read already) in `schema` (some of the table's columns), less those their
        deletion vectors delete."""
        deleted = self._deleted_rows(paths, adds)
        parts = []
        for path in paths:
            part = self._read_file(path, schema)
            if path in deleted:
                alive = numpy.ones(part.num_rows, dtype=bool)
                alive[deleted[path]] = False
                part = part.filter(pa.array(alive))
            parts.append(part)
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def _read_file(self, path: str, schema: pa.Schema) -> pa.Table:
        """Every row of the data file `path` in `schema`, those deleted too (a row's index is
        its place in the file): a column the file was written without is null."""
        file = pq.ParquetFile(Path(self.directory) / unquote(path))
        has = set(file.schema_arrow.names)
        part = file.read(columns=[n for n in schema.names if n in has])
        arrays = [
            part[f.name].cast(f.type) if f.name in has else pa.nulls(part.num_rows, f.type)
            for f in schema
        ]
        return pa.Table.from_arrays(arrays, schema=schema)

    def _deleted_rows(
        self, paths: Collection[str], adds: Mapping[str, delta_log.Action] | None = None
    ) -> dict[str, numpy.ndarray]:
        """The indexes of the rows of the data files `paths` (as the log names them;
        `adds`, their add actions if read already) that their deletion vectors delete, by
        file. Only their vectors are read (delta-rs's `deletion_vectors` reads every
        file's)."""
        if not self.deletion_vectors:
            return {}
        if adds is None:
            adds = delta_log.active_adds(self.directory, self.version)
        files: dict[Path, bytes] = {}
        return {
            path: stored_rows(self.directory, vector, files).astype(numpy.int64)
            for path in paths
            if (vector := adds[path].get("deletionVector"))
        }

    def _retried(self, write: Callable[[], T]) -> T:
        """Run a write, again on the latest version each time another writer's commit won."""
        for attempt in range(ATTEMPTS):
            try:
                return write()
            except (CommitFailedError, delta_log.LostCommit):
                if attempt == ATTEMPTS - 1:
                    raise
                time.sleep(random.uniform(0, min(2.0, 0.02 * 2**attempt)))
                self._delta.update_incremental()
        raise AssertionError("unreachable")


def _stats(actions: pa.Table, column: str) -> list[Key | None]:
    """A column of the log's file statistics (None where a file has none)."""
    if column not in actions.column_names:
        return [None] * actions.num_rows
    found: list[Key | None] = actions[column].to_pylist()
    return found
