"""The whole configuration in a `dblog` connection: its extra holds the TOML's sections, read
by the TOML's own loader. The same deployment described by a file and by a connection gives
the same `Config`; a mistake in the extra is named with the file's message, the connection in
place of the file; the passwords reach the Spark dump under the default variables."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import Connection

from airflow_provider_dblog.config import ConfigError, load_config, parse_config
from airflow_provider_dblog.hooks.dblog import SECRET_ENV_DEFAULTS, DBLogConnection, DBLogHook

SECTIONS: dict[str, dict[str, Any]] = {
    "source": {
        "type": "postgres",
        "name": "shop",
        "dsn": "host=db.internal port=5432 dbname=shop user=dblog",
        "tables": ["public.accounts", "orders"],
        "read_only": True,
    },
    "output": {"type": "ndjson", "directory": "/var/lib/dblog/events"},
    "tailer": {"window_ttl_s": 30, "metrics_port": 9187},
    "lake": {"root": "/var/lib/dblog/lake"},
}
PLAIN = (
    {"host": "redis.internal", "port": 6380, "schema": "2", "login": "dblog-airflow"},
    {},
    {"url": "redis://dblog-airflow@redis.internal:6380/2"},
)
SENTINELS = (
    {"schema": "1"},
    {
        "sentinels": "s1:26379, s2:26379",
        "service_name": "mymaster",
        "sentinel_password": "sentinel-pw",
    },
    {
        "sentinels": ["s1:26379", "s2:26379"],
        "service_name": "mymaster",
        "db": 1,
        "sentinel_password_env": SECRET_ENV_DEFAULTS["sentinel"],
    },
)


def toml_text(data: dict[str, dict[str, Any]]) -> str:
    """Sections of plain values as TOML (JSON's strings, numbers, booleans and lists are
    TOML's)."""
    return "".join(
        f"[{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in section.items())
        for name, section in data.items()
    )


def connection(extra: dict[str, Any], **fields: Any) -> Connection:
    return Connection(conn_id="dblog_unit", conn_type="dblog", extra=json.dumps(extra), **fields)


@pytest.mark.parametrize(("fields", "extra", "redis"), [PLAIN, SENTINELS], ids=["url", "sentinels"])
def test_a_connection_and_a_toml_of_one_deployment_give_the_same_config(
    tmp_path: Path, fields: dict[str, Any], extra: dict[str, Any], redis: dict[str, Any]
) -> None:
    toml = tmp_path / "dblog.toml"
    source = {**SECTIONS["source"], "password_env": SECRET_ENV_DEFAULTS["source"]}
    redis = {**redis, "password_env": SECRET_ENV_DEFAULTS["redis"]}
    toml.write_text(toml_text({**SECTIONS, "source": source, "redis": redis}))
    conn = connection(
        {**SECTIONS, **extra, "source_password": "pg-pw"}, password="redis-pw", **fields
    )

    parsed = DBLogConnection.parse(conn, "pg-pw")
    assert parsed.read_config() == load_config(toml)
    assert (parsed.source_name, parsed.config_path) == ("shop", None)
    assert "pg-pw" not in json.dumps(parsed.config_data) and "redis-pw" not in repr(parsed)


def test_a_source_naming_its_password_variable_keeps_it_and_the_spark_dump_gets_the_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What `secret_env` hands spark-submit: the connection's passwords under the variables
    the configuration names, the defaults where the extra names none."""
    source = {**SECTIONS["source"], "password_env": "SHOP_PG_PASSWORD"}
    extra = {"source": source, "output": SECTIONS["output"], "source_conn_id": "pg_shop"}
    dblog = {"conn_type": "dblog", "password": "redis-pw", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_UNIT", json.dumps(dblog))
    monkeypatch.setenv(
        "AIRFLOW_CONN_PG_SHOP", json.dumps({"conn_type": "postgres", "password": "pg-pw"})
    )
    hook = DBLogHook("dblog_unit")
    assert hook.secret_env() == {"SHOP_PG_PASSWORD": "pg-pw", "DBLOG_REDIS_PASSWORD": "redis-pw"}
    assert hook.config.lake_root is None and hook.config.source.name == "shop"


Mutation = Callable[[dict[str, dict[str, Any]]], None]
BAD: dict[str, Mutation] = {
    "no-output": lambda d: d.pop("output"),
    "no-tables": lambda d: d["source"].pop("tables"),
    "a-password": lambda d: d["source"].update(password="x"),
    "a-password-in-the-dsn": lambda d: d["source"].update(dsn="host=h user=u password=x"),
    "unknown-source-option": lambda d: d["source"].update(slots=2),
    "unknown-type": lambda d: d["source"].update(type="oracle"),
    "tables-as-text": lambda d: d["source"].update(tables="orders"),
    "unknown-tailer-option": lambda d: d["tailer"].update(window_ttl=3),
    "bad-metrics-port": lambda d: d["tailer"].update(metrics_port=0),
    "unknown-lake-option": lambda d: d["lake"].update(rot="/x"),
    "bad-lake-root": lambda d: d["lake"].update(root=3),
}


@pytest.mark.parametrize("mutate", BAD.values(), ids=BAD.keys())
def test_a_bad_extra_is_refused_with_the_toml_loader_s_message(
    tmp_path: Path, mutate: Mutation
) -> None:
    data = json.loads(json.dumps(SECTIONS))
    mutate(data)
    toml = tmp_path / "dblog.toml"
    toml.write_text(toml_text({**data, "redis": {"url": "redis://127.0.0.1:6379/0"}}))
    with pytest.raises(ConfigError) as from_file:
        load_config(toml)
    with pytest.raises(ConfigError) as from_connection:
        DBLogConnection.parse(connection(data), None)
    expected = str(from_file.value).replace(f"config file {toml}", "connection 'dblog_unit'")
    assert "connection 'dblog_unit'" in expected
    assert str(from_connection.value) == expected
    assert "password=x" not in expected


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {**SECTIONS, "config_path": "/etc/dblog.toml"},
            "has both a config_path and the extras source, output, tailer, lake: keep the "
            "configuration in one place",
        ),
        (
            {**SECTIONS, "redis": {"url": "redis://elsewhere:6379/0"}},
            "its Redis is the connection's host, port, login, password and schema",
        ),
        (
            {**SECTIONS, "source_name": "other"},
            "has source_name 'other' but its source extra names 'shop': leave source_name out",
        ),
        ({"source": "host=db", "output": {}}, "source must be a [source] section, got 'host=db'"),
    ],
    ids=["both", "redis", "another-name", "source-as-text"],
)
def test_a_connection_that_contradicts_itself_is_refused_naming_what(
    extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match="connection 'dblog_unit'") as refused:
        DBLogConnection.parse(connection(extra), None)
    assert message in str(refused.value)


def test_the_test_button_says_what_is_wrong_in_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    data = json.loads(json.dumps(SECTIONS))
    data["source"]["tables"] = []
    conn = {"conn_type": "dblog", "host": "127.0.0.1", "port": 1, "extra": data}
    monkeypatch.setenv("AIRFLOW_CONN_XQ7RANDOM", json.dumps(conn))
    ok, message = DBLogHook("xq7random").test_connection()
    assert not ok
    assert message == "this connection: the PostgreSQL source captures no table: list at least one"


def test_the_spark_dump_reads_the_sections_the_connection_hands_it() -> None:
    """`--config-json`: what the launcher passes for such a connection, read by the same
    loader into the same `Config`."""
    parsed = DBLogConnection.parse(connection({**SECTIONS, "source_password": "pg-pw"}), "pg-pw")
    passed = json.loads(json.dumps(parsed.config_data))
    assert parse_config(passed, "--config-json") == parsed.read_config()
