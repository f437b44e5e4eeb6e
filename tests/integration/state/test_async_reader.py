"""AsyncStateReader on a real Redis: it reads what the sync stores wrote, decoded alike."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import AsyncStateReader, DumpState, StateStore, TailerHealth
from tests.integration.state.support import T

pytestmark = pytest.mark.integration


def test_async_reader_sees_what_the_store_wrote(store: StateStore, redis_server: RedisInfo) -> None:
    request = DumpRequest("seen", DumpKind.TABLE, (T,), chunk_size=10)
    store.dumps.create(request)
    store.dumps.mark("seen", DumpState.RUNNING)
    store.dumps.count("seen", chunks=2, rows=20)
    store.dumps.beat("seen", "host:7", ttl_ms=60_000)
    store.tailer.beat("tailer-b", {"lag_ms": 12}, ttl_s=60)

    async def read() -> tuple[object, object, object, object]:
        client = redis.asyncio.Redis(
            host=redis_server.host, port=redis_server.port, password=redis_server.password
        )
        try:
            reader = AsyncStateReader(client, store.source)
            return (
                await reader.dump_status("seen"),
                await reader.dump_driver("seen"),
                await reader.tailer_health(),
                await reader.dump_status("missing"),
            )
        finally:
            await client.aclose()

    status, driver, health, missing = asyncio.run(read())
    assert status == store.dumps.status("seen")
    assert driver == "host:7" and missing is None
    assert isinstance(health, TailerHealth) and health.owner == "tailer-b"
    assert health.metrics == {"lag_ms": 12}
