"""A `dblog` connection read into `DBLogConnection`: defaults, extras under either spelling,
the Redis database in `schema`, sentinels and TLS, and the errors that name what to fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import Connection
from redis.connection import SSLConnection
from redis.sentinel import SentinelConnectionPool

from airflow_provider_dblog.config import ConfigError
from airflow_provider_dblog.hooks.dblog import DBLogConnection, connection_extras
from airflow_provider_dblog.state.connection import RedisSettings


def connection(extra: dict[str, Any], **fields: Any) -> Connection:
    return Connection(conn_id="dblog_unit", conn_type="dblog", extra=json.dumps(extra), **fields)


def test_a_full_connection_reads_into_its_fields_with_passwords_out_of_repr() -> None:
    conn = connection(
        {"source_name": "shop", "config_path": "/etc/dblog.toml", "ssl": "true"},
        host="redis.internal",
        port=6380,
        schema="3",
        login="dblog",
        password="redis-secret",
    )
    parsed = DBLogConnection.parse(conn, "source-secret")
    assert parsed == DBLogConnection(
        conn_id="dblog_unit",
        redis=RedisSettings(url="rediss://dblog@redis.internal:6380/3"),
        password="redis-secret",
        sentinel_password=None,
        source_name="shop",
        config_path="/etc/dblog.toml",
        config_data=None,
        source_password="source-secret",
    )
    assert "redis-secret" not in repr(parsed) and "source-secret" not in repr(parsed)
    kwargs = parsed.redis_client().connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("redis.internal", 6380, 3)
    assert (kwargs["username"], kwargs["password"]) == ("dblog", "redis-secret")
    assert parsed.redis_client().connection_pool.connection_class is SSLConnection


def test_a_connection_with_sentinels_names_the_service_they_watch(tmp_path: Path) -> None:
    ca_file = tmp_path / "ca.crt"
    ca_file.write_text("not read until a connection is made")
    conn = connection(
        {
            "source_name": "shop",
            "config_path": "/etc/dblog.toml",
            "sentinels": "s1:26379, s2:26380",
            "service_name": "mymaster",
            "sentinel_password": "sentinel-secret",
            "ssl": True,
            "ca_file": str(ca_file),
        },
        host="ignored",
        schema="2",
        login="dblog-airflow",
        password="redis-secret",
    )
    parsed = DBLogConnection.parse(conn, None)
    assert parsed.redis == RedisSettings(
        sentinels=(("s1", 26379), ("s2", 26380)),
        service_name="mymaster",
        username="dblog-airflow",
        db=2,
        tls=True,
        ca_file=str(ca_file),
    )
    assert "sentinel-secret" not in repr(parsed)
    pool = parsed.redis_client().connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "mymaster"
    sentinel = pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
    assert (sentinel["password"], sentinel["ssl_ca_certs"]) == ("sentinel-secret", str(ca_file))


def test_an_empty_connection_defaults_to_a_local_redis_without_tls() -> None:
    parsed = DBLogConnection.parse(connection({"source_name": "s", "config_path": "p"}), None)
    assert parsed.redis == RedisSettings(url="redis://127.0.0.1:6379/0")
    assert not parsed.redis.uses_tls and parsed.password is None
    assert parsed.source_password is None


def test_extras_are_read_under_the_prefix_older_forms_give_them_and_blanks_dropped() -> None:
    conn = connection(
        {
            "extra__dblog__source_name": "shop",
            "extra__dblog__config_path": "/etc/dblog.toml",
            "extra__dblog__source_conn_id": "",
            "source_password": None,
            "lake": {},
            "ssl": "yes",
        }
    )
    assert connection_extras(conn) == {
        "source_name": "shop",
        "config_path": "/etc/dblog.toml",
        "ssl": "yes",
    }
    parsed = DBLogConnection.parse(conn, None)
    assert (parsed.source_name, parsed.config_path) == ("shop", "/etc/dblog.toml")
    assert parsed.redis.uses_tls


@pytest.mark.parametrize(
    ("extra", "schema", "message"),
    [
        ({"config_path": "p"}, None, "needs source_name in its extras"),
        ({"source_name": "s"}, None, "needs config_path in its extras"),
        ({}, None, "holds no DBLog configuration: give its source and output extras"),
        ({"source_name": "s", "config_path": "p"}, "db1", "schema is the Redis database number"),
        (
            {"source_name": "s", "config_path": "p", "sentinels": "s1"},
            None,
            "sentinels must be a list of host:port: 's1' is not host:port",
        ),
        (
            {"source_name": "s", "config_path": "p", "sentinels": "s1:26379"},
            None,
            "service_name must name the primary the sentinels watch",
        ),
        (
            {"source_name": "s", "config_path": "p", "ssl": True, "ca_file": "/nonexistent"},
            None,
            "ca_file is '/nonexistent', which is not a readable file",
        ),
    ],
)
def test_a_connection_missing_what_it_needs_is_refused_naming_it(
    extra: dict[str, Any], schema: str | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=f"connection 'dblog_unit'.*{message}"):
        DBLogConnection.parse(connection(extra, schema=schema), None)


def test_reading_the_extras_masks_the_source_password_and_warns_of_no_short_secret(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task log's "Skipping masking for a secret as it's too short" came from the source
    name: `extra_dejson` hands every extra value to the masker, which warns at the first one
    under five characters before it looks at the value's name."""
    from airflow.sdk._shared.secrets_masker import SecretsMasker, redact

    from airflow_provider_dblog.hooks.dblog import DBLogHook

    conn = connection(
        {"source_name": "shop", "config_path": "/etc/dblog.toml", "source_password": "s3cr3t-pg"}
    )
    monkeypatch.setattr(SecretsMasker, "_has_warned_short_secret", False)
    with caplog.at_level("WARNING"):
        extras = connection_extras(conn)
        assert DBLogHook("dblog_unit")._source_password(extras) == "s3cr3t-pg"
    assert "too short" not in caplog.text
    assert redact("password s3cr3t-pg") == "password ***"

    with caplog.at_level("WARNING"):
        conn.extra_dejson  # noqa: B018 - what the hook read before: the source name warns
    assert "Skipping masking for a secret as it's too short" in caplog.text


