"""The change stream as common-messaging's queue, as a DAG file builds it: Airflow's
`MessageQueueTrigger` finds the `dblog` provider through the provider info and serializes as
the `DBLogChangeTrigger` the triggerer runs, by scheme or by queue URI; a queue URI that is
not one of ours fails naming what is wrong."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import Asset, AssetWatcher

from airflow_provider_dblog.assets import dblog_table
from airflow_provider_dblog.queues.dblog import DBLogMessageQueueProvider, parse_queue_uri
from airflow_provider_dblog.triggers.changes import DBLogChangeTrigger

CLASSPATH = "airflow_provider_dblog.triggers.changes.DBLogChangeTrigger"


def test_the_dblog_scheme_builds_the_change_trigger_with_the_default_connection() -> None:
    trigger = MessageQueueTrigger(scheme="dblog", source="shop", tables=["public.orders"])
    asset = Asset(
        "dblog://shop/public.orders",
        watchers=[AssetWatcher(name="orders", trigger=trigger)],
    )
    assert asset.watchers[0].trigger is trigger
    assert trigger.serialize() == (
        CLASSPATH,
        {
            "dblog_conn_id": "dblog_default",
            "source": "shop",
            "tables": ["public.orders"],
            "ops": ["c", "d", "u"],
            "max_changes": 1000,
            "max_wait_s": 2.0,
        },
    )


def test_a_queue_uri_builds_the_same_trigger_with_its_connection() -> None:
    with pytest.warns(AirflowProviderDeprecationWarning):
        by_uri = MessageQueueTrigger(
            queue="dblog://shop/public.orders?conn_id=dblog_shop", ops=["d"], max_wait_s=0.5
        )
    by_scheme = MessageQueueTrigger(
        scheme="dblog",
        dblog_conn_id="dblog_shop",
        source="shop",
        tables=["public.orders"],
        ops=["d"],
        max_wait_s=0.5,
    )
    direct = DBLogChangeTrigger(
        dblog_conn_id="dblog_shop",
        source="shop",
        tables=["public.orders"],
        ops=["d"],
        max_wait_s=0.5,
    )
    (watcher,) = dblog_table(
        "shop", "public.orders", dblog_conn_id="dblog_shop", ops=["d"], max_wait_s=0.5
    ).watchers
    # The same arguments, so the same consumer group: a DAG moved between forms loses nothing.
    assert by_uri.serialize() == by_scheme.serialize() == direct.serialize()
    assert watcher.trigger.serialize() == direct.serialize()


def test_every_dblog_uri_is_ours_and_no_other_is() -> None:
    provider = DBLogMessageQueueProvider()
    assert provider.scheme_matches("dblog") and not provider.scheme_matches("redis+pubsub")
    assert provider.queue_matches("dblog://shop/public.orders")
    assert provider.queue_matches("dblog:shop")  # malformed, but refused by us, by name
    assert not provider.queue_matches("redis+pubsub://localhost/dblog")


@pytest.mark.parametrize(
    ("queue", "named"),
    [
        ("dblog:///public.orders", "it names no source"),
        ("dblog://shop", "a table is named 'schema.table', got ''"),
        ("dblog://shop/orders", "a table is named 'schema.table', got 'orders'"),
        ("dblog://shop/public.orders/public.items", "one table per queue"),
        ("dblog://u@shop/public.orders", "has no '/', '@' or ':', got 'u@shop'"),
        ("dblog://shop/public.orders?connid=x", "unknown query parameter(s) connid"),
        ("dblog://shop/public.orders?conn_id=", "conn_id must be one connection id, got ['']"),
        ("dblog://shop/public.orders?conn_id=a&conn_id=b", "got ['a', 'b']"),
        ("dblog://shop/public.orders?conn_id", "bad query field"),
        ("dblog://shop/public.orders#x", "it has a fragment"),
        ("kafka://shop/public.orders", "its scheme is 'kafka'"),
    ],
)
def test_a_bad_queue_uri_is_refused_naming_the_problem(queue: str, named: str) -> None:
    with pytest.raises(ValueError, match="is not a DBLog queue URI") as refused:
        parse_queue_uri(queue)
    assert named in str(refused.value)


@pytest.mark.parametrize(
    ("form", "named"),
    [
        ({"queue": "dblog://shop/orders"}, "is not a DBLog queue URI"),
        (
            {"queue": "dblog://shop/public.orders", "source": "x"},
            "drop the keyword argument(s) source",
        ),
        ({"scheme": "dblog", "source": "shop", "tables": []}, "at least one table"),
        ({"scheme": "dblog", "source": "shop", "tables": ["public.orders"], "ops": ["x"]}, "got x"),
    ],
)
@pytest.mark.filterwarnings("ignore::airflow.exceptions.AirflowProviderDeprecationWarning")
def test_a_bad_watch_fails_the_dags_serialization_naming_it(
    form: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError) as refused:
        MessageQueueTrigger(**form).serialize()
    assert named in str(refused.value)
