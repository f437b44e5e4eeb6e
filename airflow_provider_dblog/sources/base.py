"""What every source implements: its configuration, reading the log, and reading chunks.

A source type (PostgreSQL, MySQL/MariaDB) provides a `SourceConfig` parsed from `[source]` and a
`Source` built from it, through its `Dialect` (`sources/dialect.py`); `sources.factory` picks it
by `[source] type`, so no caller names a type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.errors import DBLogError, InvalidRequest
from airflow_provider_dblog.core.event import Key, Row, TableRef
from airflow_provider_dblog.core.log import LogItem
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.core.verify import ChunkSum
from airflow_provider_dblog.sources.snapshot import ReadSnapshot as ReadSnapshot
from airflow_provider_dblog.sources.text_chunks import ChunkText


class SourceError(DBLogError):
    """The source cannot be used as configured; the message says what to change."""


class UnknownTable(SourceError):
    pass


class NoPrimaryKey(SourceError):
    pass


class NotSetUp(SourceError):
    """The source lacks what a dump needs (its watermark table); the message says what to run."""


class WatermarkRefused(SourceError):
    """The dump's role may not write the watermark table: a configuration error, never retried."""

    def __init__(self, source: str, table: object, reason: str) -> None:
        super().__init__(
            f"source {source}: the dump may not write its watermark table {table} ({reason}): "
            "grant UPDATE on it, or dump read-only (dblog dump --read-only, or [source] "
            "read_only = true)"
        )


class InvalidKey(InvalidRequest):
    """A key value that its key column's type does not accept; the message names the table,
    the column, its type and the value."""


class SourceUnavailable(DBLogError):
    """The server went away or refused the connection; retrying later may succeed."""


class ReplicaBehind(SourceUnavailable):
    """The read replica has not applied what a chunk needs within its wait: the dump waits for
    it as for a source away, and the message says how far behind it is."""


@dataclass(frozen=True, slots=True)
class ChunkRead:
    """Rows of one chunk in key order, and the transactions the read's snapshot did not see
    (see `ChunkRows.invisible_txids`)."""

    rows: Sequence[Row]
    invisible_txids: frozenset[int] = field(default_factory=frozenset)
    snapshot: ReadSnapshot | None = None


class LogReader(Protocol):
    """Streams the change log from the last acknowledged position."""

    def items(self) -> Iterator[LogItem]:
        """Log items in log order, forever; yields `Idle` when there is nothing to read."""
        ...

    def acknowledge(self, commit: int) -> str | None:
        """Everything up to `commit` is durable downstream; never moves backwards.

        Returns where a new reader resumes from after that (an opaque string the tailer saves
        with its checkpoint, under its fence, and hands to `Source.log_reader`), or None when
        the source keeps the resume point itself (PostgreSQL's slot)."""
        ...

    def describe(self, table: TableRef) -> TableSchema:
        """`table`'s schema as the catalog has it now, spelled as the reader's
        `SchemaDescription`s spell it (the same columns describe alike). Asked while items are
        being read, when a dump chunk's rows have other columns than the log last described
        (an ALTER the log has not shown yet); raises `SourceUnavailable` if the server went
        away."""
        ...

    def log_end(self) -> int:
        """A position every commit in the log so far lies below (one query on a connection
        of its own): a session started again arms read-only windows only once it has read
        up to it, past everything an earlier session emitted."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LogBacklog:
    """How far capture is behind the source's log, in the log's own bytes."""

    behind_bytes: int
    """From the position the reader acknowledged to the server's current log position."""
    retained_bytes: int | None
    """Log the server keeps for this capture (PostgreSQL: the WAL the slot holds back); None
    when the source cannot say."""


@runtime_checkable
class ReportsLogBacklog(Protocol):
    """What a `LogReader` may also do: say how far behind it is (the tailer's metrics ask).

    Optional: a reader without it has no backlog metrics. It is called from another thread
    than `items()` (the metrics endpoint's), so it uses a connection of its own, and raises
    `SourceUnavailable` when the server cannot be reached."""

    def log_backlog(self) -> LogBacklog: ...


@runtime_checkable
class Wakeable(Protocol):
    """What a `LogReader` may also do: end its wait for the log at once, from another thread.
    The tailer calls it when a dump adds or readies a read-only window, which no log item
    announces: the reader then yields `Idle` as at the end of its idle wait (outside a
    transaction). A reader without it is looked at between transactions and at its idle beats."""

    def wake(self) -> None: ...


@runtime_checkable
class AnnouncesWaits(Protocol):
    """What a `LogReader` may also do: call `hook` in the reading thread each time it is about
    to wait for the log, having yielded everything received so far. The tailer hands what it
    holds to its writer then, so a run of small transactions read in one go is written in
    one batch rather than one batch a transaction."""

    def before_waiting(self, hook: Callable[[], None]) -> None: ...


@runtime_checkable
class StampsSchemaVersions(Protocol):
    """What a `LogReader` may also do: build each row event with its table's schema version
    (`Change`'s `schema_version`) from `versions`, a mapping the tailer keeps current as it
    emits schema events, read when the event is built (after the session has taken every item
    before it). A reader without it hands events with version 0, and the tailer builds each
    one again with the version."""

    def use_schema_versions(self, versions: Mapping[TableRef, int]) -> None: ...


