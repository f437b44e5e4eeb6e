"""A Redis client of each kind and a store on a source of its own, for the state tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import StateStore


@pytest.fixture(params=[False, True], ids=["bytes", "decoded"])
def client(redis_server: RedisInfo, request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    """Clients that return bytes and clients that decode: the stores work with either."""
    with redis_server.client(decode_responses=request.param) as client:
        yield client


@pytest.fixture
def store(client: redis.Redis) -> StateStore:
    """A store on a source of its own: the Redis server is shared by the whole session."""
    return StateStore(client, f"test-{uuid.uuid4().hex[:12]}")
