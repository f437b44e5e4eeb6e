"""A `dblog` connection read into `DBLogConnection`: defaults, extras under either spelling,
the Redis database in `schema`, and the errors that name what to fix."""

from __future__ import annotations

import json
from typing import Any

import pytest
from airflow.sdk import Connection

from airflow_provider_dblog.config import ConfigError
from airflow_provider_dblog.hooks.dblog import DBLogConnection, connection_extras


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
        host="redis.internal",
        port=6380,
        db=3,
        username="dblog",
        password="redis-secret",
        ssl=True,
        source_name="shop",
        config_path="/etc/dblog.toml",
        source_password="source-secret",
    )
    assert "redis-secret" not in repr(parsed) and "source-secret" not in repr(parsed)
    kwargs = parsed.redis_kwargs()
    assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["ssl"]) == (
        "redis.internal",
        6380,
        3,
        True,
    )
    assert (kwargs["username"], kwargs["password"]) == ("dblog", "redis-secret")


def test_an_empty_connection_defaults_to_a_local_redis_without_tls() -> None:
    parsed = DBLogConnection.parse(connection({"source_name": "s", "config_path": "p"}), None)
    assert (parsed.host, parsed.port, parsed.db, parsed.ssl) == ("127.0.0.1", 6379, 0, False)
    assert parsed.username is None and parsed.password is None
    assert parsed.source_password is None


def test_extras_are_read_under_the_prefix_older_forms_give_them_and_blanks_dropped() -> None:
    conn = connection(
        {
            "extra__dblog__source_name": "shop",
            "extra__dblog__config_path": "/etc/dblog.toml",
            "extra__dblog__source_conn_id": "",
            "source_password": None,
            "ssl": "yes",
        }
    )
    assert connection_extras(conn) == {
        "source_name": "shop",
        "config_path": "/etc/dblog.toml",
        "ssl": "yes",
    }
    parsed = DBLogConnection.parse(conn, None)
    assert (parsed.source_name, parsed.config_path, parsed.ssl) == ("shop", "/etc/dblog.toml", True)


@pytest.mark.parametrize(
    ("extra", "schema", "message"),
    [
        ({"config_path": "p"}, None, "needs source_name in its extras"),
        ({"source_name": "s"}, None, "needs config_path in its extras"),
        ({}, None, "needs source_name and config_path in its extras"),
        ({"source_name": "s", "config_path": "p"}, "db1", "schema is the Redis database number"),
    ],
)
def test_a_connection_missing_what_it_needs_is_refused_naming_it(
    extra: dict[str, Any], schema: str | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=f"connection 'dblog_unit'.*{message}"):
        DBLogConnection.parse(connection(extra, schema=schema), None)
