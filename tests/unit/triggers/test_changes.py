"""The change trigger and the table assets as a DAG file builds them: the URI scheme, what
the trigger serializes (the triggerer rebuilds it from the database), its own consumer group
per watch, arguments that fail the DAG's parse by name, and a deployment that does not fit
failing the trigger's start by name."""

from __future__ import annotations

import asyncio
import importlib
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from airflow_provider_dblog.assets import dblog_table, sanitize_uri, table_uri
from airflow_provider_dblog.config import ConfigError
from airflow_provider_dblog.triggers.change_batch import Watch
from airflow_provider_dblog.triggers.changes import DBLogChangeTrigger, resolve_stream


def test_a_table_asset_is_named_by_its_uri_and_watched_by_a_change_trigger() -> None:
    asset = dblog_table("shop", "public.orders", dblog_conn_id="c", ops=["d"], max_wait_s=0.5)
    assert asset.uri == asset.name == "dblog://shop/public.orders"
    (watcher,) = asset.watchers
    trigger = watcher.trigger
    assert isinstance(trigger, DBLogChangeTrigger)
    assert trigger.serialize()[1] == {
        "dblog_conn_id": "c",
        "source": "shop",
        "tables": ["public.orders"],
        "ops": ["d"],
        "max_changes": 1000,
        "max_wait_s": 0.5,
    }


def test_the_trigger_serializes_to_what_builds_it_again() -> None:
    trigger = DBLogChangeTrigger(
        dblog_conn_id="c",
        source="shop",
        tables=["public.b", "public.a"],
        ops=["u", "c"],
        max_changes=5,
        max_wait_s=1.5,
    )
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    assert kwargs["tables"] == ["public.a", "public.b"] and kwargs["ops"] == ["c", "u"]
    assert again.consumer_group == trigger.consumer_group
    assert again.shared_stream_key() == trigger.shared_stream_key()


def test_each_watch_reads_through_its_own_consumer_group() -> None:
    def group(**changed: Any) -> str:
        kwargs = {"dblog_conn_id": "c", "source": "shop", "tables": ["public.orders"], **changed}
        return DBLogChangeTrigger(**kwargs).consumer_group

    groups = {
        group(),
        group(ops=["d"]),
        group(max_changes=10),
        group(dblog_conn_id="other"),
        group(tables=["public.items"]),
    }
    assert len(groups) == 5
    assert all(g.startswith("airflow:public.") for g in groups)


@pytest.mark.parametrize(
    ("source", "table", "kwargs", "named"),
    [
        ("shop", "orders", {}, "'orders'"),
        ("shop", "public.orders", {"ops": ["c", "x"]}, "x"),
        ("shop", "public.orders", {"max_changes": 0}, "max_changes"),
        ("sh/op", "public.orders", {}, "'sh/op'"),
    ],
)
def test_bad_arguments_fail_the_dags_parse_naming_them(
    source: str, table: str, kwargs: dict[str, object], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        dblog_table(source, table, **kwargs)  # type: ignore[arg-type]


def test_the_uri_handler_refuses_a_uri_of_another_shape() -> None:
    good = urlsplit(table_uri("shop", "public.orders"))
    assert sanitize_uri(good) == good
    for bad in ("dblog://shop/orders", "dblog:///public.orders", "dblog://shop/a.b.c"):
        with pytest.raises(ValueError, match="not a DBLog table URI"):
            sanitize_uri(urlsplit(bad))


def test_airflow_checks_dblog_uris_with_the_providers_handler() -> None:
    from airflow.sdk import Asset

    assert Asset(uri="dblog://shop/public.orders").uri == "dblog://shop/public.orders"
    with pytest.raises(ValueError, match="not a DBLog table URI"):
        Asset(uri="dblog://shop/orders")


def _deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str) -> Watch:
    """A TOML for source `shop` capturing public.orders with `output`, and the connection
    `dblog_test` pointing at it; the watch of public.orders."""
    toml = tmp_path / "dblog.toml"
    toml.write_text(
        '[source]\ntype = "postgres"\nname = "shop"\ndsn = "host=db dbname=shop user=u"\n'
        'tables = ["public.orders"]\n\n[redis]\nurl = "redis://127.0.0.1:6379/0"\n\n'
        f"[output]\n{output}\n"
    )
    conn = {"conn_type": "dblog", "extra": {"source_name": "shop", "config_path": str(toml)}}
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_TEST", json.dumps(conn))
    return Watch.of("shop", ["public.orders"], ["d"])


STREAM = 'type = "redis_stream"\nurl_env = "TEST_STREAM_URL"\nper_table = true'


def test_a_fitting_deployment_resolves_to_the_tables_streams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watch = _deployment(tmp_path, monkeypatch, STREAM)
    monkeypatch.setenv("TEST_STREAM_URL", "redis://:secret@127.0.0.1:6379/0")
    stream = asyncio.run(resolve_stream("dblog_test", watch, "g"))
    assert stream.streams == ("dblog:shop:events:public.orders",) and stream.group == "g"
    assert "secret" not in repr(stream)


@pytest.mark.parametrize(
    ("conn_id", "watch", "output", "named"),
    [
        ("dblog_nope", None, STREAM, "connection 'dblog_nope', which does not exist"),
        ("dblog_test", ("shop", "public.items"), STREAM, "does not capture public.items"),
        ("dblog_test", ("other", "public.orders"), STREAM, "names source 'other'"),
        ("dblog_test", None, 'type = "ndjson"\ndirectory = "x"', "type is 'ndjson'"),
        ("dblog_test", None, STREAM, "TEST_STREAM_URL"),
    ],
)
def test_bad_configuration_fails_the_trigger_start_naming_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    conn_id: str,
    watch: tuple[str, str] | None,
    output: str,
    named: str,
) -> None:
    default = _deployment(tmp_path, monkeypatch, output)
    monkeypatch.delenv("TEST_STREAM_URL", raising=False)
    watched = default if watch is None else Watch.of(watch[0], [watch[1]], ["d"])
    with pytest.raises(ConfigError, match=re.escape(named)):
        asyncio.run(resolve_stream(conn_id, watched, "g"))
