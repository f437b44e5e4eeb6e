"""What a log reader hands the tailer: changes, table-level changes, watermark writes and
commit boundaries.

Every item that has a position takes the next one in its transaction (`[commit, seq]` with
`seq` counting up from 0 over the transaction's changes, watermark writes, truncates and
schema descriptions alike), so items come in strictly increasing position order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from airflow_provider_dblog.core.event import Event, TableRef
from airflow_provider_dblog.core.lines import LogLines, LogRuns
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import TableSchema


@dataclass(frozen=True, slots=True)
class Change:
    """A row change of a captured table, already converted to an event.

    Versions are the tailer's (they persist across restarts and failovers in the state store):
    a reader that `StampsSchemaVersions` (`sources.base`) builds the event with its table's
    current one; any other leaves `schema_version` at 0 and the tailer stamps it."""

    event: Event


@dataclass(frozen=True, slots=True)
class Truncate:
    """Every row of captured table `table` was removed (TRUNCATE), at `position`.

    One item per captured table: a statement truncating several tables gives one item each,
    each at its own position, in the order the log lists them. Tables not captured give none.
    """

    table: TableRef
    position: Position
    txid: int | None = None
    ts_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SchemaDescription:
    """Captured table `table` has `schema` from `position` on.

    A reader hands one whenever it learns a table's columns may have changed, before the first
    change of the table that has them: PostgreSQL when pgoutput sends a Relation message (it
    does before a table's first change on every new stream, and after every ALTER, so most
    descriptions repeat the known schema); MySQL at an ALTER/CREATE/RENAME of a captured table
    in a QUERY event, with the columns read from the catalog. A repeated description is cheap:
    the tailer emits a schema event only when the columns differ from the last ones it emitted.
    Types and defaults are the source's own SQL text (see `core.schema.Column`).
    """

    table: TableRef
    schema: TableSchema
    position: Position
    txid: int | None = None
    ts_ms: int | None = None
    after_ddl: bool = False
    """The reader saw the DDL statement itself (MySQL): even a table's first description is
    then a change that ends the table's open windows. A first description without it (a
    PostgreSQL Relation message) changes nothing a chunk could have read."""


@dataclass(frozen=True, slots=True)
class WatermarkWrite:
    """An update of the watermark table: `value` is an lw or hw of some window (or stale)."""

    value: str
    position: Position


@dataclass(frozen=True, slots=True)
class TransactionEnd:
    """A transaction committed at `commit`: every event up to it has been handed over, so once
    the output has made them durable, `commit` may be acknowledged to the source."""

    commit: int


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing to read; the source's log ends at `log_end`. Acknowledging it when no event is
    pending keeps an idle slot from holding the log forever."""

    log_end: int


LogItem = (
    Change
    | LogLines
    | LogRuns
    | Truncate
    | SchemaDescription
    | WatermarkWrite
    | TransactionEnd
    | Idle
)
"""`LogLines` is several changes of one transaction at once, positioned as that many `Change`s
would be: a reader hands one where it read them together (a binlog rows event, a run of a
pgoutput transaction), so that the tailer's thread does no work a row; `LogRuns` is the runs of
several whole transactions, followed by the last one's end (`single_changes` undoes both for a
consumer that wants them one by one)."""


def single_changes(items: Iterable[LogItem]) -> Iterator[LogItem]:
    """`items` with each `LogLines` as a `Change` a row, and each `LogRuns` as its runs' so,
    each run but the last followed by its transaction's end (the reader's next item is the
    last one's), in order."""
    for item in items:
        if type(item) is LogLines:
            yield from map(Change, item.events())
        elif type(item) is LogRuns:
            for run in item.runs[:-1]:
                yield from map(Change, run.events())
                yield TransactionEnd(run.commit)
            yield from map(Change, item.runs[-1].events())
        else:
            yield item
