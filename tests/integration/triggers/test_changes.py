"""The change trigger's producer and filter on a real Redis, without Airflow around them: what
the triggerer's ack mode drives. Entries written as the Redis Stream output writes them come
out in bounded batches, one asset event per watched table; a batch left unacknowledged comes
back to the next producer (a restarted triggerer); a Redis restart while the producer blocks
in XREADGROUP is ridden through."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis

from airflow_provider_dblog.config import ConfigError
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.devservices.tls import make_test_ca
from airflow_provider_dblog.triggers.change_batch import ChangeBatch
from airflow_provider_dblog.triggers.changes import (
    ChangeStreamProducer,
    DBLogChangeTrigger,
)

pytestmark = pytest.mark.integration
STREAM = "dblog:shop:events"


def xadd(client: redis.Redis, table: str, op: str, commit: int) -> None:
    """An entry as `RedisStreamOutput` writes it (the event itself is not read)."""
    fields = {"event": "{}", "table": table, "op": op, "position": json.dumps([commit, 0])}
    client.xadd(STREAM, fields)  # type: ignore[arg-type]


async def until(condition: Any, what: str, timeout_s: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s")
        await asyncio.sleep(0.02)


async def events_of(trigger: DBLogChangeTrigger, batch: ChangeBatch) -> list[dict[str, Any]]:
    async def one() -> AsyncIterator[ChangeBatch]:
        yield batch

    return [event.payload async for event in trigger.filter_shared_stream(one())]


def acked() -> Any:
    from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

    return lambda ids: [AdvanceItem(ids, AdvanceOutcome(acked=1, failed=0))]


def test_batches_acknowledgement_redelivery_and_a_redis_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RedisServer(tmp_path / "redis") as server:
        info = server.info
        # The configuration in the connection itself: no TOML on the triggerer.
        source = {
            "type": "postgres",
            "name": "shop",
            "dsn": "host=db dbname=shop user=u",
            "tables": ["public.orders", "public.items"],
        }
        output = {"type": "redis_stream", "url_env": "TEST_STREAM_URL"}
        connection = {"conn_type": "dblog", "extra": {"source": source, "output": output}}
        monkeypatch.setenv("AIRFLOW_CONN_DBLOG_TEST", json.dumps(connection))
        monkeypatch.setenv("TEST_STREAM_URL", info.url)
        trigger = DBLogChangeTrigger(
            dblog_conn_id="dblog_test",
            source="shop",
            tables=["public.orders"],
            ops=["c", "d"],
            max_changes=3,
            max_wait_s=0.3,
        )
        _, kwargs = trigger.serialize()
        client = info.client(decode_responses=True)
        item = acked()

        def pending() -> int:
            return int(client.xpending(STREAM, trigger.consumer_group)["pending"])

        async def scenario() -> None:
            producer = DBLogChangeTrigger.create_shared_stream_producer(kwargs)
            assert isinstance(producer, ChangeStreamProducer)
            stream = producer.open_stream()
            first = asyncio.ensure_future(anext(stream))
            await until(lambda: client.exists(STREAM), "the group created")
            xadd(client, "public.orders", "c", 10)
            xadd(client, "public.orders", "d", 11)
            xadd(client, "public.items", "c", 12)  # not watched: acknowledged with the batch
            xadd(client, "public.orders", "u", 13)  # not a watched op
            batch, ids = await first  # max_changes 3: the first three entries
            assert len(ids[STREAM]) == 3
            (event,) = await events_of(trigger, batch)
            assert event["table"] == "public.orders" and event["ops"] == {"c": 1, "d": 1}
            assert event["first_position"] == [10, 0] and event["last_position"] == [11, 0]
            await producer.advance(item(ids))
            assert pending() == 0

            batch, ids = await anext(stream)  # the "u" alone: nothing to fire
            assert await events_of(trigger, batch) == []
            assert pending() == 1  # delivered, not yet acknowledged
            await stream.aclose()  # the triggerer dies before acknowledging it
            await producer.aclose()

            again = DBLogChangeTrigger.create_shared_stream_producer(kwargs)
            stream = again.open_stream()
            batch, redelivered = await anext(stream)  # its pending list comes first
            assert redelivered == ids
            await again.advance(item(redelivered))
            assert pending() == 0

            blocked = asyncio.ensure_future(anext(stream))
            await until(lambda: client.info("clients")["blocked_clients"] == 1, "XREADGROUP BLOCK")
            await asyncio.to_thread(server.restart)
            xadd(client, "public.orders", "d", 20)
            batch, ids = await asyncio.wait_for(blocked, 60)
            (event,) = await events_of(trigger, batch)
            assert event["ops"] == {"d": 1} and event["last_position"] == [20, 0]
            await again.advance(item(ids))
            assert pending() == 0
            await stream.aclose()
            await again.aclose()

        asyncio.run(scenario())
        client.close()


def test_a_stream_redis_whose_certificate_does_not_verify_fails_the_trigger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `rediss://` stream whose server certificate is not of the CA the URL names: the
    producer fails at once with a `ConfigError` saying so (no password in it), where a Redis
    away is waited for."""
    tls = make_test_ca(tmp_path / "ca").server_tls(["127.0.0.1"])
    other_ca = make_test_ca(tmp_path / "other-ca")
    with RedisServer(tmp_path / "redis", tls=tls) as server:
        info = server.info
        url = f"{info.url}?ssl_ca_certs={other_ca.ca_file}"
        source = {
            "type": "postgres",
            "name": "shop",
            "dsn": "host=db dbname=shop user=u",
            "tables": ["public.orders"],
        }
        output = {"type": "redis_stream", "url_env": "TEST_STREAM_URL"}
        connection = {"conn_type": "dblog", "extra": {"source": source, "output": output}}
        monkeypatch.setenv("AIRFLOW_CONN_DBLOG_TEST", json.dumps(connection))
        monkeypatch.setenv("TEST_STREAM_URL", url)
        trigger = DBLogChangeTrigger(
            dblog_conn_id="dblog_test", source="shop", tables=["public.orders"]
        )
        _, kwargs = trigger.serialize()

        async def first_batch() -> None:
            producer = DBLogChangeTrigger.create_shared_stream_producer(kwargs)
            try:
                await asyncio.wait_for(anext(producer.open_stream()), 60)
            finally:
                await producer.aclose()

        with pytest.raises(ConfigError) as refused:
            asyncio.run(first_batch())
    message = str(refused.value)
    assert message.startswith("the change stream's Redis ([output] url_env) cannot be used: ")
    assert "its TLS certificate does not verify (" in message
    assert info.password not in message