class ChunkSource(Protocol):
    """The queries a dump needs. Keys are compared by the database, in its collation."""

    def key_columns(self, table: TableRef) -> tuple[str, ...]:
        """Primary-key columns in key order; raises UnknownTable or NoPrimaryKey."""
        ...

    def check_keys(self, table: TableRef, keys: Sequence[Key]) -> tuple[Key, ...]:
        """`keys` checked and normalised by the database, before a dump of them is registered.

        Each key holds one value per primary-key column, in key order (as
        `core.dump_plan.coerce_keys` returns them); a value is a JSON scalar as a person typed
        it (text such as "42", "2024-01-01" or "abc") or as an event carries it (42, true). An
        implementation must:
        - have the database cast every value to its column's type (never parse it in Python:
          the database's own input rules and collation decide), reading no table row;
        - return each key as the values the log reader would emit for that row (the column's
          converter applied to what the database prints), so that "7", 7 and "007" on an
          integer column all become 7; keys equal after normalisation appear once, first
          occurrence's order kept;
        - raise `InvalidKey` for the first value the type refuses, its message naming the
          table, the column, the column's type as SQL spells it, the value (repr) and the
          database's reason on one line;
        - raise `UnknownTable` / `NoPrimaryKey` as `key_columns` does, and `SourceUnavailable`
          when the server cannot be reached. An empty `keys` returns ().
        """
        ...

    def check_filter(self, table: TableRef, where: str) -> str:
        """`where` checked as a dump's filter on `table`, before a dump of it is registered;
        returns it as the chunk reads will use it. An implementation must refuse, with
        `InvalidRequest` naming the problem and the table: text that is not one condition
        (`sources.filter_text.scan_filter`), a syntax error, an unknown column or function, a
        reference to any other table, and a function with side effects or that blocks; the
        server judges all but the first, planning the query without reading a row.
        `UnknownTable` / `NoPrimaryKey` as `key_columns`; `SourceUnavailable` when the server
        cannot be reached."""
        ...

    @property
    def read_only(self) -> bool:
        """Never write to the source: the dump's watermarks are log positions
        (`state/positional.py`), and `write_watermark` refuses. True for every chunk source of
        a `[source] read_only` source, and for one opened for a read-only dump."""
        ...

    def check_ready(self) -> None:
        """Raise `NotSetUp` when this source cannot take a dump yet: its watermark table is
        missing or does not hold exactly one row (no tailer has set the source up); for a
        read-only source, its log position (slot) is not set up, or the server cannot say
        where a snapshot lies. The message names what to run (`dblog tail`, which creates it).
        Only reads; `SourceUnavailable` when the server cannot be reached."""
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

    def read_chunk_text(self, chunk: Chunk) -> ChunkText:
        """`read_chunk`, the rows as the server's text in Arrow columns
        (`sources/text_chunks.py`), no Python object per row: for a target that takes
        columns (the lake). Loads pyarrow."""
        ...

    def write_watermark(self, value: str) -> None:
        """Update the watermark row to `value` and commit."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ChunkSumRead:
    """A chunk summed by the server (`core.verify.ChunkSum`), not read, and what its read's
    snapshot was (as `ChunkRead`'s)."""

    sum: ChunkSum
    invisible_txids: frozenset[int] = field(default_factory=frozenset)
    snapshot: ReadSnapshot | None = None


class SummingChunkSource(Protocol):
    """A `ChunkSource` whose server can sum a chunk's rows, for `dblog verify` against a
    target that can too (`verify.reader.SumsTarget`)."""

    def sum_chunk(self, chunk: Chunk) -> ChunkSumRead:
        """`read_chunk`'s read of `chunk`, its rows summed over the table's columns."""
        ...


class OpenChunkSource(Protocol):
    """Opens a `ChunkSource` (`Source.chunk_source`): a dump opens its own, read-only for a
    read-only dump."""

    def __call__(self, *, read_only: bool = False) -> ChunkSource: ...


class SourceConfig(Protocol):
    """A source's `[source]` section, parsed and checked by its type; no connection is made."""

    @property
    def type(self) -> str:
        """The `[source] type` that parsed it (the factory's key)."""
        ...

    @property
    def name(self) -> str:
        """The source name in every event and in the Redis keys."""
        ...

    @property
    def tables(self) -> tuple[TableRef, ...]: ...

    @property
    def password_env(self) -> str | None:
        """The environment variable holding the source's password, if any."""
        ...

    @property
    def read_only(self) -> bool:
        """`[source] read_only`: nothing is ever written to the source (`ChunkSource`)."""
        ...


class Source(Protocol):
    """One configured source: what the tailer, the dump and the operators ask of a database.

    Building one touches nothing; each method connects when called."""

    @property
    def name(self) -> str: ...

    @property
    def tables(self) -> tuple[TableRef, ...]: ...

    def chunk_source(self, *, read_only: bool = False) -> ChunkSource:
        """A new `ChunkSource` (its own connection, opened on first use); the caller closes it.
        `read_only`: it writes nothing even where the source may be written (a read-only dump
        of a writable source); a `[source] read_only` source's always writes nothing."""
        ...

    def log_reader(self, resume: str | None = None) -> LogReader:
        """A new `LogReader` from the last acknowledged position: `resume` is what the last
        saved checkpoint's `LogReader.acknowledge` returned (None if none was saved). The
        caller closes it."""
        ...

    def ensure_setup(self) -> None:
        """Create what capture needs if missing (safe to run again); check everything else."""
        ...

    def preflight(self) -> None:
        """Raise a `SourceError` saying what to change if the source cannot be used; only reads."""
        ...

    def database(self) -> str:
        """The database name events carry in `source.db`, as the server reports it."""
        ...

    def describe(self, table: TableRef) -> TableSchema:
        """`table`'s columns and key as the catalog has them now, spelled as the log's schema
        events spell them (`LogReader.describe`), on a connection of its own; `UnknownTable`
        if it does not exist."""
        ...

    def lineage_name(self, table: TableRef) -> tuple[str, str]:
        """OpenLineage's (namespace, name) of a captured table, by its naming conventions for
        this database; from the configuration alone, no connection."""
        ...
