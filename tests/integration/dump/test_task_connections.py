"""A Spark dump's Python worker keeps its connections from one task to the next, on real
PostgreSQL and Redis: handed on after a task that ended well, opened anew after one that failed
or found a connection broken, or for another deployment."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from airflow_provider_dblog.config import Config, load_config
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.task_connections import task_connections
from tests.integration.e2e_support import (
    Databases,
    cli_env,
    drop_databases,
    make_databases,
    write_config,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, 30, target=False, seed_value=5)
    try:
        databases.source.ensure_setup()
        yield databases
    finally:
        drop_databases(databases)


@pytest.fixture
def config(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Config:
    for name, value in cli_env(dbs, redis_server).items():
        monkeypatch.setenv(name, value)
    return load_config(write_config(tmp_path / "dblog.toml", dbs, redis_server, {"type": "ndjson"}))


def test_a_task_hands_its_connections_to_the_next_unless_it_failed(
    config: Config, dbs: Databases
) -> None:
    table = dbs.tables[0]
    with task_connections(config) as first:
        assert first.source.read_chunk(Chunk(table, 0, limit=5)).rows
    with task_connections(config) as second:
        assert second is first, "a task that ended well hands its connections on"
        second.healthy = False  # as a task that found the source gone
    with task_connections(config) as third:
        assert third is not second
        assert third.source.read_chunk(Chunk(table, 0, limit=5)).rows
    with pytest.raises(RuntimeError), task_connections(config) as failing:
        raise RuntimeError("the task failed")
    with task_connections(config) as fourth:
        assert fourth is not failing and fourth is not third
    other = replace(
        config, redis=replace(config.redis, url=config.redis.url.rsplit("/", 1)[0] + "/1")
    )
    with task_connections(other) as fifth:
        assert fifth is not fourth and fifth.config == other
        fifth.healthy = False  # this process keeps nothing after the test
