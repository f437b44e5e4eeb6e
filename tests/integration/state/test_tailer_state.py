"""TailerStore on a real Redis: the lease and its fencing token, the checkpoint, schema versions,
heartbeats."""

from __future__ import annotations

import json

import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.core.schema_versions import KnownSchema
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import FencedOut, StateStore, WindowState
from tests.integration.state.support import new_window, wait_for

pytestmark = pytest.mark.integration


def test_lease_fencing_refuses_the_old_leader(store: StateStore) -> None:
    first = store.tailer.acquire_lease("tailer-a", 300)
    assert first is not None
    assert store.tailer.acquire_lease("tailer-b", 300) is None
    assert store.tailer.acquire_lease("tailer-a", 300) is None, (
        "held: renew it, do not acquire again"
    )
    assert store.tailer.renew_lease("tailer-a", first, 300)
    assert not store.tailer.renew_lease("tailer-b", first, 300)
    store.tailer.save_checkpoint(1000, first)
    window, _, _ = new_window(store)
    assert store.windows.open(window.window_id, first)

    # tailer-a stalls; its lease expires and tailer-b takes over.
    second: list[int] = []

    def taken_over() -> bool:
        token = store.tailer.acquire_lease("tailer-b", 10_000)
        if token is not None:
            second.append(token)
        return bool(second)

    wait_for(taken_over, 5, "tailer-b acquiring the expired lease")
    assert second[0] > first
    assert not store.tailer.renew_lease("tailer-a", first, 300)

    with pytest.raises(FencedOut):
        store.tailer.save_checkpoint(2000, first)
    assert store.tailer.load_checkpoint() == 1000
    for move in (store.windows.claim, store.windows.close):
        with pytest.raises(FencedOut):
            move(window.window_id, first)
    with pytest.raises(FencedOut):
        store.windows.fail(window.window_id, "stale", first)
    status = store.windows.state(window.window_id)
    assert status is not None and status.state is WindowState.OPEN

    store.tailer.save_checkpoint(2**64 - 1, second[0])
    assert store.tailer.load_checkpoint() == 2**64 - 1, "u64 commit positions survive"
    assert store.windows.claim(window.window_id, second[0])

    assert not store.tailer.release_lease("tailer-a", first)
    assert store.tailer.release_lease("tailer-b", second[0])
    third = store.tailer.acquire_lease("tailer-a", 10_000)
    assert third is not None and third > second[0], "tokens only grow"
    with pytest.raises(FencedOut):
        store.windows.close(window.window_id, second[0])


def test_heartbeat_and_health(store: StateStore, redis_server: RedisInfo) -> None:
    assert store.tailer.health() is None
    metrics = {"commit": 123456, "lag_ms": 40, "events_per_s": 812.5, "open_windows": 2}
    store.tailer.beat("tailer-a", metrics, ttl_s=0.5)
    health = store.tailer.health()
    assert health is not None
    assert health.owner == "tailer-a" and health.metrics == metrics
    seconds, micros = redis_server.client().time()
    assert health.at_ms <= seconds * 1000 + micros // 1000, "stamped by the Redis clock"
    assert isinstance(health.age_ms, int) and health.age_ms >= 0
    wait_for(lambda: store.tailer.health() is None, 5, "the heartbeat expiring")


def test_schemas_persist_only_grow_and_are_fenced(store: StateStore) -> None:
    """What a restarted tailer or a new leader numbers schemas from."""
    table = TableRef("app", "orders")
    v1 = TableSchema((Column("id", "bigint", False, None),), ("id",))
    v2 = TableSchema((*v1.columns, Column("flag", "integer", True, "7")), ("id",))
    first = store.tailer.acquire_lease("tailer-a", 10_000)
    assert first is not None
    assert store.tailer.load_schemas() == []
    assert store.tailer.save_schema(KnownSchema(table, 1, v1, Position(10, 0)), first)
    assert store.tailer.save_schema(KnownSchema(table, 2, v2, Position(2**64 - 1, 4)), first)
    assert not store.tailer.save_schema(KnownSchema(table, 1, v1, Position(10, 0)), first), (
        "an older version (a replay) is not saved over a newer one"
    )
    assert store.tailer.load_schemas() == [
        KnownSchema(table, 1, v1, Position(10, 0)),
        KnownSchema(table, 2, v2, Position(2**64 - 1, 4)),
    ]

    assert store.tailer.release_lease("tailer-a", first)
    second = store.tailer.acquire_lease("tailer-b", 10_000)
    assert second is not None
    with pytest.raises(FencedOut):
        store.tailer.save_schema(KnownSchema(table, 3, v1, Position(2**64 - 1, 6)), first)
    assert [k.version for k in store.tailer.load_schemas()] == [1, 2]


