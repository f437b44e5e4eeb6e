"""What the tailer and the compaction follower share as services of a source: one process of
each role leads while it holds the role's lease (`state.lease.Lease`, a fencing token per
holder), the others stand by and poll it every quarter of its TTL; and each serves its
Prometheus metrics while it runs, leading or not."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.outage import Outage
from airflow_provider_dblog.state import StateStoreUnavailable
from airflow_provider_dblog.state.lease import Lease


class ServesMetrics(Protocol):
    def serve(self, address: str, port: int) -> WSGIServer: ...


@contextlib.contextmanager
def metrics_served(
    metrics: ServesMetrics, port: int | None, address: str, failed: type[DBLogError]
) -> Iterator[None]:
    """`metrics` on `address:port` while the block runs (nothing without a port). A port that
    is taken, or an address not this host's, raises `failed`, naming both."""
    if port is None:
        yield
        return
    try:
        endpoint = metrics.serve(address, port)
    except OSError as exc:
        raise failed(f"cannot serve metrics on {address}:{port}: {exc}") from exc
    try:
        yield
    finally:
        endpoint.shutdown()
        endpoint.server_close()


def lead_while_leased(
    lease: Lease,
    owner: str,
    ttl_ms: int,
    stop: threading.Event,
    lead: Callable[[int], None],
    standby: Callable[[], None],
    log: logging.Logger,
) -> None:
    """Until `stop` is set: wait for the lease, then `lead(token)`, which returns when this
    owner stops leading (the lease lost, or `stop`), then wait again as a standby."""
    while not stop.is_set():
        token = wait_for_lease(lease, owner, ttl_ms, stop, standby, log)
        if token is None:
            return
        lead(token)


def wait_for_lease(
    lease: Lease,
    owner: str,
    ttl_ms: int,
    stop: threading.Event,
    standby: Callable[[], None],
    log: logging.Logger,
) -> int | None:
    """The fencing token once `owner` holds the lease, None if `stop` came first. `standby`
    is called once when another holds it; a state store out of reach is an outage, told in
    the log as it starts and ends."""
    outage = Outage(log)
    standing_by = False
    while not stop.is_set():
        try:
            token = lease.acquire(owner, ttl_ms)
        except StateStoreUnavailable as exc:
            outage.away("state store", exc)
        else:
            outage.back()
            if token is not None:
                return token
            if not standing_by:
                standing_by = True
                standby()
        stop.wait(ttl_ms / 4000)
    return None
