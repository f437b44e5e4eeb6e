"""RedisSettings builds every client the same way: one Redis by url (TLS files with rediss://),
or the primary that sentinels name; it pickles to Spark executors as it is; a missing password
variable is named."""

from __future__ import annotations

import pickle

import pytest
import redis.asyncio.sentinel
import redis.sentinel
from redis.connection import SSLConnection

from airflow_provider_dblog.state.connection import (
    RedisSettings,
    RedisSettingsError,
    no_primary,
)

SENTINELS = RedisSettings(
    sentinels=(("s1", 26379), ("s2", 26379)),
    service_name="mymaster",
    password_env="UNIT_REDIS_PASSWORD",
    sentinel_password_env="UNIT_SENTINEL_PASSWORD",
    username="dblog-dump",
    db=3,
    tls=True,
    ca_file="/etc/ca.crt",
)


def test_settings_pickle_as_plain_data_for_spark_executors() -> None:
    assert pickle.loads(pickle.dumps(SENTINELS)) == SENTINELS


def test_a_sentinel_client_asks_for_the_service_over_tls_with_both_passwords(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("UNIT_REDIS_PASSWORD", "redis-secret")
    monkeypatch.setenv("UNIT_SENTINEL_PASSWORD", "sentinel-secret")
    pool = SENTINELS.client().connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    primary = pool.connection_kwargs
    assert (primary["username"], primary["password"], primary["db"]) == (
        "dblog-dump",
        "redis-secret",
        3,
    )
    assert issubclass(pool.connection_class, SSLConnection)
    sentinel = pool.sentinel_manager.sentinels[1].connection_pool.connection_kwargs
    assert (sentinel["host"], sentinel["port"], sentinel["password"]) == (
        "s2",
        26379,
        "sentinel-secret",
    )
    assert sentinel["ssl_ca_certs"] == "/etc/ca.crt" and sentinel["socket_connect_timeout"] == 5
    async_pool = SENTINELS.async_client().connection_pool
    assert isinstance(async_pool, redis.asyncio.sentinel.SentinelConnectionPool)
    assert async_pool.connection_kwargs["password"] == "redis-secret"


def test_a_rediss_url_carries_the_tls_files() -> None:
    settings = RedisSettings(
        url="rediss://dblog@redis.internal:6380/1", ca_file="/ca", cert_file="/c", key_file="/k"
    )
    kwargs = settings.client().connection_pool.connection_kwargs
    assert (kwargs["ssl_ca_certs"], kwargs["ssl_certfile"], kwargs["ssl_keyfile"]) == (
        "/ca",
        "/c",
        "/k",
    )
    assert settings.where == "redis.internal:6380/1"
    plain = RedisSettings(url="redis://127.0.0.1:6379/0").client().connection_pool
    assert "ssl_ca_certs" not in plain.connection_kwargs


def test_a_password_variable_that_is_not_set_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UNIT_REDIS_PASSWORD", raising=False)
    with pytest.raises(
        RedisSettingsError,
        match="password_env names environment variable UNIT_REDIS_PASSWORD, which is not set",
    ):
        SENTINELS.client()


def test_no_primary_says_why_for_each_sentinel() -> None:
    sentinels = [redis.Redis("s1", 1), redis.Redis("s2", 2), redis.Redis("s3", 3)]
    answers = [redis.ConnectionError("refused"), {"cache": {}}, {"mymaster": {"is_odown": True}}]
    assert no_primary("mymaster", sentinels, answers) == (
        "no sentinel names a primary for service 'mymaster': "
        "sentinel s1:1 does not answer (refused); "
        "sentinel s2:2 watches no service 'mymaster' (it knows cache); "
        "sentinel s3:3 sees the primary down: a failover may be under way"
    )