def test_schemas_keep_what_a_replay_from_the_checkpoint_can_meet(store: StateStore) -> None:
    """Every version after the checkpoint and the one in effect there: a restarted tailer
    stamps the rows it reads again with the versions they first had."""
    table = TableRef("app", "orders")
    v1 = TableSchema((Column("id", "bigint", False, None),), ("id",))
    v2 = TableSchema((*v1.columns, Column("flag", "integer", True, "7")), ("id",))
    token = store.tailer.acquire_lease("tailer-a", 10_000)
    assert token is not None
    versions = [KnownSchema(table, n, (v1, v2)[n % 2], Position(n * 10, 0)) for n in (1, 2, 3)]
    for known in versions:
        assert store.tailer.save_schema(known, token)
    assert store.tailer.load_schemas() == versions, "no checkpoint yet: every version"
    store.tailer.save_checkpoint(25, token)
    later = KnownSchema(table, 4, v2, Position(40, 0))
    assert store.tailer.save_schema(later, token)
    assert store.tailer.load_schemas() == [*versions[1:], later], "v1 is behind the checkpoint"
    assert not store.tailer.save_schema(versions[2], token), "a replayed version is not saved"


def test_a_schema_stored_by_an_earlier_release_loads_and_grows(store: StateStore) -> None:
    """Earlier releases kept one schema object per table."""
    table = TableRef("app", "orders")
    v1 = TableSchema((Column("id", "bigint", False, None),), ("id",))
    old = {"version": 3, "schema": v1.to_json(), "position": [2**64 - 1, 2]}
    store.tailer._r.hset(store.tailer.keys.tailer_schemas, str(table), json.dumps(old))
    assert store.tailer.load_schemas() == [KnownSchema(table, 3, v1, Position(2**64 - 1, 2))]
    token = store.tailer.acquire_lease("tailer-a", 10_000)
    assert token is not None
    assert not store.tailer.save_schema(KnownSchema(table, 3, v1, Position(10, 0)), token)
    assert store.tailer.save_schema(KnownSchema(table, 4, v1, Position(2**64 - 1, 6)), token)
    assert [k.version for k in store.tailer.load_schemas()] == [3, 4]


def test_the_resume_point_is_saved_with_the_checkpoint_under_the_fence(store: StateStore) -> None:
    """A source whose reader resumes from a point of its own (MySQL) gets it back as saved with
    the last checkpoint; a stale leader moves neither; a checkpoint without one clears it."""
    assert store.tailer.load_resume() is None
    first = store.tailer.acquire_lease("tailer-a", 10_000)
    assert first is not None
    store.tailer.save_checkpoint(10, first, '{"gtid": "0-1-5"}')
    assert (store.tailer.load_checkpoint(), store.tailer.load_resume()) == (10, '{"gtid": "0-1-5"}')
    assert store.tailer.release_lease("tailer-a", first)
    second = store.tailer.acquire_lease("tailer-b", 10_000)
    assert second is not None
    with pytest.raises(FencedOut):
        store.tailer.save_checkpoint(20, first, '{"gtid": "0-1-9"}')
    assert (store.tailer.load_checkpoint(), store.tailer.load_resume()) == (10, '{"gtid": "0-1-5"}')
    store.tailer.save_checkpoint(30, second)
    assert (store.tailer.load_checkpoint(), store.tailer.load_resume()) == (30, None)
