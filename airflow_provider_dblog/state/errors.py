"""What the state stores raise."""

from __future__ import annotations

from airflow_provider_dblog.core.errors import DBLogError


class StateStoreError(DBLogError):
    """Something in the state store is not as the caller expected."""


class StateStoreUnavailable(StateStoreError):
    """Redis cannot be reached (down, restarting, loading its AOF, or the network)."""


class StateStoreRefusesWrites(StateStoreUnavailable):
    """Redis answers but refuses writes: full under `maxmemory` with `noeviction` (OOM), a
    replica (READONLY, as a primary demoted by a failover is), or unable to save to disk
    (MISCONF). A wait, like an unreachable Redis: each refused script wrote nothing (Redis
    refuses a script at its first write), and writes resume once an operator (or Sentinel)
    fixes the server."""


class RedisCertificateRefused(StateStoreError):
    """The Redis server's TLS certificate does not verify (another CA, another host name,
    expired), or the server refused this client's certificate: a configuration error, not an
    outage, so nothing waits for it to pass."""


class FencedOut(StateStoreError):
    """A tailer wrote with a fencing token that no longer holds the lease: a newer tailer took
    over. The stale tailer must stop at once; its write was not made."""

    @classmethod
    def of(cls, source: str, token: int | None, undone: str) -> FencedOut:
        """The error naming the token, the source and the write that was not made."""
        return cls(
            f"tailer token {token} of source {source} is fenced out: a newer tailer holds the "
            f"lease; {undone}"
        )


class UnknownWindow(StateStoreError):
    """No such window: never registered, or its keys expired."""


class UnknownDump(StateStoreError):
    """No such dump request."""


class AlreadyExists(StateStoreError):
    """A window id, watermark value or dump id is already in use."""


class MissingRows(StateStoreError):
    """A window's chunk rows went away while the tailer read them (the window ended, or Redis
    lost them): the window fails and its chunk is read again."""
