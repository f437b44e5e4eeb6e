"""One table's part of a compaction run: the table evolved by the run's schema events, then the
run's folded keys written into it as lake rows, merged in batches; the last merge carries the
table's progress (the position of its last event in the run), so data and progress commit
together."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from deltalake import CommitProperties

from airflow_provider_dblog.compaction.evolution import AddedColumn, evolve
from airflow_provider_dblog.compaction.rules import Change, Folded, key_row
from airflow_provider_dblog.core.event import Row
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.lake.schema import LakeRow
from airflow_provider_dblog.lake.table import LakeTable, Written


def lake_row(
    key: Row, folded: Folded, columns: Iterable[str], added: Mapping[str, AddedColumn]
) -> LakeRow:
    """The lake row of a folded key. A tombstone holds the key alone; a row positioned before
    a column was added holds that column's default (a partial one too: the source gave its row
    the default, whether or not the lake holds the row); a partial row keeps the stored value
    of every other column it lacks."""
    if folded.row is None:
        return LakeRow(key, folded.commit, folded.seq, folded.op, deleted=True, ts_ms=folded.ts_ms)
    values = dict(folded.row)
    position = (folded.commit, folded.seq)
    for name, column in added.items():
        if name not in values and position < column.position:
            values[name] = column.default
    keep: frozenset[str] = frozenset()
    if folded.partial:
        keep = frozenset(c for c in columns if c not in values)
    return LakeRow(values, folded.commit, folded.seq, folded.op, ts_ms=folded.ts_ms, keep=keep)


@dataclass
class TableReport:
    """What a run did to one lake table."""

    rows: int = 0
    deleted: int = 0
    version: int | None = None
    progress: list[int] | None = None
    merged: int = 0
    """The files its writes added that the run merged after its last merge
    (`TableFold.finish`)."""

    def add(self, written: Written) -> None:
        self.rows += written.rows
        self.deleted += written.deleted
        self.version = written.version


class TableFold:
    """One table's part of a run: the table evolved by the run's schema events, then its
    folded rows merged in batches, the last commit recording `end` as its progress; then,
    on a table with deletion vectors, where each write adds a file its keys may spread over
    any range, those files merged once `merge_files_at` of them have gathered (0: never,
    the maintenance's optimize only), so a follower's writes do not read more files run
    after run."""

    def __init__(
        self,
        lake: LakeTable,
        changes: list[Change],
        floor: Position | None,
        end: Position,
        batch_rows: int,
        merge_files_at: int = 0,
    ) -> None:
        self.lake, self.end, self.batch_rows = lake, end, batch_rows
        self.merge_files_at = merge_files_at
        self.report = TableReport(progress=end.to_json())
        self.truncate = floor
        self.pending: list[tuple[str, Folded]] = []
        self.added = evolve(lake, changes)
        self.schema = lake.schema

    def add(self, item: tuple[str, Folded]) -> None:
        self.pending.append(item)
        if len(self.pending) >= self.batch_rows:
            self._merge(last=False)

    def finish(self) -> TableReport:
        self._merge(last=True)
        if self.merge_files_at and self.lake.deletion_vectors:
            properties = CommitProperties(custom_metadata={"dblog.operation": "compaction"})
            self.report.merged, _ = self.lake.optimize(properties, unmerged_at=self.merge_files_at)
        return self.report

    def _merge(self, last: bool) -> None:
        names, added = self.schema.names, self.added
        rows = [lake_row(key_row(k), f, names, added) for k, f in self.pending]
        written = self.lake.merge(
            self.schema.to_arrow(rows),
            progress=self.end if last else None,
            truncate=self.truncate,
            metadata={"dblog.operation": "compaction"},
        )
        self.truncate = None
        self.pending = []
        self.report.add(written)
