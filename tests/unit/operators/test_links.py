"""The dump task's link to the live view: the URL of its dump's page, from the connection's
`ui_url`, for the operator's dump id or the task instance's default one, in the task's XCom as
soon as the dump is requested; no link without a `ui_url` (the task log says why), and a
clear error for one that is not an http(s) URL."""

from __future__ import annotations

import importlib
import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.types import TaskInstanceKey

from airflow_provider_dblog.config import ConfigError
from airflow_provider_dblog.hooks.dblog import DBLogHook
from airflow_provider_dblog.operators.dblog import DBLogDumpOperator
from airflow_provider_dblog.operators.links import (
    DBLogLiveViewLink,
    airflow_origin,
    link_dump_and_task,
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


class RecordingTi(SimpleNamespace):
    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def _requested(conn_id: str) -> tuple[RecordingTi, dict[str, Any]]:
    """`link_dump_and_task` as the dump operator calls it: what the task instance was handed
    (XCom) and what the store recorded (the dump's origin)."""
    origins: dict[str, Any] = {}
    store = SimpleNamespace(dumps=SimpleNamespace(record_origin=origins.__setitem__))
    hook = DBLogHook(conn_id)
    hook.__dict__["store"] = store  # the cached property: no Redis
    ti = RecordingTi(dag_id="dblog_repair", run_id="r1", task_id="dump", map_index=-1, pushed={})
    link_dump_and_task(hook, {"ti": ti}, "d1")  # type: ignore[typeddict-item]
    return ti, origins


def test_the_link_is_in_xcom_as_soon_as_the_dump_is_requested(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _connection(monkeypatch, "dblog_early", ui_url="http://ui.internal:8765")
    ti, origins = _requested("dblog_early")
    assert ti.pushed == {DBLogLiveViewLink().xcom_key: "http://ui.internal:8765/#dump=d1"}
    assert origins["d1"]["run_url"].endswith("/dags/dblog_repair/runs/r1")


def test_without_a_ui_url_the_log_says_why_the_task_has_no_link(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _connection(monkeypatch, "dblog_quiet")
    with caplog.at_level(logging.INFO, logger="airflow_provider_dblog.operators.links"):
        ti, origins = _requested("dblog_quiet")
    assert ti.pushed == {} and "d1" in origins
    assert "connection dblog_quiet has no ui_url extra" in caplog.text


def test_the_provider_registers_the_link() -> None:
    from airflow_provider_dblog.get_provider_info import get_provider_info

    (link,) = get_provider_info()["extra-links"]
    module, _, name = link.rpartition(".")
    assert getattr(importlib.import_module(module), name) is DBLogLiveViewLink
