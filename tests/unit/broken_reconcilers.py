"""Deliberately broken reconcilers: the generated histories must catch every one of them, in
the model and in the production tailer."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from airflow_provider_dblog.core.direct import DumpMode, tombstone_horizon
from airflow_provider_dblog.core.event import Event
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import (
    ChunkRows,
    Closed,
    Failed,
    FailureReason,
    Opened,
    Reconciler,
    Window,
)


class ForgetsInWindowKeys(Reconciler):
    """Broken: emits every chunk row, even those whose key changed inside the window."""

    def chunk_events(self, closed: Closed, chunk: ChunkRows) -> list[Event] | Failed:
        return super().chunk_events(replace(closed, changed_keys=frozenset()), chunk)


class IgnoresRestarts(Reconciler):
    """Broken: treats an hw whose lw it never saw as a normal close with no changed keys."""

    def high_watermark(self, window: Window, position: Position) -> Closed | Failed:
        result = super().high_watermark(window, position)
        if isinstance(result, Failed) and result.reason is FailureReason.HW_WITHOUT_LW:
            return Closed(window, position, position, frozenset())
        return result


class PositionsRowsAtLowWatermark(Reconciler):
    """Broken: gives chunk rows the position of lw instead of hw."""

    def chunk_events(self, closed: Closed, chunk: ChunkRows) -> list[Event] | Failed:
        return super().chunk_events(replace(closed, hw_position=closed.lw_position), chunk)


class IgnoresInvisibleTransactions(Reconciler):
    """Broken: emits a chunk read that missed a transaction committed before lw."""

    def chunk_events(self, closed: Closed, chunk: ChunkRows) -> list[Event] | Failed:
        return super().chunk_events(closed, replace(chunk, invisible_txids=frozenset()))


class IgnoresKeyTables(Reconciler):
    """Broken: a changed key leaves the open chunks of every table, not only its own, so a row
    of another table with the same key values is never dumped."""

    def change(self, event: Event) -> None:
        super().change(event)
        for table in {w.table for w, _ in self.open_windows()} - {event.table}:
            source = replace(event.source, schema=table.schema, table=table.name, txid=None)
            super().change(replace(event, source=source))


class TracksOneDumpPerTable(Reconciler):
    """Broken: follows the changes of one dump's windows per table; a second dump's window,
    opened while the first dump's are open on the same table, closes as if nothing changed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._untracked: set[str] = set()

    def low_watermark(self, window: Window, position: Position) -> Opened | Failed:
        dumps = {w.dump_id for w, _ in self.open_windows() if w.table == window.table}
        opened = super().low_watermark(window, position)
        if isinstance(opened, Opened) and dumps - {window.dump_id}:
            self._untracked.add(window.window_id)
        return opened

    def high_watermark(self, window: Window, position: Position) -> Closed | Failed:
        closed = super().high_watermark(window, position)
        if isinstance(closed, Closed) and window.window_id in self._untracked:
            return replace(closed, changed_keys=frozenset())
        return closed


BROKEN_RECONCILERS: tuple[type[Reconciler], ...] = (
    ForgetsInWindowKeys,
    IgnoresRestarts,
    PositionsRowsAtLowWatermark,
    IgnoresInvisibleTransactions,
    IgnoresKeyTables,
    TracksOneDumpPerTable,
)


class DirectRowsOverwriteEverything(Reconciler):
    """Broken: a direct window's rows are positioned above every log event, as an unconditional
    upsert of dump rows would write them, so a change after hw that reached the target first is
    undone. (Positioned at lw instead of hw they would be right: no event of a surviving key lies
    between lw and hw, so a direct target cannot tell the two apart.)"""

    def high_watermark(self, window: Window, position: Position) -> Closed | Failed:
        closed = super().high_watermark(window, position)
        if isinstance(closed, Closed) and window.mode is DumpMode.DIRECT:
            return replace(closed, hw_position=Position((1 << 64) - 1, 0))
        return closed


def horizon_without_pending_windows(
    pending_lws: Iterable[Position], checkpoint: int | None
) -> Position | None:
    """Broken: prunes tombstones up to the checkpoint even while direct windows recorded before
    them have not written their rows, so a row a later delete removed comes back."""
    return tombstone_horizon((), checkpoint)
