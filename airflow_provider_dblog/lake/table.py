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
one `MarkingTable._mark` writes itself). A commit that loses a race with another writer (the
compaction and a direct dump's driver may both write a table) fails with delta-rs's
`CommitFailedError`, or `delta_log.LostCommit`, and is run again on the new version, a few
times. Merges are serializable: one that read a file another commit removed, or that would
insert a key another commit added, fails rather than committing a second row of a key.

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

The code is layered by idea, a class over the one below: the Delta table and its files
(`files.py`), the deletion marking (`marking.py`), the merge (`merge.py`), and here the table's
life: created or opened, its columns added and folded, its files optimized, its tombstones
pruned.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Collection, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Field
from deltalake.exceptions import TableNotFoundError

from airflow_provider_dblog.core.event import JsonValue, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.lake import delta_log
from airflow_provider_dblog.lake.clustered import FILE_BYTES, PART_ROWS, Part, merges, packed, quote
from airflow_provider_dblog.lake.files import (
    FOLDED_SCHEMA_PROPERTY,
    KEY_PROPERTY,
    SOURCE_PROPERTY,
    FoldedSchema,
    Written,
)
from airflow_provider_dblog.lake.marking import UNMERGED_TAG
from airflow_provider_dblog.lake.merge import MergingTable, below, newer
from airflow_provider_dblog.lake.schema import (
    DELETED,
    LakeColumn,
    LakeSchema,
    LakeSchemaError,
    column_array,
)

__all__ = [
    "UNMERGED_TAG",
    "FoldedSchema",
    "LakeTable",
    "Written",
    "below",
    "give_new_tables_deletion_vectors",
    "new_tables_have_deletion_vectors",
    "newer",
    "table_uri",
]

UNFOLDED_METADATA = "dblog.unfolded"
"""A column's metadata, "true" while rows of the table may lack the column's value (it was
added to the table, or created for rows read without it) and the compaction has not folded the
schema event that added it in the source (`add_columns`, `unfolded`)."""
ADDED_METADATA = "dblog.added"
"""A column's metadata once the compaction folded the schema event that added it: JSON
`{"at": [commit, seq], "default": value}`, where, and the constant default the rows positioned
before it hold (null: none). A direct chunk read before that event whose commit comes after
the fold gives its rows the default from here (`added_defaults`)."""


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


class LakeTable(MergingTable):
    """A captured table's Delta table under a lake root (a local path here): what its callers
    use, the layers below included."""

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

    # -- columns added and folded ---------------------------------------------------------------

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

    # -- upkeep ---------------------------------------------------------------------------------

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

    def prune_tombstones(self, before: Position) -> int:
        """Remove the tombstones positioned before `before`, the caller's horizon: no row
        positioned before it can still reach the table (no direct window whose lw lies before
        it is left uncommitted, and the compaction has folded the log up to it). Pruning past
        a row still on its way lets that row bring a deleted key back."""
        done = self._retried(lambda: self._delta.delete(f"{quote(DELETED)} AND {below(before)}"))
        return int(done.get("num_deleted_rows", 0))


def _unfolded(field: pa.Field) -> pa.Field:
    """`field` marked unfolded (`UNFOLDED_METADATA`)."""
    return field.with_metadata({**(field.metadata or {}), UNFOLDED_METADATA.encode(): b"true"})


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
