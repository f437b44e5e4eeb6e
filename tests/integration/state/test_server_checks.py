"""A Redis that may evict keys is refused by the tailer and by dumps, with a message that names
the policy and the fix; without a memory limit, or with `noeviction`, it is taken."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs import NdjsonOutput
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.state.server import EvictingRedis, check_no_eviction
from airflow_provider_dblog.tailer import Tailer, TailerFailed
from tests.integration.e2e_support import drop_databases, make_databases

pytestmark = pytest.mark.integration
EVICTS = "maxmemory-policy allkeys-lru"


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[redis.Redis]:
    with RedisServer(tmp_path / "redis") as server:
        yield server.info.client()


def test_only_a_limit_with_an_evicting_policy_is_refused(private_redis: redis.Redis) -> None:
    check_no_eviction(private_redis)  # no limit: nothing is evicted, whatever the policy
    private_redis.config_set("maxmemory-policy", "allkeys-lru")
    check_no_eviction(private_redis)
    private_redis.config_set("maxmemory", "100mb")
    with pytest.raises(EvictingRedis, match=rf"{EVICTS}.*Set maxmemory-policy noeviction"):
        check_no_eviction(private_redis)
    private_redis.config_set("maxmemory-policy", "noeviction")
    check_no_eviction(private_redis)


def test_the_tailer_and_a_dump_refuse_an_evicting_redis(
    private_redis: redis.Redis, pg15: PostgresInfo, tmp_path: Path
) -> None:
    private_redis.config_set("maxmemory", "100mb")
    private_redis.config_set("maxmemory-policy", "volatile-ttl")
    dbs = make_databases(pg15, 0, target=False, seed_value=0)
    try:
        store = StateStore(private_redis, dbs.config.name)
        store.dumps.create(DumpRequest("d", DumpKind.TABLE, (dbs.tables[0],)))
        with pytest.raises(EvictingRedis, match="maxmemory-policy volatile-ttl"):
            run_dump(store, dbs.source.chunk_source, "d")
        status = store.dumps.status("d")
        assert status is not None and "volatile-ttl" in status.reason
        tailer = Tailer(dbs.source, store, NdjsonOutput(tmp_path / "events"), owner="t")
        with pytest.raises(TailerFailed, match="maxmemory-policy volatile-ttl"):
            tailer.run(threading.Event())
    finally:
        drop_databases(dbs)
