"""What a target must answer to be verified: whether it holds a table keyed as the source keys
it and can run a filter on it, whether it has applied the log through a chunk's hw, and its
rows of a key range (or key list) of a table as row hashes by key, the source's rows hashed
the same way.

A target that keeps rows by key (a SQL database, the lake, a search index) implements it. One
that holds the event's JSON, as a search index would, hashes both sides with
`core.verify.row_hashes` and waits on the tailer's checkpoint (`core.verify.applied_through`),
as the SQL-apply target does (`sources/postgres/target_rows.py`); one that holds rows in types
of its own hashes the source's rows as it would hold them (the lake: `lake/target_rows.py`).
A remote one can ship hashes, not rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key, Row, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.verify import ChunkSum, RowsRead


class TargetReader(Protocol):
    """A verified target, opened from a deployment's configuration (`verify/targets.py`)."""

    @property
    def name(self) -> str:
        """How a report and an error name the target."""
        ...

    def check_table(self, table: TableRef, key_columns: tuple[str, ...]) -> None:
        """Refuse (`InvalidRequest`, one line) a source table the target does not hold, or
        holds keyed otherwise than by `key_columns`, the source's key in its order."""
        ...

    def check_filter(self, table: TableRef, where: str) -> None:
        """Refuse (`InvalidRequest`, one line) a filter the source accepted (`where`, a
        condition on `table`'s columns) that the target cannot run on its table of `table`,
        reading no row: the filter runs on both sides, and a run should not be stored only
        to fail at its first chunk."""
        ...

    def applied_through(self, hw: Position, checkpoint: int | None) -> bool:
        """Whether the target holds every event of the log up to hw, the tailer's durable
        position being `checkpoint` (asked again until it does)."""
        ...

    def read_hashes(self, chunk: Chunk) -> dict[Key, str]:
        """The target's rows of `chunk` (its key range or key list, and its filter; the
        chunk's table is the source table), each row's hash by its key."""
        ...

    def hash_rows(
        self, table: TableRef, key_columns: tuple[str, ...], rows: Sequence[Row]
    ) -> dict[Key, str]:
        """The source's rows of `table` (the converters' JSON), each one's hash by its key as
        `read_hashes` would give it for a target holding that row."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class RowsTarget(Protocol):
    """A `TargetReader` whose rows read back as the source's JSON (the SQL-apply output's
    tables, read with the source's converters): `dblog verify` compares its rows with the
    source's as rows (`core.verify.RowsRead`), hashing only the rows that may differ."""

    def read_rows(self, chunk: Chunk) -> RowsRead:
        """The target's rows of `chunk`, as `read_hashes` reads them, in the order read."""
        ...


class SumsTarget(Protocol):
    """A `TargetReader` whose database sums a chunk's rows as a source's does
    (`core.verify.ChunkSum`): `dblog verify` compares the two sums first, and reads the rows
    of a chunk only where they differ."""

    def sum_rows(self, chunk: Chunk) -> ChunkSum | None:
        """The target's rows of `chunk` summed as the source sums its own
        (`sources.base.SummingChunkSource`); None when it cannot sum them so."""
        ...
