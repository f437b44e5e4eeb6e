"""The windows a session has open, and how one of them fails.

The log's watermarks, the read-only windows and the checks at hw all open, end and fail
windows: they share one record of the open ones, so that `dblog_tailer_windows_open` follows
every move, and a failure is written to the store and counted by its reason in one place.
"""

from __future__ import annotations

import logging
import time

from airflow_provider_dblog.core.reconciler import Failed, FailureReason
from airflow_provider_dblog.state import WindowState, WindowStore
from airflow_provider_dblog.tailer.metrics import TailerStats

log = logging.getLogger(__name__)


class OpenWindows:
    """The windows open in a session's reconciler (lw met, not ended), with when their lw was
    met; they end with the session, and the next one drops them."""

    def __init__(self, windows: WindowStore, token: int, stats: TailerStats) -> None:
        self._windows = windows
        self._token = token
        self._stats = stats
        self.opened_at: dict[str, float] = {}
        self.armed: set[str] = set()
        """The read-only windows among them that this session armed."""
        stats.open_windows = 0

    def opened(self, window_id: str) -> None:
        self.opened_at[window_id] = time.monotonic()
        self._stats.windows_opened += 1
        self._stats.open_windows = len(self.opened_at)

    def ended(self, window_id: str) -> None:
        """`TailerStats.open_windows` follows every window that opens or ends, not the next
        heartbeat: `dblog_tailer_windows_open` may be scraped at any moment."""
        self.opened_at.pop(window_id, None)
        self.armed.discard(window_id)
        self._stats.open_windows = len(self.opened_at)

    def fail(self, failed: Failed) -> None:
        window_id = failed.window.window_id
        replayed = self._replayed(failed)
        reason = f"{failed.reason}: {failed.detail}"
        self._windows.fail(window_id, reason, self._token)
        if replayed:
            log.info("window %s: its hw met again after a restart (%s)", window_id, failed.detail)
            self._stats.windows_replayed += 1
            return
        log.info("window %s failed: %s (%s)", window_id, failed.reason, failed.detail)
        self._stats.windows_failed += 1
        by_reason = self._stats.windows_failed_by_reason
        by_reason[failed.reason] = by_reason.get(failed.reason, 0) + 1

    def _replayed(self, failed: Failed) -> bool:
        """An hw without lw of a window an earlier session opened or ended: a restarted tailer
        re-reads the log from its checkpoint and meets it again. Not a failure to page anyone
        for (an open one is still failed, so that its dump retries the chunk)."""
        if failed.reason is not FailureReason.HW_WITHOUT_LW:
            return False
        status = self._windows.state(failed.window.window_id)
        return status is not None and status.state not in (
            WindowState.REGISTERED,
            WindowState.ABANDONED,
        )
