"""What Airflow's triggers poll, on an asyncio Redis client."""

from __future__ import annotations

import redis.asyncio

from airflow_provider_dblog.core.dump_plan import TableProgress
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.state.base import text
from airflow_provider_dblog.state.dumps import (
    DumpStatus,
    StoredDump,
    dump_progress_from,
    dump_status_from,
    stored_dump_from,
)
from airflow_provider_dblog.state.keys import SourceKeys
from airflow_provider_dblog.state.tailer import TailerHealth, tailer_health_from


class AsyncStateReader:
    """Dump status, request and progress, whether its driver is alive, tailer health. Read
    only; the keys and the decoding are those of `DumpStore` and `TailerStore`."""

    def __init__(self, client: redis.asyncio.Redis, source: str) -> None:
        self._r = client
        self.keys = SourceKeys(source)

    async def dump_status(self, dump_id: str) -> DumpStatus | None:
        return dump_status_from(await self._r.hgetall(self.keys.dump_status(dump_id)))

    async def dump(self, dump_id: str) -> StoredDump | None:
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.dump(dump_id))
            pipe.hget(self.keys.dump_controls(dump_id), "chunk_size")
            raw, chunk_size = await pipe.execute()
        return stored_dump_from(raw, chunk_size)

    async def dump_progress(self, dump_id: str) -> dict[TableRef, TableProgress]:
        return dump_progress_from(await self._r.hgetall(self.keys.dump_progress(dump_id)))

    async def dump_driver(self, dump_id: str) -> str | None:
        raw = await self._r.get(self.keys.dump_driver(dump_id))
        return None if raw is None else text(raw)

    async def tailer_health(self) -> TailerHealth | None:
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.tailer_heartbeat)
            pipe.time()
            raw, now = await pipe.execute()
        return tailer_health_from(raw, now)
