"""One captured table in the lake: a Delta Lake table that keeps, per primary key, the row with
the highest log position.

Rules, the same for the compaction and for direct dumps (so either may commit first):
- A row replaces the stored row of its key only if its position `(_dblog_commit, _dblog_seq)`
  is higher; an equal or lower one changes nothing, so a retry or a replay is harmless.
- A delete is a tombstone row (`_dblog_deleted` true, the key and the position, other columns
  null). It wins over every older row like any row does, and stays until `prune_tombstones`
  removes it: a direct dump's row positioned at its hw may reach the table after a delete
  positioned later, and the tombstone is what refuses it.
- A truncate sets the table's floor (the table property `dblog.floor`, "commit,seq"): stored
  rows and tombstones below it are removed, and rows below it that come later are dropped.
  Setting a property is a metadata change, which makes every concurrent commit conflict and
  run again against the new floor.

Every write is one Delta commit (delta-rs's merge, delete or update; a write of a table kept
in key ranges is one per range part, `lake/clustered.py`; on a table with deletion vectors,
one this module writes itself, `_mark`). A commit that loses a race with another writer (the
compaction and a direct dump's driver may both write a table) fails with delta-rs's
`CommitFailedError`, or `delta_log.LostCommit`, and is run again on the new version, a few
times. Merges
are serializable: one that read a file another commit removed, or that would insert a key
another commit added, fails rather than committing a second row of a key.

The compaction's progress (the position of the last event it folded into the table) rides in
the same commit as the data, as Delta transaction identifiers (`txn` actions, the mechanism
Spark's streaming sinks use), so data and progress commit together.

Added columns. A column a table gains while it holds rows (`add_columns`), or is created with
for rows read without it (`open_or_create(..., unread=)`), is marked unfolded: those rows lack
its value until the compaction folds the schema event that added it in the source and writes
its constant default into the rows positioned before it (`fill`), recording where (`folded`).
The table remembers the last schema event the compaction folded (`folded_schema`): a later one
adds every column it lists that that one did not, whether or not the table has it already (a
table created from the source's catalog, ahead of the log, has it).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeAlias, TypeVar
from urllib.parse import unquote, urlparse

import numpy
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import (
    ColumnProperties,
    CommitProperties,
    DeltaTable,
    Field,
    TableFeatures,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from airflow_provider_dblog.core.event import JsonValue, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.lake import delta_log, key_index
from airflow_provider_dblog.lake.clustered import (
    FILE_BYTES,
    PART_ROWS,
    DataFile,
    Key,
    Part,
    Write,
    apply_rule,
    decide,
    holding,
    key_array,
    merges,
    packed,
    quote,
    rows_holding,
    touched,
)
from airflow_provider_dblog.lake.deletion_vectors import VectorFile, stored_rows
from airflow_provider_dblog.lake.schema import (
    COMMIT,
    DELETED,
    KEEP_PREFIX,
    SEQ,
    LakeColumn,
    LakeSchema,
    LakeSchemaError,
    column_array,
)

KEY_PROPERTY = "dblog.key"
SOURCE_PROPERTY = "dblog.source"
FLOOR_PROPERTY = "dblog.floor"
UNFOLDED_METADATA = "dblog.unfolded"
"""A column's metadata, "true" while rows of the table may lack the column's value (it was
added to the table, or created for rows read without it) and the compaction has not folded the
schema event that added it in the source (`add_columns`, `unfolded`)."""
ADDED_METADATA = "dblog.added"
"""A column's metadata once the compaction folded the schema event that added it: JSON
`{"at": [commit, seq], "default": value}`, where, and the constant default the rows positioned
before it hold (null: none). A direct chunk read before that event whose commit comes after
the fold gives its rows the default from here (`added_defaults`)."""
FOLDED_SCHEMA_PROPERTY = "dblog.compaction.schema"
"""The last schema event the compaction folded into the table: JSON `{"at": [commit, seq],
"columns": [name, ...]}` (`folded_schema`)."""
DELETION_VECTORS_PROPERTY = "delta.enableDeletionVectors"
"""Delta's table property: "false" turns deletion vectors off in a table that has the feature
(`deletion_vectors`)."""
READERS = 4
"""The threads a write with deletion vectors reads its files in."""
UNMERGED_TAG = "dblog.unmerged"
"""The tag (Delta's `add.tags`) of a file a write with deletion vectors added over the range
of another (a fold's keys may span every range): a compaction run merges such files once
enough gathered (`optimize(unmerged_at=)`); a merged file has none."""
PROGRESS_COMMIT = "dblog.compaction.commit"
PROGRESS_SEQ = "dblog.compaction.seq"
ATTEMPTS = 30
T = TypeVar("T")


LAKE_DEFAULTS = "_dblog_lake_defaults.json"
"""A file at a lake's root: what the tables created there start with, JSON
`{"deletion_vectors": true}` (set by `dblog lake enable-deletion-vectors` for every table), so
every writer that may create a table (the compaction, a direct dump's driver) agrees without
a setting of its own, as a catalog's table defaults do."""


def new_tables_have_deletion_vectors(root: str | Path) -> bool:
    """Whether a table created under the lake `root` gets deletion vectors turned on."""
    try:
        found = json.loads((Path(root) / LAKE_DEFAULTS).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False
    return found.get("deletion_vectors") is True


def give_new_tables_deletion_vectors(root: str | Path) -> None:
    """Make the tables created under the lake `root` (made if it does not exist: a lake may
    start with its default) from now on have deletion vectors. Written aside and renamed: a
    reader sees all of it or none."""
    if not new_tables_have_deletion_vectors(root):
        Path(root).mkdir(parents=True, exist_ok=True)
        written = Path(root) / f".{LAKE_DEFAULTS}.{uuid.uuid4()}"
        written.write_text(json.dumps({"deletion_vectors": True}) + "\n", encoding="utf-8")
        os.replace(written, Path(root) / LAKE_DEFAULTS)


def table_uri(root: str | Path, table: TableRef) -> str:
    """Where a captured table's lake table lives: `<root>/<schema>.<table>`."""
    return f"{str(root).rstrip('/')}/{table}"


def newer(source: str, target: str) -> str:
    """SQL: the `source` row's position is higher than the `target` row's."""
    c, s = quote(COMMIT), quote(SEQ)
    return (
        f"({source}.{c} > {target}.{c} OR "
        f"({source}.{c} = {target}.{c} AND {source}.{s} > {target}.{s}))"
    )


def below(position: Position, alias: str | None = None) -> str:
    """SQL: a row's position is lower than `position`."""
    prefix = f"{alias}." if alias else ""
    c, s = prefix + quote(COMMIT), prefix + quote(SEQ)
    return f"({c} < {position.commit} OR ({c} = {position.commit} AND {s} < {position.seq}))"


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


class LakeTable:
    """A captured table's Delta table under a lake root (a local path here)."""

    def __init__(self, table: TableRef, delta: DeltaTable) -> None:
        self.table = table
        self._delta = delta
        self.directory = unquote(urlparse(delta.table_uri).path)
        """The table's directory (a local path)."""

    @classmethod
    def open_or_create(
        cls,
        root: str | Path,
        table: TableRef,
        schema: LakeSchema,
        *,
        unread: Collection[str] = (),
    ) -> LakeTable:
        """The table, created empty with `schema` if it does not exist yet, the columns
        `unread` marked unfolded (the rows about to be written were read without them), with
        deletion vectors if the lake's new tables have them (`new_tables_have_deletion_vectors`);
        columns of `schema` the table lacks are added (`add_columns`)."""
        uri = table_uri(root, table)
        created = not DeltaTable.is_deltatable(uri)
        if created:
            Path(uri).mkdir(parents=True, exist_ok=True)
            fields = [_unfolded(f) if f.name in unread else f for f in schema.arrow_schema()]
            DeltaTable.create(
                uri,
                schema=pa.schema(fields),
                mode="ignore",  # another writer created it first: use theirs
                name=str(table),
                configuration={
                    KEY_PROPERTY: json.dumps(list(schema.key)),
                    SOURCE_PROPERTY: schema.source,
                },
                raise_if_key_not_exists=False,
            )
        found = cls(table, DeltaTable(uri))
        if found.key != schema.key:
            raise LakeSchemaError(
                f"the lake table of {table} is keyed by {list(found.key)}, the source by "
                f"{list(schema.key)}: rebuild it (remove {uri} and dump the table again)"
            )
        found.add_columns(schema.columns)
        if created and new_tables_have_deletion_vectors(root):
            found.enable_deletion_vectors()
        return found

    @classmethod
    def open(cls, root: str | Path, table: TableRef, version: int | None = None) -> LakeTable:
        """An existing table, at its latest version or at `version` (time travel)."""
        try:
            return cls(table, DeltaTable(table_uri(root, table), version=version))
        except TableNotFoundError:
            raise LakeSchemaError(f"no lake table of {table} under {root}") from None

    @staticmethod
    def exists(root: str | Path, table: TableRef) -> bool:
        return DeltaTable.is_deltatable(table_uri(root, table))

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

    # -- writes ---------------------------------------------------------------------------------

    def add_columns(self, columns: Sequence[LakeColumn]) -> list[str]:
        """Add the `columns` the table lacks (nullable), marked unfolded in the same commit:
        the rows the table holds lack them until the compaction folds the schema event that
        added them in the source (a direct dump adds the columns it read before that; the
        compaction, those of the event it folds, and a run that dies before `folded` leaves the
        mark for the next one to fold the event again); the names added."""

        def add() -> list[str]:
            have = set(self.arrow_schema.names)
            new = [c for c in columns if c.name not in have]
            if new:
                self._delta.alter.add_columns(
                    [Field.from_arrow(_unfolded(c.field.with_nullable(True))) for c in new]
                )
            return [c.name for c in new]

        return self._retried(add)

    @property
    def unfolded(self) -> frozenset[str]:
        """The columns whose rows may lack their value and whose schema event the compaction
        has not folded."""
        mark = UNFOLDED_METADATA.encode()
        return frozenset(
            f.name for f in self.arrow_schema if (f.metadata or {}).get(mark) == b"true"
        )

    def folded(self, name: str, at: Position, default: JsonValue) -> None:
        """Record in column `name`'s metadata that the schema event at `at` that added it, with
        the constant default `default`, is folded (and clear its `unfolded` mark)."""
        added = json.dumps({"at": at.to_json(), "default": default})
        metadata = {ADDED_METADATA: added, UNFOLDED_METADATA: "false"}
        self._retried(lambda: self._delta.alter.set_column_metadata(name, metadata))

    def fold_schema(self, at: Position, columns: Iterable[str]) -> None:
        """Record the schema event at `at`, listing `columns`, as the last one the compaction
        folded (after its columns' `folded`: a run that dies before folds it again)."""
        text = json.dumps({"at": at.to_json(), "columns": sorted(columns)})
        self._retried(
            lambda: self._delta.alter.set_table_properties(
                {FOLDED_SCHEMA_PROPERTY: text}, raise_if_not_exists=False
            )
        )

    def added(self) -> dict[str, tuple[Position, JsonValue]]:
        """The columns whose ADD the compaction folded: where, and the constant default the
        rows positioned before it hold (None: null)."""
        found: dict[str, tuple[Position, JsonValue]] = {}
        for field in self.arrow_schema:
            text = (field.metadata or {}).get(ADDED_METADATA.encode())
            if text is not None:
                added = json.loads(text)
                found[field.name] = (Position.from_json(added["at"]), added["default"])
        return found

    def added_defaults(self, before: Position) -> dict[str, JsonValue]:
        """The constant defaults of the columns whose ADD the compaction folded at a position
        after `before`: what a row positioned at `before`, read without them, holds."""
        return {
            name: default
            for name, (at, default) in self.added().items()
            if at > before and default is not None
        }

    def fill(self, column: LakeColumn, value: JsonValue, before: Position) -> None:
        """Set `column` to `value` in the rows positioned before `before`: the default of a
        column added there, which rows written earlier hold in the source."""
        array = column_array(column, [value], self.table)
        literal = _sql_literal(array[0].as_py(), column)
        if literal is None:
            return
        self._retried(
            lambda: self._delta.update(
                updates={quote(column.name): literal},
                predicate=f"NOT {quote(DELETED)} AND {below(before)}",
            )
        )

    def set_floor(self, floor: Position) -> None:
        """Record a truncate's position (only ever raised); `merge(..., truncate=)` removes the
        rows below it."""

        def set_it() -> None:
            current = self.floor
            if current is None or floor > current:
                self._delta.alter.set_table_properties(
                    {FLOOR_PROPERTY: f"{floor.commit},{floor.seq}"}, raise_if_not_exists=False
                )

        self._retried(set_it)

    def merge(
        self,
        batch: pa.Table,
        *,
        progress: Position | None = None,
        truncate: Position | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Written:
        """Merge `batch` (the table's columns, or some of them, and the position columns; at
        most one row per key, else the highest position of each key is kept) by position, in
        one commit. `progress` is recorded with it (the compaction's); `truncate` first raises
        the table's floor to that position and the commit removes every stored row below it.
        Rows of the batch below the floor are dropped."""
        if truncate is not None:
            self.set_floor(truncate)
        batch = _latest_per_key(batch, self.key)

        def run() -> Written:
            source = self._conform(batch)
            transactions = []
            if progress is not None:
                transactions = [
                    Transaction(PROGRESS_COMMIT, progress.commit),
                    Transaction(PROGRESS_SEQ, progress.seq),
                ]
            properties = CommitProperties(
                custom_metadata=dict(metadata or {}), app_transactions=transactions
            )
            if truncate is None and source.num_rows and self._clustered():
                if self.deletion_vectors:
                    return self._mark(source, properties)
                return self._rewrite(source, properties)
            matched = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in self.key)
            merger = self._delta.merge(
                source,
                matched,
                source_alias="s",
                target_alias="t",
                commit_properties=properties,
            )
            columns = [n for n in self.arrow_schema.names]
            kept = {n[len(KEEP_PREFIX) :] for n in batch.column_names if n.startswith(KEEP_PREFIX)}
            updates = {
                quote(n): (
                    f"CASE WHEN s.{quote(KEEP_PREFIX + n)} THEN t.{quote(n)} ELSE s.{quote(n)} END"
                    if n in kept
                    else f"s.{quote(n)}"
                )
                for n in columns
            }
            merger = merger.when_matched_update(updates, predicate=newer("s", "t"))
            merger = merger.when_not_matched_insert({quote(n): f"s.{quote(n)}" for n in columns})
            floor = self.floor
            if truncate is not None and floor is not None:
                merger = merger.when_not_matched_by_source_delete(below(floor, "t"))
            done = merger.execute()
            return Written(
                done["num_target_rows_inserted"],
                done["num_target_rows_updated"],
                done["num_target_rows_deleted"],
                self._delta.version(),
            )

        return self._retried(run)

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

    def _rewrite(self, source: pa.Table, properties: CommitProperties) -> Written:
        """`source` applied to the files its keys fall in alone, rewritten sorted by key, a
        commit per key range it replaces (streamed a part at a time), the last with
        `properties`' progress (`lake/clustered.py`)."""
        name = self.key[0]
        found = touched(self._data_files(), source[name].to_numpy())
        source = source.sort_by(name)
        keys = key_array(source[name].to_numpy())
        schema = self.arrow_schema
        counts = [0, 0]  # inserted, updated

        def rows(part: Part) -> pa.Table:
            first = 0 if part.low is None else numpy.searchsorted(keys, part.low)
            end = len(keys)
            if part.high is not None:
                end = int(numpy.searchsorted(keys, part.high, side="left" if part.cut else "right"))
            stored = self._read([f.path for f in part.files], schema)
            coming = source.slice(first, end - first)
            done, inserted, updated = apply_rule(stored, coming, self.key, schema)
            counts[0] += inserted
            counts[1] += updated
            return done

        self._write_ranges(found.writes(name, PART_ROWS), rows, properties)
        return Written(counts[0], counts[1], 0, self.version)

    @property
    def deletion_vectors(self) -> bool:
        """Writes mark the rows they replace deleted (`_mark`) instead of rewriting files:
        the table has Delta's deletion vectors feature, and its `delta.enableDeletionVectors`
        does not turn them off."""
        protocol = self._delta.protocol()
        return "deletionVectors" in (protocol.writer_features or ()) and (
            self._properties().get(DELETION_VECTORS_PROPERTY) != "false"
        )

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

    def optimize(self, properties: CommitProperties, *, unmerged_at: int = 0) -> tuple[int, int]:
        """Rewrite small files into few, changing no row: (files removed, files written). A
        table kept in key ranges keeps them: each run of neighbouring small files becomes one
        range (`clustered.packed`), where delta-rs's optimize would pack files of keys far
        apart and the next write touching one would rewrite them all. Other tables, and one
        with a file without statistics, bin-pack with delta-rs (`dataChange` false). A table
        kept in key ranges with deletion vectors merges its small files, and those mostly
        marked deleted, among themselves (`clustered.merges`), one commit per group: the
        files their ranges overlap stay, so its cost follows those files, not the table. Run
        again on the latest version when another writer's commit won. `unmerged_at`: merge
        only the files such a table's writes added (`UNMERGED_TAG`), once that many gathered
        (a compaction run's own upkeep: nothing on other tables)."""
        if self._clustered() and self.deletion_vectors:
            files = self._data_files()
            adds = delta_log.active_adds(self.directory, self.version)
            if unmerged_at:
                files = [f for f in files if (adds[f.path].get("tags") or {}).get(UNMERGED_TAG)]
                if len(files) < unmerged_at:
                    return 0, 0
            deleted = {
                path: int(add["deletionVector"]["cardinality"])
                for path, add in adds.items()
                if add.get("deletionVector")
            }
            done = [
                self._retried(partial(self._merged, group, properties))
                for group in merges(files, deleted, FILE_BYTES)
            ]
            return sum(r for r, _ in done), sum(w for _, w in done)
        if unmerged_at:
            return 0, 0

        def run() -> tuple[int, int]:
            files = self._data_files()
            runs = packed(files, FILE_BYTES) if self._clustered() else None
            if runs is not None:
                schema, order = self.arrow_schema, [(k, "ascending") for k in self.key]

                def rows(part: Part) -> pa.Table:
                    return self._read([f.path for f in part.files], schema).sort_by(order)

                writes = [w for found in runs for w in found.writes(self.key[0], PART_ROWS)]
                self._write_ranges(writes, rows, properties)
                before, after = {f.path for f in files}, {f.path for f in self._data_files()}
                return len(before - after), len(after - before)
            metrics = self._delta.optimize.compact(commit_properties=properties)
            return int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])

        return self._retried(run)

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

    def _write_ranges(
        self,
        writes: Sequence[Write],
        rows: Callable[[Part], pa.Table],
        properties: CommitProperties,
    ) -> None:
        """Each write one commit replacing the rows of its predicate with `rows` of its part
        (sorted by key), cut into files of `FILE_BYTES`; the last commit carries
        `properties`' transactions (the compaction's progress). A part goes to delta-rs as one
        record batch: it spreads the batches of one write over its writer tasks, and the
        files of two tasks would interleave their key ranges."""
        data_only = CommitProperties(custom_metadata=properties.custom_metadata)
        for index, write in enumerate(writes):
            write_deltalake(
                self._delta,
                rows(write.part).combine_chunks(),
                mode="overwrite",
                predicate=write.predicate,
                target_file_size=FILE_BYTES,
                writer_properties=self._writer_properties(),
                commit_properties=properties if index == len(writes) - 1 else data_only,
            )
        self._delta.update_incremental()

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

    def prune_tombstones(self, before: Position) -> int:
        """Remove the tombstones positioned before `before`, the caller's horizon: no row
        positioned before it can still reach the table (no direct window whose lw lies before
        it is left uncommitted, and the compaction has folded the log up to it). Pruning past
        a row still on its way lets that row bring a deleted key back."""
        done = self._retried(lambda: self._delta.delete(f"{quote(DELETED)} AND {below(before)}"))
        return int(done.get("num_deleted_rows", 0))

    def _conform(self, batch: pa.Table) -> pa.Table:
        """The batch in the table's schema: missing columns null, rows below the floor
        dropped, flags of kept columns kept."""
        floor = self.floor
        if floor is not None and batch.num_rows:
            commit, seq = batch[COMMIT], batch[SEQ]
            at_or_after = pc.or_(
                pc.greater(commit, floor.commit),
                pc.and_(pc.equal(commit, floor.commit), pc.greater_equal(seq, floor.seq)),
            )
            batch = batch.filter(at_or_after)
        target = self.arrow_schema
        arrays, fields = [], []
        for field in target:
            if field.name in batch.column_names:
                arrays.append(batch[field.name].cast(field.type))
            else:
                arrays.append(pa.nulls(batch.num_rows, field.type))
            fields.append(field.with_nullable(True))
        for name in batch.column_names:
            if name.startswith(KEEP_PREFIX) and name[len(KEEP_PREFIX) :] in target.names:
                arrays.append(batch[name])
                fields.append(pa.field(name, pa.bool_()))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

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


def _unfolded(field: pa.Field) -> pa.Field:
    """`field` marked unfolded (`UNFOLDED_METADATA`)."""
    return field.with_metadata({**(field.metadata or {}), UNFOLDED_METADATA.encode(): b"true"})


def _latest_per_key(batch: pa.Table, key: Sequence[str]) -> pa.Table:
    """At most one row per key: the one with the highest position."""
    if batch.num_rows < 2:
        return batch
    distinct = batch.group_by(list(key)).aggregate([]).num_rows
    if distinct == batch.num_rows:
        return batch
    ordered = batch.sort_by([(COMMIT, "descending"), (SEQ, "descending")])
    keys = zip(*(ordered[k].to_pylist() for k in key), strict=True)
    seen: set[tuple[Any, ...]] = set()
    keep = []
    for index, value in enumerate(keys):
        if value not in seen:
            seen.add(value)
            keep.append(index)
    return ordered.take(keep)


def _sql_literal(value: Any, column: LakeColumn) -> str | None:
    """A constant as delta-rs's SQL spells it, cast to the column's type; None if the type
    has no simple literal (binary, lists)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, bytes | list):
        return None
    text = "'" + str(value).replace("'", "''") + "'"
    arrow = column.arrow
    if pa.types.is_decimal(arrow):
        return f"CAST({text} AS DECIMAL({arrow.precision}, {arrow.scale}))"
    if pa.types.is_date(arrow):
        return f"CAST({text} AS DATE)"
    if pa.types.is_timestamp(arrow):
        return f"CAST({text} AS TIMESTAMP)"
    return text
