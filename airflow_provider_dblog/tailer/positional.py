"""The tailer's side of read-only windows (`state/positional.py`): they have no watermark in
the log, so the session asks the store for them between two transactions (when, it decides) and
hands what it finds here.

A registered window is armed at the session's read position (lw: every commit below it read);
an open one is closed once the session has read every commit below the hw its reads stored; one
armed by an earlier session (whose changes since lw this one never saw) fails. The rows of a
window closed here take positions in the gap after the last commit read, at seqs the store hands
out once, so a later tailer closing a window in the same gap places its rows after them.
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import Failed, FailureReason, Reconciler, Window
from airflow_provider_dblog.sources.base import LogReader
from airflow_provider_dblog.state import (
    MissingRows,
    PendingWindow,
    StateStore,
    WindowState,
)
from airflow_provider_dblog.tailer.closer import WindowCloser
from airflow_provider_dblog.tailer.windows import OpenWindows


class PositionalWindows:
    """Arms, closes and fails the read-only windows waiting on one session."""

    def __init__(
        self,
        *,
        store: StateStore,
        reader: LogReader,
        reconciler: Reconciler,
        windows: OpenWindows,
        closer: WindowCloser,
        token: int,
    ) -> None:
        self._store = store
        self._reader = reader
        self._reconciler = reconciler
        self._windows = windows
        self._closer = closer
        self._token = token
        self._arm_from: int | None = None
        """The log's end when the session first met a window to arm: it arms none before it
        has read up to there, past whatever an earlier session emitted (a change it reads
        again would drop the chunk's row, and the output would drop the change)."""

    def move(self, found: Sequence[PendingWindow], delivered: int, gap: int) -> None:
        """Act on the windows the store `found` pending, at a commit boundary (no transaction
        is half read): every commit below `delivered` is read, and no transaction has `gap`."""
        for pending in found:
            window_id = pending.window.window_id
            if pending.state is WindowState.REGISTERED:
                if self._arm_from is None:
                    self._arm_from = self._reader.log_end()
                if delivered >= self._arm_from:
                    self._arm(pending, delivered)
            elif window_id not in self._windows.armed:
                self._windows.ended(window_id)
                detail = "armed before the tailer restarted: its changes since lw were not seen"
                self._windows.fail(Failed(pending.window, FailureReason.HW_WITHOUT_LW, detail))
            elif pending.ready and pending.hw is None:
                detail = "its reads stored no hw: the server did not say where their snapshot lies"
                self._end_armed(pending.window, FailureReason.MISSING_CHUNK, detail)
            elif pending.hw is not None and delivered >= pending.hw:
                self._close(pending, gap)

    def _arm(self, pending: PendingWindow, delivered: int) -> None:
        window = pending.window
        if not self._store.positional.arm(window.window_id, self._token, delivered):
            return  # abandoned by the dump meanwhile
        opened = self._reconciler.low_watermark(window, Position(delivered - 1, 0))
        if isinstance(opened, Failed):
            self._windows.fail(opened)
            return
        self._windows.opened(window.window_id)
        self._windows.armed.add(window.window_id)

    def _end_armed(self, window: Window, reason: FailureReason, detail: str) -> None:
        """Fail an armed window before its hw: it leaves the reconciler too."""
        self._windows.ended(window.window_id)
        self._reconciler.expire(window.window_id)
        self._windows.fail(Failed(window, reason, detail))

    def _close(self, pending: PendingWindow, gap: int) -> None:
        """hw is behind the read: the window ends in the gap after the last commit read, its
        rows at seqs reserved for them."""
        window = pending.window
        try:
            stored = self._store.windows.stored_rows(window.window_id)
        except MissingRows as exc:
            self._end_armed(window, FailureReason.MISSING_CHUNK, str(exc))
            return
        if stored is None:
            self._end_armed(window, FailureReason.MISSING_CHUNK, "chunk rows are not in the store")
            return
        self._windows.ended(window.window_id)
        base = self._store.positional.reserve(gap, stored.rows + 1, self._token)
        closed = self._reconciler.high_watermark(window, Position(gap, base))
        if isinstance(closed, Failed):
            self._windows.fail(closed)
        else:
            self._closer.close(closed)
