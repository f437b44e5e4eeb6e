"""The change trigger and the table assets as a DAG file builds them: the URI scheme, what
the trigger serializes (the triggerer rebuilds it from the database), its own consumer group
per watch, and arguments that fail the DAG's parse by name."""

from __future__ import annotations

import importlib
import json
from urllib.parse import urlsplit

import pytest

from airflow_provider_dblog.assets import dblog_table, sanitize_uri, table_uri
from airflow_provider_dblog.triggers.changes import DBLogChangeTrigger


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
    trigger = DBLogChangeTrigger("c", "shop", ["public.b", "public.a"], ["u", "c"], 5, 1.5)
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    assert kwargs["tables"] == ["public.a", "public.b"] and kwargs["ops"] == ["c", "u"]
    assert again.consumer_group == trigger.consumer_group
    assert again.shared_stream_key() == trigger.shared_stream_key()


def test_each_watch_reads_through_its_own_consumer_group() -> None:
    groups = {
        DBLogChangeTrigger("c", "shop", ["public.orders"]).consumer_group,
        DBLogChangeTrigger("c", "shop", ["public.orders"], ["d"]).consumer_group,
        DBLogChangeTrigger("c", "shop", ["public.orders"], max_changes=10).consumer_group,
        DBLogChangeTrigger("other", "shop", ["public.orders"]).consumer_group,
        DBLogChangeTrigger("c", "shop", ["public.items"]).consumer_group,
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
