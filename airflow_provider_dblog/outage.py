"""How an outage reads in the log: one WARNING when a server goes away, naming the cause, and
one INFO when it is back, saying how long it was away; the retries between are DEBUG. A restart
that takes a minute is two lines a person reads, not a warning at every backoff."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class Outage:
    """One spell of unavailability as `log` tells it: `away` at each failed try, `back` at
    the next success (nothing if nothing was away)."""

    def __init__(self, log: logging.Logger, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._clock = clock
        self.since: float | None = None
        """When the first try of this spell failed; None while nothing is away."""
        self._what = ""

    def away(self, what: str, cause: BaseException) -> None:
        """A try failed because `what` is unavailable (the source, the state store, ...)."""
        said = " ".join(str(cause).split())  # a server's message may run over lines
        if self.since is None:
            self.since, self._what = self._clock(), what
            self._log.warning("%s unavailable (%s); retrying until it is back", what, said)
        else:
            self._log.debug("%s still unavailable (%s)", what, said)

    def back(self) -> None:
        """A try succeeded: the spell, if there was one, is over."""
        if self.since is not None:
            self._log.info("%s back after %.0f s", self._what, self._clock() - self.since)
            self.since = None
