"""The one interface every output implements, and the errors outputs raise.

The tailer's single writer thread hands each output batches of events in output order. `write`
returning means the batch is durable: only then does the tailer acknowledge the position to the
source and mark windows complete. Anything written but not yet acknowledged is read again after a
tailer restart, so an output sees some events twice (at-least-once).

Dropping duplicates. Positions strictly increase in output order and an event keeps its position
when it is replayed, so `(table, key, position)` names an event. A consumer that applies state
keeps, per key, the position it last applied and skips an event whose position is not greater
(`SqlApplyOutput(monotonic=True)` does exactly that); a consumer of the whole stream can simply
skip every event whose position is not greater than the last one it processed. Each output also
drops the replays it can recognise itself (see each class).

Fencing. Every write carries the writer's lease token, which grows with every new leader. Each
output keeps, next to the events and updated together with them, the largest token that wrote to
it, and refuses a batch with a smaller one (`OutputFenced`): a leader that was stopped (a long GC
pause, a frozen VM, a partition) and wakes after another took its lease cannot write the batch it
held. A writer that finds a smaller token there takes the output over: it reads again what it
keeps about the output (last positions, current file), since the previous leader wrote after it
last looked.

Connection loss. A server that goes away or a disk that fails mid-batch is `OutputUnavailable`
whatever the layer it surfaced in; nothing of the batch is then known to be written. The same
output object works again once the server is back (it reconnects inside `write`); the caller
backs off between attempts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from types import TracebackType
from typing import Self

from airflow_provider_dblog.core.encoded_rows import encoded_run_end
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.core.event import Event
from airflow_provider_dblog.core.lines import Lines
from airflow_provider_dblog.core.position import Position


class OutputError(DBLogError):
    """The output cannot take events as configured; the message says what to change."""


class TargetTableMissing(OutputError):
    """A SQL target table does not exist or does not match the events' columns or key."""


class OutputUnavailable(DBLogError):
    """The output's server went away or refused the connection, its disk failed, or another
    writer holds it; retrying the same batch later may succeed."""


class OutputFenced(DBLogError):
    """A writer with a larger lease token has written to this output: the caller lost its lease
    and must stop writing. Nothing of the refused batch was written."""

    def __init__(self, where: str, token: int, fence: int) -> None:
        super().__init__(
            f"{where}: a writer with lease token {fence} has written here; this writer's token"
            f" {token} is stale (it lost the lease)"
        )
        self.token = token
        self.fence = fence


class Output(ABC):
    """Where the ordered change stream goes. Used by one thread at a time."""

    @abstractmethod
    def write(self, events: Sequence[Event], token: int) -> None:
        """Write a batch as the writer holding lease token `token`; when this returns, the batch
        is durable. Raises `OutputFenced` if a writer with a larger token has written here
        (nothing of the batch is written), `OutputUnavailable` if the server, disk or lock is
        not available now (retry later with the same object). On any exception nothing may be
        assumed written: the tailer hands the events again. An empty batch does nothing, not
        even check the token."""

    def write_items(self, items: Sequence[Event | Lines], token: int) -> None:
        """`write` of a batch in which each page of a dump chunk's rows, and the changes of
        each binlog rows event, come as one item, with their lines (`Lines`), as the tailer's
        writer hands them over. An output that writes lines as they are takes them whole
        (NDJSON); this one takes an event a line."""
        events: list[Event] = []
        for item in items:
            if isinstance(item, Lines):
                events += item.events()
            else:
                events.append(item)
        self.write(events, token)

    def fence(self, source: str) -> int | None:
        """The largest lease token that wrote `source`'s events here; None if none did (or
        this output keeps no fence). A new leader takes a token above it before it writes
        (`Tailer`): a Redis that failed over to a replica that missed the last tokens could
        hand out one this output already took, and two leaders would pass the fence with it.
        Raises `OutputUnavailable` as `write` does."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release files and connections; further writes are an error."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def drop_replayed(events: Sequence[Event], last: Position | None) -> list[Event]:
    """The events after `last`, the position last written. A restarted tailer replays a prefix
    that is already there; a position going backwards after that prefix breaks the ordering
    invariant, and is refused rather than silently dropped. A run of a chunk page's encoded
    events is in order by construction: only its ends are compared."""
    kept: list[Event] = []
    index, count = 0, len(events)
    while index < count:
        event = events[index]
        end = encoded_run_end(events, index)
        if end > index and (last is None or event.position > last):
            kept += events[index:end]
            last = events[end - 1].position
            index = end
            continue
        index += 1
        if last is not None and event.position <= last:
            if kept:
                raise OutputError(
                    f"event at {event.position} after {last} in one batch: positions must "
                    "strictly increase in output order"
                )
            continue
        kept.append(event)
        last = event.position
    return kept
