"""All of a source's state, for the callers that need several of its stores."""

from __future__ import annotations

import redis

from airflow_provider_dblog.state.base import address_of
from airflow_provider_dblog.state.compactor import CompactorStore
from airflow_provider_dblog.state.direct import DirectWindowStore
from airflow_provider_dblog.state.dumps import DumpStore
from airflow_provider_dblog.state.positional import PositionalWindowStore
from airflow_provider_dblog.state.server import check_no_eviction
from airflow_provider_dblog.state.tailer import TailerStore
from airflow_provider_dblog.state.verifies import VerifyStore
from airflow_provider_dblog.state.windows import WindowStore


class StateStore:
    """The windows (direct and read-only ones' too), dumps, verify runs, tailer and compactor
    stores of one source, on one client."""

    def __init__(self, client: redis.Redis, source: str) -> None:
        self.windows = WindowStore(client, source)
        self.directs = DirectWindowStore(client, source)
        self.positional = PositionalWindowStore(client, source)
        self._client = client
        self.dumps = DumpStore(client, source)
        self.verifies = VerifyStore(client, source)
        self.tailer = TailerStore(client, source)
        self.compactor = CompactorStore(client, source)
        self.source = source
        self.address = address_of(client)

    def check_server(self) -> None:
        """Refuse a Redis that may evict keys (`state.server`)."""
        check_no_eviction(self._client)
