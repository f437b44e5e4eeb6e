"""Outputs on real servers: Redis Streams round trip and trimming."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from airflow_provider_dblog.core.event import Event, Op, Origin, Row, SourceInfo, TableRef, decode
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.devservices.process import free_port
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import (
    OutputError,
    OutputUnavailable,
    RedisStreamOutput,
    open_output,
)

pytestmark = pytest.mark.integration


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def ev(
    table: TableRef,
    op: Op,
    key: Row,
    after: Row | None,
    commit: int,
    seq: int = 0,
    *,
    source: str = "src",
    before: Row | None = None,
) -> Event:
    origin = Origin.DUMP if op is Op.READ else Origin.LOG
    info = SourceInfo(source, "db", table.schema, table.name, Position(commit, seq), origin)
    return Event(op, key, before, after, info, 1)


# --- Redis Streams ---------------------------------------------------------------------------


@pytest.fixture
def stream_client(redis_server: RedisInfo) -> Iterator[redis.Redis]:
    with redis_server.client() as client:
        yield client


def entries(client: redis.Redis, key: str) -> list[dict[str, str]]:
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in client.xrange(key)]


def test_redis_stream_round_trip(redis_server: RedisInfo, stream_client: redis.Redis) -> None:
    source = unique("s")
    users, orders = TableRef("app", "users"), TableRef("app", "orders")
    events = [
        ev(users, Op.CREATE, {"id": 1}, {"id": 1, "name": "ü"}, 10, 0, source=source),
        ev(orders, Op.DELETE, {"id": 7}, None, 10, 1, source=source, before={"id": 7}),
        ev(users, Op.READ, {"id": 2}, {"id": 2, "name": None}, 11, 0, source=source),
    ]
    with RedisStreamOutput(redis_server.client()) as out:
        out.write(events[:1])
        out.write(events[1:])
    got = entries(stream_client, f"dblog:{source}:events")
    assert [decode(e["event"]) for e in got] == events
    assert [(e["table"], e["op"], e["position"]) for e in got] == [
        ("app.users", "c", "[10, 0]"),
        ("app.orders", "d", "[10, 1]"),
        ("app.users", "r", "[11, 0]"),
    ]


def test_redis_stream_per_table(redis_server: RedisInfo, stream_client: redis.Redis) -> None:
    source = unique("s")
    users, orders = TableRef("app", "users"), TableRef("app", "orders")
    with RedisStreamOutput(redis_server.client(), per_table=True, prefix="cdc") as out:
        out.write(
            [
                ev(users, Op.CREATE, {"id": 1}, {"id": 1}, 10, 0, source=source),
                ev(orders, Op.CREATE, {"id": 1}, {"id": 1}, 10, 1, source=source),
                ev(users, Op.UPDATE, {"id": 1}, {"id": 1}, 11, 0, source=source),
            ]
        )
    assert [e["position"] for e in entries(stream_client, f"cdc:{source}:events:app.users")] == [
        "[10, 0]",
        "[11, 0]",
    ]
    assert len(entries(stream_client, f"cdc:{source}:events:app.orders")) == 1


def test_redis_stream_drops_replays_after_restart(
    redis_server: RedisInfo, stream_client: redis.Redis
) -> None:
    source = unique("s")
    table = TableRef("app", "users")
    events = [ev(table, Op.UPDATE, {"id": i}, {"id": i}, 10 + i, source=source) for i in range(5)]
    with RedisStreamOutput(redis_server.client()) as out:
        out.write(events[:3])
    with RedisStreamOutput(redis_server.client()) as out:  # a restarted tailer replays from 1
        out.write(events[1:])
        out.write(events[4:])  # and in one process, too
    got = entries(stream_client, f"dblog:{source}:events")
    assert [decode(e["event"]) for e in got] == events


def test_redis_stream_trims_by_maxlen(redis_server: RedisInfo, stream_client: redis.Redis) -> None:
    source = unique("s")
    table = TableRef("app", "t")
    with RedisStreamOutput(redis_server.client(), maxlen=100) as out:
        for batch in range(10):
            out.write(
                [
                    ev(table, Op.CREATE, {"id": i}, {"id": i}, batch, i, source=source)
                    for i in range(100)
                ]
            )
    length = stream_client.xlen(f"dblog:{source}:events")
    assert 100 <= length < 1000  # approximate: whole nodes of entries go at once
    last = entries(stream_client, f"dblog:{source}:events")[-1]
    assert last["position"] == "[9, 99]"


def test_redis_stream_trims_by_age(redis_server: RedisInfo, stream_client: redis.Redis) -> None:
    source = unique("s")
    table = TableRef("app", "t")
    key = f"dblog:{source}:events"
    with RedisStreamOutput(redis_server.client(), max_age_s=0.2) as out:
        out.write(
            [ev(table, Op.CREATE, {"id": i}, {"id": i}, 1, i, source=source) for i in range(300)]
        )
        assert stream_client.xlen(key) == 300
        time.sleep(0.4)
        out.write([ev(table, Op.CREATE, {"id": 0}, {"id": 0}, 2, 0, source=source)])
    # Approximate trimming removes whole nodes (100 entries by default) of old entries.
    assert stream_client.xlen(key) <= 101
    assert entries(stream_client, key)[-1]["position"] == "[2, 0]"


def test_redis_stream_options_checked() -> None:
    client = redis.Redis()
    with pytest.raises(OutputError, match="not both"):
        RedisStreamOutput(client, maxlen=10, max_age_s=5)
    with pytest.raises(OutputError, match="positive"):
        RedisStreamOutput(client, maxlen=0)


def test_redis_stream_unreachable_is_unavailable() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    table = TableRef("app", "t")
    with RedisStreamOutput(client) as out, pytest.raises(OutputUnavailable, match="went away"):
        out.write([ev(table, Op.CREATE, {"id": 1}, {"id": 1}, 1)])


def test_redis_stream_from_config(
    redis_server: RedisInfo, stream_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_DBLOG_REDIS_URL", redis_server.url)
    source = unique("s")
    config = {"type": "redis_stream", "url_env": "TEST_DBLOG_REDIS_URL", "per_table": True}
    with open_output(config) as out:
        assert isinstance(out, RedisStreamOutput)
        out.write([ev(TableRef("a", "b"), Op.CREATE, {"id": 1}, {"id": 1}, 1, source=source)])
    assert stream_client.xlen(f"dblog:{source}:events:a.b") == 1
    with pytest.raises(OutputError, match="environment variable NOT_SET_ANYWHERE"):
        open_output({"type": "redis_stream", "url_env": "NOT_SET_ANYWHERE"})
