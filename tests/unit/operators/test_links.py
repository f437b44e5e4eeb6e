"""The dump task's link to the live view: the URL of its dump's page, from the connection's
`ui_url`, for the operator's dump id or the task instance's default one; no link without a
`ui_url`, and a clear error for one that is not an http(s) URL."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from airflow.sdk.types import TaskInstanceKey

from airflow_provider_dblog.config import ConfigError
from airflow_provider_dblog.operators.dblog import DBLogDumpOperator
from airflow_provider_dblog.operators.links import (
    DBLogLiveViewLink,
    airflow_origin,
    live_view_url,
)

KEY = TaskInstanceKey("dblog_repair", "dump", "manual__2026-11-27T10:00:00+00:00", 1, -1)


def _connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **extra: str) -> None:
    conn = {"conn_type": "dblog", "host": "127.0.0.1", "extra": {"source_name": "shop", **extra}}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def test_the_link_opens_the_task_s_dump_in_the_live_view(monkeypatch: pytest.MonkeyPatch) -> None:
    _connection(monkeypatch, "dblog_links", ui_url="http://ui.internal:8765/")
    link = DBLogLiveViewLink()
    default = DBLogDumpOperator(task_id="dump", dblog_conn_id="dblog_links")
    assert link.get_link(default, ti_key=KEY) == (
        "http://ui.internal:8765/#dump=dblog_repair.manual__2026-11-27T10_00_00_00_00.dump"
    )
    named = DBLogDumpOperator(task_id="dump", dblog_conn_id="dblog_links", dump_id="a:b/c")
    assert link.get_link(named, ti_key=KEY) == "http://ui.internal:8765/#dump=a%3Ab%2Fc"
    assert live_view_url("https://x.example/ui", "d1") == "https://x.example/ui/#dump=d1"


def test_no_ui_url_no_link_and_a_bad_one_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    _connection(monkeypatch, "dblog_nolink")
    operator = DBLogDumpOperator(task_id="dump", dblog_conn_id="dblog_nolink")
    assert DBLogLiveViewLink().get_link(operator, ti_key=KEY) == ""
    _connection(monkeypatch, "dblog_badlink", ui_url="ui.internal:8765")
    operator = DBLogDumpOperator(task_id="dump", dblog_conn_id="dblog_badlink")
    with pytest.raises(ConfigError, match=r"'dblog_badlink': ui_url must be .* http\(s\) URL"):
        DBLogLiveViewLink().get_link(operator, ti_key=KEY)


def test_the_origin_names_the_run_and_task_with_their_airflow_urls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow.internal:8080/")
    ti = SimpleNamespace(dag_id="dblog_dump", run_id="manual__1 2", task_id="dump", map_index=2)
    assert airflow_origin(ti) == {
        "dag_id": "dblog_dump",
        "run_id": "manual__1 2",
        "task_id": "dump",
        "map_index": 2,
        "run_url": "http://airflow.internal:8080/dags/dblog_dump/runs/manual__1%202",
        "task_url": "http://airflow.internal:8080/dags/dblog_dump/runs/manual__1%202/tasks/dump/mapped/2",
    }


def test_the_dump_operator_declares_the_link() -> None:
    names = [link.name for link in DBLogDumpOperator.operator_extra_links]
    assert names == ["DBLog live view"]
