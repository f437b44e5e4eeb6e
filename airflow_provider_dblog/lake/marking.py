"""Deletion marking: a write to a table with Delta's deletion vectors that rewrites no file.

The stored rows a write replaces are marked deleted in their files' vectors and its winning rows
added in new files, in one commit written here (`_mark`): a merge-on-read, whose cost follows
the changes, whatever the table's size and wherever the keys fall. An optimize merges the files
such writes add among themselves (`_merged`). Turning the vectors on is a protocol upgrade
(`enable_deletion_vectors`).
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias
from urllib.parse import unquote

import numpy
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, TableFeatures, write_deltalake

from airflow_provider_dblog.lake import delta_log, key_index
from airflow_provider_dblog.lake.clustered import (
    FILE_BYTES,
    DataFile,
    decide,
    holding,
    key_array,
    rows_holding,
)
from airflow_provider_dblog.lake.deletion_vectors import VectorFile
from airflow_provider_dblog.lake.files import DELETION_VECTORS_PROPERTY, TableFiles, Written
from airflow_provider_dblog.lake.schema import COMMIT, KEEP_PREFIX, SEQ, LakeSchemaError

READERS = 4
"""The threads a write with deletion vectors reads its files in."""
UNMERGED_TAG = "dblog.unmerged"
"""The tag (Delta's `add.tags`) of a file a write with deletion vectors added over the range
of another (a fold's keys may span every range): a compaction run merges such files once
enough gathered (`optimize(unmerged_at=)`); a merged file has none."""


class MarkingTable(TableFiles):
    """A lake table's writes and merges of files with deletion vectors."""

    def enable_deletion_vectors(self) -> bool:
        """Turn on deletion vectors (`_mark`): a protocol upgrade no writer undoes, after which
        a reader must support deletion vectors (Spark's Delta 2.3 on, DuckDB's delta
        extension, Polars, delta-rs's engine); False if they were on already. Only the
        feature is added: delta-rs, asked to set `delta.enableDeletionVectors`, adds
        `variantType` to the features a reader must know as well."""

        def enable() -> bool:
            if self.deletion_vectors:
                return False
            if self._properties().get(DELETION_VECTORS_PROPERTY) == "false":
                raise LakeSchemaError(
                    f"the lake table of {self.table} sets {DELETION_VECTORS_PROPERTY} false: "
                    "set it true with the engine that set it"
                )
            self._delta.alter.add_feature(
                [TableFeatures.DeletionVectors], allow_protocol_versions_increase=True
            )
            return True

        return self._retried(enable)

    def _mark(self, source: pa.Table, properties: CommitProperties) -> Written:
        """`source` applied in one commit that rewrites no file: the stored rows it replaces
        are marked deleted in their files' deletion vectors, and its winning rows are added
        in new files, sorted by key (a merge-on-read: the cost follows the changes, whatever
        the table's size and wherever the keys fall). The files it reads are those whose
        range may hold one of its keys, and of those only the key, position and kept
        columns. `LostCommit` when another writer committed first."""
        version, files = self.version, self._data_files()
        candidates = holding(files, source[self.key[0]].to_numpy())
        adds = delta_log.active_adds(self.directory, version)
        matched = self._matched(candidates, source, adds)
        found = decide(matched.stored, source, self.key, self.arrow_schema)
        now = int(time.time() * 1000)
        actions: list[delta_log.Action] = [
            {"txn": {"appId": t.app_id, "version": t.version, "lastUpdated": now}}
            for t in properties.app_transactions or ()
        ]
        vectors = VectorFile()
        replaced = matched.where[:, found.replaced]
        replaced = replaced[:, numpy.lexsort((replaced[1], replaced[0]))]  # by file, then row
        starts = numpy.flatnonzero(numpy.diff(replaced[0], prepend=-1))  # each file's first
        for index, rows in zip(
            replaced[0][starts], numpy.split(replaced[1], starts)[1:], strict=True
        ):
            file = candidates[int(index)]
            if file.path in matched.deleted:
                rows = numpy.union1d(matched.deleted[file.path], rows)
            actions += _marked(adds[file.path], rows, matched.rows[index], vectors, now)
        winners = found.winners.sort_by([(k, "ascending") for k in self.key])
        self._commit(version + 1, actions, winners, vectors, properties, now, over=files)
        return Written(found.inserted, found.updated, 0, self.version)

    def _commit(
        self,
        version: int,
        actions: list[delta_log.Action],
        rows: pa.Table,
        vectors: VectorFile,
        properties: CommitProperties,
        now: int,
        operation: str = "MERGE",
        over: Sequence[DataFile] = (),
    ) -> int:
        """Commit `actions`, with `rows` added in new files and `vectors` stored, as
        `version` (written here: `LostCommit` if another writer's came first, and the files
        written for it are removed); the files added. delta-rs writes the rows into a
        staging table beside, for its Parquet and statistics; its files are moved in. The
        added files change data unless the `operation` is an optimize; those whose range
        overlaps one of the files `over` (the table's, for a write) are tagged
        `UNMERGED_TAG` (a chunk of new keys past the others is not). The added files of a
        table keyed by one column are indexed before the commit (`lake/key_index.py`)."""
        data_change = operation != "OPTIMIZE"
        directory, indexed = Path(self.directory), self._key_indexed()
        staging, moved = directory / f"_dblog_marking_{uuid.uuid4()}", list[Path]()
        added = 0
        try:
            if rows.num_rows:
                # one batch: delta-rs's tasks would write files of interleaved key ranges
                write_deltalake(
                    staging,
                    rows.combine_chunks(),
                    target_file_size=FILE_BYTES,
                    writer_properties=self._writer_properties(),
                )
                for path, add in delta_log.active_adds(staging, 0).items():
                    (staging / path).rename(directory / path)
                    moved.append(directory / path)
                    add = {**add, "modificationTime": now, "dataChange": data_change}
                    if over and _overlaps(add, self.key[0], over):
                        add["tags"] = {**(add.get("tags") or {}), UNMERGED_TAG: "true"}
                    actions.append({"add": add})
                    added += 1
                    if indexed:
                        keys = pq.read_table(directory / path, columns=[self.key[0]])
                        if (index := key_index.built(keys[self.key[0]])) is not None:
                            moved.append(key_index.save(directory, path, index))
            if vectors.count:
                (directory / vectors.name).write_bytes(vectors.data)
                moved.append(directory / vectors.name)
            actions.append(delta_log.commit_info(operation, properties.custom_metadata or {}, now))
            delta_log.commit(directory, version, actions)
        except BaseException:
            for written in moved:
                written.unlink(missing_ok=True)
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._delta.update_incremental()
        default = delta_log.CHECKPOINT_INTERVAL
        interval = int(self._properties().get("delta.checkpointInterval", default))
        if version % interval == 0:  # as delta-rs does after its own commits
            self._delta.create_checkpoint()
        return added

    def _matched(
        self,
        candidates: Sequence[DataFile],
        source: pa.Table,
        adds: Mapping[str, delta_log.Action],
    ) -> _Matched:
        """What a write with deletion vectors reads of the files `candidates` (`adds`: the
        table's add actions). Files are read in threads (Parquet decodes without the GIL, and
        each file in one thread), the position columns only where the log's statistics do not
        already say that every row of the file is older than every row of the write (a fold
        of the log over older rows reads the key alone), the kept columns only where some row
        matched: a long kept text costs several times the key and position. A key of one
        column is searched in the file's key index, not decoded (`lake/key_index.py`; a file
        without one is indexed as it is read)."""
        name, schema = self.key[0], self.arrow_schema
        flags = [n for n in source.column_names if n.startswith(KEEP_PREFIX)]
        kept = [f[len(KEEP_PREFIX) :] for f in flags if pc.any(source[f]).as_py()]
        key_columns = pa.schema([schema.field(n) for n in self.key])
        first = pa.schema([*key_columns, schema.field(COMMIT), schema.field(SEQ)])
        rest = pa.schema([schema.field(n) for n in kept if n not in first.names])
        deleted = self._deleted_rows([f.path for f in candidates], adds)
        keys = numpy.sort(key_array(source[name].to_numpy(zero_copy_only=False)))
        oldest = pc.min(source[COMMIT]).as_py()
        data, indexed = Path(self.directory), self._key_indexed()

        def read(file: DataFile) -> tuple[numpy.ndarray, list[Taken], int]:
            older = file.newest is not None and oldest is not None and file.newest < oldest
            low = 0 if file.low is None else numpy.searchsorted(keys, file.low)
            high = len(keys) if file.high is None else numpy.searchsorted(keys, file.high, "right")
            inside = keys[low:high]  # the write's keys in the file's range
            index = key_index.load(data, file.path, file.rows) if indexed else None
            wanted = [] if index is not None else list(key_columns.names)  # in every file
            wanted += [] if older else [COMMIT, SEQ]
            rows = pa.table({})
            if wanted:
                rows = pq.ParquetFile(data / unquote(file.path)).read(wanted, use_threads=False)
            if indexed and index is None:
                index = key_index.built(rows[name])
                if index is not None:  # for the next write
                    key_index.save(data, file.path, index)
            if index is not None:
                at = key_index.rows_of(index, inside)
            elif inside.dtype.kind == "i":
                at = rows_holding(rows[name].to_numpy(), inside)
            else:
                value_set = pa.array(inside, rows.schema.field(name).type)
                at = numpy.flatnonzero(pc.is_in(rows[name], value_set=value_set))
            if file.path in deleted:
                at = numpy.setdiff1d(at, deleted[file.path], assume_unique=True)
            if index is not None:
                spelled = key_index.keys_at(index, at, key_columns.field(0).type)
                found: list[Taken] = [pa.chunked_array([spelled])]
            else:
                found = [_taken(rows[n], at) for n in key_columns.names]
            if older:  # the file's newest commit stands for its rows' positions: all lose
                found += [numpy.full(len(at), file.newest), numpy.zeros(len(at), numpy.int64)]
            else:
                found += [_taken(rows[n], at) for n in (COMMIT, SEQ)]
            if len(rest):
                more = self._read_file(file.path, rest).take(at) if len(at) else rest.empty_table()
                found += more.columns
            return at, found, len(index) if index is not None else rows.num_rows

        with ThreadPoolExecutor(READERS) as pool:
            results = list(pool.map(read, candidates))
        stored = pa.schema([*first, *rest])
        ats = [at for at, _, _ in results]
        return _Matched(
            pa.table(
                [_joined([f[i] for _, f, _ in results], field) for i, field in enumerate(stored)],
                schema=stored,
            ),
            numpy.stack(
                [
                    numpy.repeat(numpy.arange(len(ats)), [len(at) for at in ats]),
                    numpy.concatenate([numpy.zeros(0, dtype=numpy.int64), *ats]),
                ]
            ),
            [rows for _, _, rows in results],
            deleted,
        )

    def _merged(self, group: Sequence[DataFile], properties: CommitProperties) -> tuple[int, int]:
        """The data files `group` merged into new files sorted by key, less the rows their
        vectors delete, in one commit that changes no row (`dataChange` false, as delta-rs's
        optimize): (files removed, files written); none if another writer removed one of
        them first."""
        version = self.version
        adds = delta_log.active_adds(self.directory, version)
        if any(f.path not in adds for f in group):
            return 0, 0
        paths, order = [f.path for f in group], [(k, "ascending") for k in self.key]
        rows = self._read(paths, self.arrow_schema, adds).sort_by(order)
        now = int(time.time() * 1000)
        actions = [{"remove": _removal(adds[p], now, data_change=False)} for p in paths]
        written = self._commit(
            version + 1, actions, rows, VectorFile(), properties, now, operation="OPTIMIZE"
        )
        return len(group), written


Taken: TypeAlias = numpy.ndarray | pa.ChunkedArray
"""Some values of a column: numpy's where it is an integer column without nulls."""


def _taken(column: pa.ChunkedArray, at: numpy.ndarray) -> Taken:
    """The values of `column` at the row indexes `at`: an integer column's through numpy,
    which costs a fraction of Arrow's take on the hundreds of files a write reads."""
    if pa.types.is_integer(column.type) and not column.null_count:
        taken: numpy.ndarray = column.to_numpy()[at]
        return taken
    found: pa.ChunkedArray = column.take(at)
    return found


def _joined(parts: Sequence[Taken], field: pa.Field) -> pa.ChunkedArray:
    """The values `parts` of one column, in order, as one column of `field`'s type."""
    if parts and all(isinstance(p, numpy.ndarray) for p in parts):
        return pa.chunked_array([pa.array(numpy.concatenate(parts), field.type)])
    chunks = [
        chunk
        for part in parts
        for chunk in (
            [pa.array(part, field.type)] if isinstance(part, numpy.ndarray) else part.chunks
        )
    ]
    return pa.chunked_array(chunks, field.type)


@dataclass(frozen=True, slots=True)
class _Matched:
    """The stored rows a write with deletion vectors may replace: those of the files it
    reads whose first key column holds a value of the write's, not deleted already."""

    stored: pa.Table
    """Their key, position and kept columns (those whose flag the write sets somewhere)."""
    where: numpy.ndarray
    """Where each is: the file's index among those read, and the row's in the file."""
    rows: list[int]
    """Each file's rows, deleted ones too."""
    deleted: dict[str, numpy.ndarray]
    """The rows the files' deletion vectors delete already, by file (`_deleted_rows`)."""


def _marked(
    add: delta_log.Action, deleted: numpy.ndarray, rows: int, vectors: VectorFile, now: int
) -> list[delta_log.Action]:
    """The actions that mark `deleted` (every deleted row, the old vector's too) in the data
    file of `add` (of `rows` rows): its removal (with its old vector), and unless every row
    is deleted its add again with the new vector, stored in `vectors`. Its statistics stay
    the file's, deleted rows too, so they are no longer tight bounds."""
    remove = _removal(add, now, data_change=True)
    if len(deleted) == rows:
        return [{"remove": remove}]
    stats = {**json.loads(add.get("stats") or "{}"), "tightBounds": False}
    marked = {**add, "stats": json.dumps(stats), "dataChange": True}
    marked["deletionVector"] = vectors.add(deleted)
    return [{"remove": remove}, {"add": marked}]


def _overlaps(add: delta_log.Action, name: str, files: Sequence[DataFile]) -> bool:
    """Whether the range of the key column `name` in the data file of `add` (from its
    statistics; none: any range) overlaps one of `files`'."""
    stats = json.loads(add.get("stats") or "{}")
    low, high = stats.get("minValues", {}).get(name), stats.get("maxValues", {}).get(name)
    if low is None or high is None:
        return True
    return any(f.low is None or f.high is None or (f.low <= high and low <= f.high) for f in files)


def _removal(add: delta_log.Action, now: int, *, data_change: bool) -> delta_log.Action:
    """The remove action of the data file of `add`, its deletion vector with it."""
    remove = {
        "path": add["path"],
        "deletionTimestamp": now,
        "dataChange": data_change,
        "extendedFileMetadata": True,
        "partitionValues": add.get("partitionValues", {}),
        "size": add["size"],
    }
    if add.get("deletionVector"):
        remove["deletionVector"] = add["deletionVector"]
    return remove
