"""The change trigger: asset events from the change stream, for event-driven DAGs.

`DBLogChangeTrigger` is a `BaseEventTrigger`: an `AssetWatcher`'s trigger, given by
`assets.dblog_table` or built by common-messaging's `MessageQueueTrigger` (`queues/dblog.py`).
It reads the Redis Stream output of the tailer through a Redis consumer group of its own, and
fires one asset event per batch of changes of each table it watches: payload `{"source",
"table", "ops": {op: count}, "count", "first_position", "last_position"}`. Batches are bounded
(`max_changes` entries, `max_wait_s` after the first watched change: `change_batch.py`); reads
are XREADGROUP with BLOCK on an asyncio client, so a quiet stream costs one blocked call.

Delivery is at least once, never at most once. The trigger runs in the triggerer's ack mode
(`create_shared_stream_producer`): an entry is acknowledged (XACK) only after the asset events
made from its batch are stored in Airflow's database. Read but unacknowledged entries stay in
the group's pending list, and a restarted triggerer reads that list first, so no change is
lost across a triggerer restart or crash. A batch is fired twice only if the triggerer dies in
the second or two between Airflow storing its events and the XACK; the redelivered batch then
carries the same positions, so a DAG that must not act twice skips a batch whose
`last_position` it has already handled.

The consumer group is named after what the trigger watches (`airflow:<tables>:<ops>:<hash of
its arguments>`) and created at the end of the stream when the trigger first starts: a new
watcher fires for changes from then on, not for the stream's history (a dump does that).
Trimming the stream (`maxlen`, `max_age_s`) drops entries whether or not a group has read them:
keep the retention longer than the triggerer may be down.

Bad configuration fails the trigger when it starts, with a message naming it: a missing
connection, a TOML whose source is another, a table the source does not capture, an output that
is not a Redis Stream, an unset `url_env` variable (the triggerer's environment needs the
variable the TOML's `[output] url_env` names, as the tailer's does). Redis going away is ridden
through with backoff.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer

from airflow_provider_dblog.config import ConfigError
from airflow_provider_dblog.hooks.dblog import DBLogHook
from airflow_provider_dblog.outputs.redis_stream import stream_name
from airflow_provider_dblog.triggers.change_batch import (
    ChangeBatch,
    ChangeBatcher,
    StreamEntry,
    Watch,
)

DEFAULT_OPS = ("c", "u", "d")
CONSUMER = "airflow-triggerer"
"""The consumer name in the group: fixed, so that a restarted triggerer reads the entries its
predecessor was delivered but never acknowledged."""
IDLE_BLOCK_MS = 10_000
"""How long a read blocks when no batch is open; then it blocks again."""
BACKOFF_MAX_S = 30.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChangeStream:
    """Where a trigger reads: the output's Redis (its URL holds a password: never logged),
    the streams of its tables, and its consumer group."""

    url: str = field(repr=False)
    streams: tuple[str, ...]
    group: str


async def resolve_stream(dblog_conn_id: str, watch: Watch, group: str) -> ChangeStream:
    """The connection's configuration (its extra, or its TOML) checked against what the
    trigger watches; raises ConfigError naming what does not fit."""
    try:
        settings = await DBLogHook._async_settings(dblog_conn_id)
    except AirflowNotFoundException:
        raise ConfigError(
            f"the change trigger of {', '.join(sorted(watch.tables))} needs the dblog "
            f"connection {dblog_conn_id!r}, which does not exist"
        ) from None
    config = await asyncio.to_thread(settings.read_config)
    path = settings.config_path or f"connection {dblog_conn_id!r}"
    if watch.source != config.source.name:
        raise ConfigError(
            f"the asset names source {watch.source!r}; connection {dblog_conn_id!r} "
            f"configures source {config.source.name!r}"
        )
    captured = sorted(str(t) for t in config.source.tables)
    unknown = sorted(watch.tables - set(captured))
    if unknown:
        raise ConfigError(
            f"source {watch.source!r} does not capture {', '.join(unknown)} (tables in {path}: "
            f"{', '.join(captured)})"
        )
    output = config.output
    if output.get("type") != "redis_stream":
        raise ConfigError(
            f"{path}: [output] type is {output.get('type')!r}; the change trigger reads the "
            'change stream from a Redis Stream output (type = "redis_stream")'
        )
    url_env = output.get("url_env")
    url = os.environ.get(url_env) if url_env else None
    if not url:
        raise ConfigError(
            f"environment variable {url_env} ([output] url_env in {path}) is not set in the "
            "triggerer's environment: the change trigger reads the stream's Redis from it"
        )
    prefix = output.get("prefix", "dblog")
    if output.get("per_table", False):
        streams = tuple(stream_name(prefix, watch.source, t) for t in sorted(watch.tables))
    else:
        streams = (stream_name(prefix, watch.source),)
    return ChangeStream(url, streams, group)


EntryKey = tuple[str, str]
"""(stream, entry id)"""


def refused_certificate(error: redis.RedisError) -> None:
    """Raise ConfigError if `error` is the stream's Redis presenting a TLS certificate that does
    not verify: no retry would pass it, so the trigger fails saying why instead of waiting."""
    cause = error.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        raise ConfigError(
            "the change stream's Redis ([output] url_env) cannot be used: its TLS certificate "
            f"does not verify ({cause.verify_message}); check the url's host and its CA "
            "(ssl_ca_certs in the url, or the system's CAs)"
        ) from error


class ChangeStreamProducer(SharedStreamProducer):
    """Reads the trigger's consumer group into batches for the triggerer (ack mode), and
    acknowledges a batch's entries once Airflow has stored the events made from it."""

    def __init__(self, trigger: DBLogChangeTrigger) -> None:
        self.trigger = trigger
        self._client: redis.asyncio.Redis | None = None
        self._stream: ChangeStream | None = None
        self._held: set[EntryKey] = set()
        """Entries read and not yet acknowledged: skipped when the pending list is read again
        after a reconnect, so that one poll never hands out an entry twice."""

    async def open_stream(self) -> AsyncIterator[tuple[ChangeBatch, dict[str, list[str]]]]:
        trigger = self.trigger
        stream = self._stream = await resolve_stream(
            trigger.dblog_conn_id, trigger.watch, trigger.consumer_group
        )
        client = self._client = redis.asyncio.Redis.from_url(
            stream.url, decode_responses=True, socket_connect_timeout=10
        )
        batcher = ChangeBatcher(trigger.watch, trigger.max_changes, trigger.max_wait_s)
        backlog: deque[StreamEntry] = deque()
        backoff = 0.5
        ready = False
        pending = True  # first the entries delivered before and never acknowledged
        cursors = dict.fromkeys(stream.streams, "0")
        while True:
            if not backlog or not batcher.room():
                now = time.monotonic()
                if batcher.due(now):
                    batch = batcher.take()
                    yield batch, batch.ids_by_stream()
                    continue
            try:
                if not ready:
                    await self._create_groups(client, stream)
                    ready = True
                    log.info(
                        "change trigger of %s reads %s as consumer group %s",
                        ", ".join(sorted(trigger.watch.tables)),
                        ", ".join(stream.streams),
                        stream.group,
                    )
                if backlog:
                    read: list[StreamEntry] = []
                elif pending:
                    read = await self._read(client, stream, cursors, batcher.room(), None)
                    for entry in read:
                        cursors[entry.stream] = entry.entry_id
                    pending = bool(read)
                    read = [e for e in read if (e.stream, e.entry_id) not in self._held]
                else:
                    wait = batcher.wait_s(time.monotonic())
                    block = IDLE_BLOCK_MS if wait is None else max(1, int(wait * 1000))
                    read = await self._read(
                        client, stream, dict.fromkeys(stream.streams, ">"), batcher.room(), block
                    )
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                refused_certificate(exc)
                log.warning(
                    "change stream's Redis unavailable (%s); retrying in %.1fs", exc, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                # A reply lost with the connection may have delivered entries: read the pending
                # list again (what is held already is skipped).
                pending, cursors = True, dict.fromkeys(stream.streams, "0")
                continue
            backoff = 0.5
            self._held.update((e.stream, e.entry_id) for e in read)
            backlog.extend(read)
            take = [backlog.popleft() for _ in range(min(len(backlog), batcher.room()))]
            batcher.add(take, time.monotonic())

    @staticmethod
    async def _create_groups(client: redis.asyncio.Redis, stream: ChangeStream) -> None:
        for key in stream.streams:
            try:
                await client.xgroup_create(key, stream.group, id="$", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    @staticmethod
    async def _read(
        client: redis.asyncio.Redis,
        stream: ChangeStream,
        ids: dict[str, str],
        count: int,
        block_ms: int | None,
    ) -> list[StreamEntry]:
        streams: dict[Any, Any] = dict(ids)
        reply: Any = await client.xreadgroup(
            stream.group, CONSUMER, streams, count=count, block=block_ms
        )
        return [
            StreamEntry.from_fields(key, entry_id, fields)
            for key, entries in reply or []
            for entry_id, fields in entries
        ]

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """XACK each batch that every subscriber accepted (or rejected for good); leave a
        failed one pending, so that the next start of the trigger reads it again."""
        assert self._client is not None and self._stream is not None
        for item in batch:
            outcome, ids = item.outcome, item.broker_payload
            if outcome.failed or not (outcome.acked or outcome.rejected):
                log.warning(
                    "change batch %s not accepted (%s): left pending for redelivery", ids, outcome
                )
                continue
            backoff = 0.5
            while True:
                try:
                    for key, entry_ids in ids.items():
                        await self._client.xack(key, self._stream.group, *entry_ids)
                    break
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    log.warning("XACK failed (%s); retrying in %.1fs", exc, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
            self._held.difference_update((k, i) for k, entry_ids in ids.items() for i in entry_ids)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


class DBLogChangeTrigger(BaseEventTrigger):
    """Fires an asset event per batch of changes to the watched tables (see the module
    docstring for delivery, batching and configuration).

    :param source: the source's name (`[source] name`).
    :param tables: the tables to watch ("schema.table").
    :param dblog_conn_id: the `dblog` connection (its TOML names the Redis Stream output).
    :param ops: the change kinds that count: some of c, u, d, r.
    :param max_changes: the most stream entries in one batch.
    :param max_wait_s: the longest a batch waits after its first watched change.
    """

    def __init__(
        self,
        *,
        source: str,
        tables: list[str],
        dblog_conn_id: str = DBLogHook.default_conn_name,
        ops: list[str] | tuple[str, ...] = DEFAULT_OPS,
        max_changes: int = 1000,
        max_wait_s: float = 2.0,
    ) -> None:
        super().__init__()
        self.watch = Watch.of(source, tables, ops)
        ChangeBatcher(self.watch, max_changes, max_wait_s)  # checks the bounds
        self.dblog_conn_id = dblog_conn_id
        self.max_changes = max_changes
        self.max_wait_s = max_wait_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "dblog_conn_id": self.dblog_conn_id,
                "source": self.watch.source,
                "tables": sorted(self.watch.tables),
                "ops": sorted(self.watch.ops),
                "max_changes": self.max_changes,
                "max_wait_s": self.max_wait_s,
            },
        )

    @property
    def consumer_group(self) -> str:
        """Its own group: two triggers sharing one would split the entries between them."""
        _, kwargs = self.serialize()
        digest = hashlib.sha256(json.dumps(kwargs, sort_keys=True).encode()).hexdigest()[:12]
        return f"airflow:{','.join(kwargs['tables'])}:{''.join(kwargs['ops'])}:{digest}"

    def shared_stream_key(self) -> Hashable:
        return ("dblog-changes", self.consumer_group)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> ChangeStreamProducer:
        return ChangeStreamProducer(cls(**kwargs))

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for batch in shared_stream:
            for changes in batch.summaries(self.watch.source):
                self.log.info(
                    "%s: %d change(s) %s, positions %s..%s",
                    changes.table,
                    changes.count,
                    changes.ops,
                    changes.first_position.to_json(),
                    changes.last_position.to_json(),
                )
                yield TriggerEvent(changes.to_payload())

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Not used: the triggerer reads this trigger through its producer (ack mode), which
        is what makes delivery at least once."""
        raise TypeError(
            "DBLogChangeTrigger runs only as a shared stream in ack mode (Airflow >= 3.3.2)"
        )
        yield  # pragma: no cover - an async generator
