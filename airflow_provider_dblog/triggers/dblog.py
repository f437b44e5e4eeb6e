"""Deferrable triggers: follow a dump to its end, wait for the tailer to be healthy.

They poll Redis with an asyncio client from the triggerer, so a waiting task holds no worker
slot. Their serialized form holds ids and numbers only, never a secret.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, TypeGuard

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_dblog.hooks.dblog import DBLogHook
from airflow_provider_dblog.state import TailerHealth
from airflow_provider_dblog.triggers.dump_progress import ProgressLines
from airflow_provider_dblog.triggers.outcome import STALLED, DumpOutcome, TailerHealthy


class DBLogDumpTrigger(BaseTrigger):
    """Fires when the dump finishes (done, failed, cancelled), when it is missing, or when no
    process has run it for `driver_timeout_s` (its Spark driver died: outcome `stalled`, and
    a task retry resumes it). Logs each step of its progress, with each table's rows, rate
    and time left (`ProgressLines`), into the task's log.

    :param dblog_conn_id: the `dblog` connection.
    :param dump_id: the dump to follow.
    :param poll_interval: seconds between polls of Redis.
    :param driver_timeout_s: how long a dump may go without a running process (counted from
        when this trigger starts, so a driver that is still starting is not taken for dead).
    :param cancel_on_kill: a user killing the deferred task cancels the dump (the dump
        operator's own wait; not a sensor's, which only watches).
    """

    def __init__(
        self,
        dblog_conn_id: str,
        dump_id: str,
        poll_interval: float = 5.0,
        driver_timeout_s: float = 120.0,
        cancel_on_kill: bool = False,
    ) -> None:
        super().__init__()
        self.dblog_conn_id = dblog_conn_id
        self.dump_id = dump_id
        self.poll_interval = poll_interval
        self.driver_timeout_s = driver_timeout_s
        self.cancel_on_kill = cancel_on_kill

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "dblog_conn_id": self.dblog_conn_id,
                "dump_id": self.dump_id,
                "poll_interval": self.poll_interval,
                "driver_timeout_s": self.driver_timeout_s,
                "cancel_on_kill": self.cancel_on_kill,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        reader, client = await DBLogHook.async_reader(self.dblog_conn_id)
        try:
            last_seen = time.monotonic()
            logged: tuple[Any, ...] = ()
            stored = await reader.dump(self.dump_id)
            tables = ProgressLines(0 if stored is None else len(stored.request.keys))
            while True:
                status = await reader.dump_status(self.dump_id)
                if status is None or status.state.finished:
                    yield TriggerEvent(DumpOutcome.of(self.dump_id, status).to_event())
                    return
                now = (status.state.value, status.chunks, status.rows, status.windows_retried)
                if now != logged:
                    self.log.info(
                        "dump %s: %s, %d chunks, %d rows, %d windows retried",
                        self.dump_id,
                        *now,
                    )
                    logged = now
                    progress = await reader.dump_progress(self.dump_id)
                    for line in tables.moved(progress, time.monotonic()):
                        self.log.info("dump %s: %s", self.dump_id, line)
                if await reader.dump_driver(self.dump_id) is not None:
                    last_seen = time.monotonic()
                elif time.monotonic() - last_seen > self.driver_timeout_s:
                    yield TriggerEvent(DumpOutcome.of(self.dump_id, status, STALLED).to_event())
                    return
                await asyncio.sleep(self.poll_interval)
        finally:
            await client.aclose()

    async def on_kill(self) -> None:
        """A user killed the deferred task (mark failed, clear): cancel the dump, so its
        detached Spark driver stops after the current chunk and exits. Not called when the
        triggerer merely restarts."""
        if not self.cancel_on_kill:
            return
        store = await DBLogHook.async_store(self.dblog_conn_id)
        cancelled = await asyncio.to_thread(store.dumps.cancel, self.dump_id)
        self.log.info("dump %s: %s", self.dump_id, "cancelled" if cancelled else "already ended")


class DBLogTailerHealthTrigger(BaseTrigger):
    """Fires once the source's tailer beats with a lag of at most `max_lag_ms`, with a
    `TailerHealthy` payload.

    :param dblog_conn_id: the `dblog` connection.
    :param max_lag_ms: the largest acceptable lag behind the source's log.
    :param poll_interval: seconds between polls of Redis.
    """

    def __init__(self, dblog_conn_id: str, max_lag_ms: int = 60_000, poll_interval: float = 5.0):
        super().__init__()
        self.dblog_conn_id = dblog_conn_id
        self.max_lag_ms = max_lag_ms
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "dblog_conn_id": self.dblog_conn_id,
                "max_lag_ms": self.max_lag_ms,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        reader, client = await DBLogHook.async_reader(self.dblog_conn_id)
        try:
            while True:
                health = await reader.tailer_health()
                if health_ok(health, self.max_lag_ms):
                    yield TriggerEvent(TailerHealthy(health).to_event())
                    return
                self.log.info("tailer not healthy yet: %s", health or "no heartbeat")
                await asyncio.sleep(self.poll_interval)
        finally:
            await client.aclose()


def health_ok(health: TailerHealth | None, max_lag_ms: int) -> TypeGuard[TailerHealth]:
    """A tailer beats and lags at most `max_lag_ms` behind its source."""
    if health is None:
        return False
    lag = health.metrics.get("lag_ms")
    return isinstance(lag, int) and lag <= max_lag_ms
