"""What the PostgreSQL and MariaDB replicas have in common: one way to drive them from a test.

A test of "chunk reads from a replica" needs a replica that is behind its primary on purpose
and one that has caught up for sure. Both replicas (`pg_replica.PostgresReplicaInfo`,
`mariadb_replica.MariaDBReplicaInfo`) answer the same calls, with positions as the database
writes them (a PostgreSQL LSN such as ``0/3000148``, a MariaDB GTID position such as
``0-1234-17``):

- `primary_position()`: where the primary's log ends now (a write committed before the call is
  at or before it);
- `position()`: how far the replica has applied its primary's log;
- `pause_replay()` / `resume_replay()` / `replay_paused()`: the replica keeps receiving the log
  but applies none of it while paused, so a write on the primary stays invisible there;
- `wait_replayed(position, timeout)`: returns once the replica has applied `position`, raises
  `ReplicaBehind` after `timeout` seconds (saying whether replay is paused and how far it got);
- `wait_caught_up(timeout)`: `wait_replayed(primary_position())`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

#: Long enough for a loaded CI machine; a replica on the same host applies a row in milliseconds.
DEFAULT_TIMEOUT = 120.0


class ReplicaBehind(TimeoutError):
    """The replica did not apply a position in time; the message says where it is and why."""


class ReplicationBroken(RuntimeError):
    """The replica stopped applying its primary's log on an error (the message quotes it)."""


class Replica(Protocol):
    def primary_position(self) -> str: ...

    def position(self) -> str: ...

    def pause_replay(self) -> None: ...

    def resume_replay(self) -> None: ...

    def replay_paused(self) -> bool: ...

    def wait_replayed(self, position: str, timeout: float = DEFAULT_TIMEOUT) -> None: ...

    def wait_caught_up(self, timeout: float = DEFAULT_TIMEOUT) -> None: ...


def poll(condition: Callable[[], bool], timeout: float) -> bool:
    """Call `condition` until it holds (True) or `timeout` passes (False); short polls first, at
    most 0.2 s apart later."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        if condition():
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 1.5, 0.2)