@pytest.mark.parametrize("extra", ["not json", "[1, 2]"])
def test_extras_that_are_no_json_object_are_refused_naming_the_connection(extra: str) -> None:
    conn = Connection(conn_id="dblog_unit", conn_type="dblog", extra=extra)
    with pytest.raises(ConfigError, match="connection 'dblog_unit': its extra is not"):
        connection_extras(conn)


def test_the_test_button_says_this_connection_not_the_random_id_airflow_tests_it_under(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_provider_dblog.hooks.dblog import DBLogHook

    conn = {"conn_type": "dblog", "host": "127.0.0.1", "extra": {"source_name": "shop"}}
    monkeypatch.setenv("AIRFLOW_CONN_XQ7RANDOM", json.dumps(conn))
    ok, message = DBLogHook("xq7random").test_connection()
    assert not ok
    assert message == "this connection needs config_path in its extras", message


def test_with_sentinels_the_hook_hands_both_redis_passwords_to_the_toml_s_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the Spark dump gets (`secret_env`): the Redis and the sentinels' passwords under
    the names the TOML gives them; a TOML naming other sentinels is refused."""
    from airflow_provider_dblog.hooks.dblog import DBLogHook

    toml = tmp_path / "dblog.toml"
    redis_section = (
        '[redis]\nsentinels = ["s1:26379", "s2:26379"]\nservice_name = "mymaster"\n'
        'password_env = "R_PW"\nsentinel_password_env = "S_PW"\n'
    )
    toml.write_text(
        '[source]\nname = "shop"\ndsn = "host=h dbname=d user=u"\ntables = ["t"]\n'
        + redis_section
        + '[output]\ntype = "ndjson"\ndirectory = "out"\n'
    )
    extra = {
        "source_name": "shop",
        "config_path": str(toml),
        "sentinels": "s1:26379,s2:26379",
        "service_name": "mymaster",
        "sentinel_password": "sentinel-secret",
    }
    conn = {"conn_type": "dblog", "password": "redis-secret", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_HA", json.dumps(conn))
    assert DBLogHook("dblog_ha").secret_env() == {"R_PW": "redis-secret", "S_PW": "sentinel-secret"}

    toml.write_text(toml.read_text().replace('"s2:26379"]', '"s3:26379"]'))
    with pytest.raises(ConfigError, match=r"points at Redis service mymaster db 0 \(sentinels s1"):
        _ = DBLogHook("dblog_ha").config
