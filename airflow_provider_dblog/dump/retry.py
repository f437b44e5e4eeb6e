"""How long a dump keeps trying: a few attempts for a window that failed, minutes for a server
that went away, and as long as it takes for a read replica that is behind.

A window the tailer did not close (it expired, it saw a stale read, hw came before lw) is worth a
few more attempts; when they are spent, something is wrong that retrying will not fix (is a
tailer running?). A source or a Redis that went away (a failover, a restart for a minor upgrade)
is back within minutes however many attempts that takes, so those failures are bounded by time
instead and spend none of the window attempts. A read replica that has not applied what a chunk
needs is neither: it answers, and it is behind because of a load or its operator (replay
paused); the dump pauses until it catches up, spending nothing, and never reads stale rows.
The clock is given; a spell away is logged as one `Outage`: a line when it starts, one when it
ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from airflow_provider_dblog.outage import Outage
from airflow_provider_dblog.sources.base import SourceUnavailable

log = logging.getLogger(__name__)

BACKOFF_S = 0.25
MAX_BACKOFF_S = 5.0
SOURCE_PATIENCE_S = 300.0
"""How long a dump waits for its source (or Redis) to come back before it fails."""


@dataclass
class Patience:
    """One spell of unavailability: from the first failure to the next success, at most
    `patience_s` long. Each failure is answered with the backoff before the next try, or None
    once the spell has outlasted the patience."""

    patience_s: float
    clock: Callable[[], float] = time.monotonic
    label: str = ""
    """What waits (a chunk), named in the log's lines about the spell."""
    last_error: BaseException | None = None
    _tries: int = 0
    _outage: Outage = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._outage = Outage(log, self.clock)

    @property
    def since(self) -> float | None:
        """When the spell began; None when the last try reached the servers."""
        return self._outage.since

    def away(self, error: BaseException) -> float | None:
        """`error` made a try fail: seconds to wait before the next, None to give up. The last
        try comes when the patience runs out, never later."""
        now = self.clock()
        self.last_error = error
        server = _server_of(error)
        self._outage.away(f"{self.label}: {server}" if self.label else server, error)
        assert self.since is not None
        left = self.since + self.patience_s - now
        if left <= 0:
            return None
        delay = min(_backoff(self._tries), left)
        self._tries += 1
        return delay

    def back(self) -> None:
        """A try reached the server: the next failure starts a new spell."""
        self._outage.back()
        self.last_error, self._tries = None, 0

    def verdict(self) -> str:
        """Why the dump gave up: what was away, for how long, and its last error."""
        assert self.since is not None and self.last_error is not None
        away_s = self.clock() - self.since
        return (
            f"the {_server_of(self.last_error)} was unreachable for {away_s:.0f} s; "
            f"last error: {self.last_error}"
        )


@dataclass
class ChunkRetries:
    """The retry budget of one chunk: `max_attempts` failed windows, and `patience` for a server
    that is away (which does not spend them)."""

    max_attempts: int
    patience: Patience
    reasons: list[str] = field(default_factory=list)
    behind: int = 0
    """How many times the chunk found its read replica behind."""

    def window_failed(self, reason: str) -> bool:
        """A window that reached the servers failed; True while attempts remain."""
        self.patience.back()
        self.reasons.append(reason)
        return len(self.reasons) < self.max_attempts

    def window_backoff(self) -> float:
        """The pause before retrying a failed window. What failed it often passes in a moment
        (a commit in the log but not yet visible to reads fails a window as a stale read until
        it is), and a retry at once would meet it again: the attempts would be spent in a
        burst rather than over seconds."""
        return _backoff(len(self.reasons) - 1)

    def replica_behind(self) -> float:
        """The pause before trying again a chunk whose read replica was behind: the servers
        answered (a spell away ends), and no attempt is spent."""
        self.patience.back()
        self.behind += 1
        return _backoff(self.behind - 1)


def _server_of(error: BaseException) -> str:
    """What a failure of the dump's says was away."""
    return "source" if isinstance(error, SourceUnavailable) else "state store"


def _backoff(tries: int) -> float:
    return min(BACKOFF_S * 2.0**tries, MAX_BACKOFF_S)
