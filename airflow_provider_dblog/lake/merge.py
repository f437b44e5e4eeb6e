"""The merge: a batch of rows applied to a lake table by position, in one commit, under its
one rule (a row replaces its key's stored row only if its position is higher; rows below the
floor a truncate set are dropped).

Three ways to apply it, by what the table is: delta-rs's merge (a key of another type, or a
truncate); the files its keys fall in rewritten, a commit per key range (`_rewrite`, a table
kept in key ranges, `lake/clustered.py`); or those rows marked deleted and the winners added
(`MarkingTable._mark`, a table with deletion vectors).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, Transaction, write_deltalake

from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.lake.clustered import (
    FILE_BYTES,
    PART_ROWS,
    Part,
    Write,
    apply_rule,
    key_array,
    quote,
    touched,
)
from airflow_provider_dblog.lake.files import (
    FLOOR_PROPERTY,
    PROGRESS_COMMIT,
    PROGRESS_SEQ,
    Written,
)
from airflow_provider_dblog.lake.marking import MarkingTable
from airflow_provider_dblog.lake.schema import COMMIT, KEEP_PREFIX, SEQ


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


class MergingTable(MarkingTable):
    """A lake table's merge and the floor it keeps."""

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
