"""The two interfaces every source implements: reading the log, and reading chunks."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.core.event import Key, Row, TableRef
from airflow_provider_dblog.core.log import LogItem


class SourceError(DBLogError):
    """The source cannot be used as configured; the message says what to change."""


class UnknownTable(SourceError):
    pass


class NoPrimaryKey(SourceError):
    pass


class SourceUnavailable(DBLogError):
    """The server went away or refused the connection; retrying later may succeed."""


@dataclass(frozen=True, slots=True)
class ChunkRead:
    """Rows of one chunk in key order, and the transactions the read could not see although
    they had committed (see `ChunkRows.invisible_txids`)."""

    rows: Sequence[Row]
    invisible_txids: frozenset[int] = field(default_factory=frozenset)


class LogReader(Protocol):
    """Streams the change log from the last acknowledged position."""

    def items(self) -> Iterator[LogItem]:
        """Log items in log order, forever; yields `Idle` when there is nothing to read."""
        ...

    def acknowledge(self, commit: int) -> None:
        """Everything up to `commit` is durable downstream; never moves backwards."""
        ...

    def close(self) -> None: ...


class ChunkSource(Protocol):
    """The queries a dump needs. Keys are compared by the database, in its collation."""

    def key_columns(self, table: TableRef) -> tuple[str, ...]:
        """Primary-key columns in key order; raises UnknownTable or NoPrimaryKey."""
        ...

    def max_key(self, table: TableRef) -> Key | None: ...

    def split_keys(
        self, table: TableRef, after: Key | None, upto: Key, chunk_size: int, count: int
    ) -> list[Key]:
        """Keys at every `chunk_size`-th row after `after`, none beyond `upto`, at most
        `count`, found through the primary-key index."""
        ...

    def read_chunk(self, chunk: Chunk) -> ChunkRead:
        """A non-stale read: sees every transaction committed before it started."""
        ...

    def write_watermark(self, value: str) -> None:
        """Update the watermark row to `value` and commit."""
        ...

    def close(self) -> None: ...
