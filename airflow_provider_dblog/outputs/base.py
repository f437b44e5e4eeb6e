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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Self

from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.core.event import Event
from airflow_provider_dblog.core.position import Position


class OutputError(DBLogError):
    """The output cannot take events as configured; the message says what to change."""


class TargetTableMissing(OutputError):
    """A SQL target table does not exist or does not match the events' columns or key."""


class OutputUnavailable(DBLogError):
    """The output's server went away or refused the connection; retrying later may succeed."""


class Output(ABC):
    """Where the ordered change stream goes. Used by one thread at a time."""

    @abstractmethod
    def write(self, events: Sequence[Event]) -> None:
        """Write a batch; when this returns, the batch is durable. On an exception nothing may
        be assumed written: the tailer will hand the events again after it restarts."""

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


def drop_replayed(events: Iterable[Event], last: Position | None) -> list[Event]:
    """The events after `last`, the position last written. A restarted tailer replays a prefix
    that is already there; a position going backwards after that prefix breaks the ordering
    invariant, and is refused rather than silently dropped."""
    kept: list[Event] = []
    for event in events:
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
