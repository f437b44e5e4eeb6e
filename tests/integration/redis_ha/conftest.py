"""The Redis deployments of production, for the tests of this folder: a Sentinel group (a
primary, a replica, three sentinels), a Redis that speaks TLS only (and checks the client
certificates offered to it against its CA), and a Sentinel group that speaks TLS only, each
started once per session. A test that kills the primary of
`redis_sentinels` must `heal()` the group after."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.devservices.redis_sentinel import RedisSentinelGroup
from airflow_provider_dblog.devservices.tls import make_test_ca
from tests.installed import installed
from tests.integration.redis_ha.support import TlsRedis


@pytest.fixture(scope="session")
def redis_sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinelGroup]:
    base = tmp_path_factory.mktemp("sentinels")
    with installed(lambda: RedisSentinelGroup(base)) as group:
        yield group


@pytest.fixture(scope="session")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    base = tmp_path_factory.mktemp("redis-tls")
    ca = make_test_ca(base / "ca")
    tls = ca.server_tls(["127.0.0.1"])
    with installed(lambda: RedisServer(base / "redis", tls=tls)) as server:
        with server.info.client() as admin:  # a client certificate offered is checked
            admin.config_set("tls-auth-clients", "optional")
        yield TlsRedis(server.info, ca)


@pytest.fixture(scope="session")
def tls_sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinelGroup]:
    base = tmp_path_factory.mktemp("sentinels-tls")
    tls = make_test_ca(base / "ca").server_tls(["127.0.0.1"])
    with installed(lambda: RedisSentinelGroup(base / "group", tls=tls)) as group:
        yield group
