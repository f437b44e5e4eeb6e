"""What a log reader hands the tailer: changes, watermark writes and commit boundaries."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_dblog.core.event import Event
from airflow_provider_dblog.core.position import Position


@dataclass(frozen=True, slots=True)
class Change:
    """A row change of a captured table, already converted to an event."""

    event: Event


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


LogItem = Change | WatermarkWrite | TransactionEnd | Idle
