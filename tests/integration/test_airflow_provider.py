"""The provider as Airflow sees it: DAG integrity, provider metadata, the connection form, the
hook against a real Redis and TOML, and the triggers (serialization, and runs on real Redis)."""

from __future__ import annotations

import asyncio
import copy
import importlib
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_dblog.config import ConfigError
from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.get_provider_info import get_provider_info
from airflow_provider_dblog.state import DumpState, StateStore
from tests.integration.airflow_support import BIN
from tests.integration.e2e_support import REPO

pytestmark = pytest.mark.integration
T = TableRef("public", "accounts")


def test_every_dag_imports_with_its_tasks_and_params() -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(REPO / "dags"))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {"dblog_backfill", "dblog_dump", "dblog_repair"}
    expected_params = {
        "dblog_backfill": {"tables", "chunk_size", "parallelism"},
        "dblog_dump": {"source", "tables", "keys", "chunk_size", "parallelism"},
        "dblog_repair": {"table", "keys", "chunk_size"},
    }
    for dag_id, params in expected_params.items():
        dag = bag.dags[dag_id]
        assert {t.task_id for t in dag.tasks} == {"check_request", "wait_for_tailer", "dump"}
        assert dag.get_task("check_request").downstream_task_ids == {"wait_for_tailer"}
        assert dag.get_task("wait_for_tailer").downstream_task_ids == {"dump"}
        assert set(dag.params.keys()) == params
        assert dag.catchup is False
    assert bag.dags["dblog_backfill"].schedule == "0 3 * * 0"
    assert bag.dags["dblog_dump"].schedule is None and bag.dags["dblog_repair"].schedule is None


@pytest.mark.parametrize(
    ("dag_id", "conf", "bad"),
    [
        ("dblog_dump", {"chunk_size": 0}, "chunk_size"),
        ("dblog_dump", {"parallelism": "two"}, "parallelism"),
        ("dblog_dump", {"tables": ["not a table"]}, "tables"),
        ("dblog_repair", {"table": "public.accounts", "keys": []}, "keys"),
        ("dblog_repair", {"keys": [1]}, "table"),
    ],
)
def test_params_schema_refuses_bad_input_naming_the_param(
    dag_id: str, conf: dict[str, Any], bad: str
) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import ParamValidationError

    dag = DagBag(str(REPO / "dags")).dags[dag_id]
    params = copy.deepcopy(dag.params)
    with pytest.raises(ParamValidationError, match=bad):
        params.update(conf)  # what a run's conf does to the DAG's params
        params.validate()


def test_provider_info_names_importable_classes() -> None:
    info = get_provider_info()
    assert info["package-name"] == "airflow-provider-dblog"
    for kind in ("hooks", "operators", "sensors", "triggers"):
        (entry,) = info[kind]
        for module in entry["python-modules"]:
            importlib.import_module(module)
    (connection,) = info["connection-types"]
    module, _, name = connection["hook-class-name"].rpartition(".")
    hook = getattr(importlib.import_module(module), name)
    assert hook.conn_type == connection["connection-type"] == "dblog"


def test_airflow_lists_the_provider_and_renders_its_connection_form(tmp_path: Path) -> None:
    env = dict(os.environ, AIRFLOW_HOME=str(tmp_path))
    listed = subprocess.run(
        [str(BIN / "airflow"), "providers", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "airflow-provider-dblog" in listed.stdout

    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    hook = ProvidersManagerTaskRuntime().hooks["dblog"]
    assert hook is not None and hook.hook_class_name.endswith("DBLogHook")
    manager = ProvidersManager()
    widgets = {k: v.field for k, v in manager.connection_form_widgets.items() if "dblog" in k}
    assert set(widgets) == {
        f"extra__dblog__{name}"
        for name in ("source_name", "config_path", "source_conn_id", "source_password", "ssl")
    }
    assert manager.connection_form_widgets["extra__dblog__source_password"].is_sensitive
    behaviour = manager.field_behaviours["dblog"]
    assert behaviour["relabeling"]["host"] == "Redis host"
    assert behaviour["hidden_fields"] == ["extra"]


# --- the hook and the triggers against a real Redis -------------------------------------------


def write_toml(path: Path, redis_server: RedisInfo, source: str, *, redis_port: int = 0) -> Path:
    path.write_text(
        f"""
[source]
name = "{source}"
dsn = "host=127.0.0.1 port=1 dbname=x user=x"
password_env = "HOOK_TEST_SOURCE_PASSWORD"
tables = ["public.accounts", "public.orders"]

[redis]
url = "redis://{redis_server.host}:{redis_port or redis_server.port}/{redis_server.db}"
password_env = "HOOK_TEST_REDIS_PASSWORD"

[output]
type = "ndjson"
directory = "unused"
"""
    )
    return path


@pytest.fixture
def dblog_conn(
    redis_server: RedisInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, str, Path]]:
    """A `dblog` connection (from the environment) on a fresh source name."""
    source = f"hook-{uuid.uuid4().hex[:8]}"
    toml = write_toml(tmp_path / "dblog.toml", redis_server, source)
    conn = {
        "conn_type": "dblog",
        "host": redis_server.host,
        "port": redis_server.port,
        "schema": str(redis_server.db),
        "password": redis_server.password,
        "extra": {"source_name": source, "config_path": str(toml), "source_password": "s3cret"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_TEST", json.dumps(conn))
    yield "dblog_test", source, toml


def test_hook_reaches_redis_and_maps_secrets_to_the_toml_names(
    dblog_conn: tuple[str, str, Path], redis_server: RedisInfo
) -> None:
    from airflow_provider_dblog.hooks.dblog import DBLogHook

    conn_id, source, _ = dblog_conn
    hook = DBLogHook(conn_id)
    ok, message = hook.test_connection()
    assert ok, message
    assert f"source {source} (public.accounts, public.orders)" in message
    assert redis_server.password not in message
    assert hook.secret_env() == {
        "HOOK_TEST_REDIS_PASSWORD": redis_server.password,
        "HOOK_TEST_SOURCE_PASSWORD": "s3cret",
    }
    assert "s3cret" not in repr(hook.settings) and redis_server.password not in repr(hook.settings)
    assert hook.store.source == source


def test_hook_refuses_a_toml_of_another_source_or_redis(
    redis_server: RedisInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_dblog.hooks.dblog import DBLogHook

    conn = {
        "conn_type": "dblog",
        "host": redis_server.host,
        "port": redis_server.port,
        "password": redis_server.password,
        "extra": {"source_name": "mine", "config_path": str(tmp_path / "other.toml")},
    }
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_BAD", json.dumps(conn))
    write_toml(tmp_path / "other.toml", redis_server, "theirs")
    with pytest.raises(ConfigError, match=r"names source 'mine' but .* configures source 'theirs'"):
        _ = DBLogHook("dblog_bad").config
    write_toml(tmp_path / "other.toml", redis_server, "mine", redis_port=1)
    with pytest.raises(ConfigError, match="the dump would report elsewhere"):
        _ = DBLogHook("dblog_bad").config
    ok, message = DBLogHook("dblog_bad").test_connection()
    assert not ok and "elsewhere" in message
    conn["extra"] = {"config_path": "x"}
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_BAD", json.dumps(conn))
    with pytest.raises(ConfigError, match="needs source_name in its extras"):
        _ = DBLogHook("dblog_bad").settings


def first_event(trigger: Any) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first(), 30))


def test_triggers_serialize_to_what_builds_them_again() -> None:
    from airflow_provider_dblog.triggers.dblog import DBLogDumpTrigger, DBLogTailerHealthTrigger

    for trigger in (
        DBLogDumpTrigger("c", "d-1", poll_interval=0.5, driver_timeout_s=9, cancel_on_kill=True),
        DBLogTailerHealthTrigger("c", max_lag_ms=5, poll_interval=2),
    ):
        classpath, kwargs = trigger.serialize()
        module, _, name = classpath.rpartition(".")
        again = getattr(importlib.import_module(module), name)(**kwargs)
        assert again.serialize() == (classpath, kwargs)
        json.dumps(kwargs)  # stored in the database as JSON


def test_dump_trigger_reports_done_failed_missing_and_a_dead_driver(
    dblog_conn: tuple[str, str, Path], redis_server: RedisInfo
) -> None:
    from airflow_provider_dblog.triggers.dblog import DBLogDumpTrigger

    conn_id, source, _ = dblog_conn
    store = StateStore(redis_server.client(), source)
    for dump_id in ("ok", "bad", "dead"):
        store.dumps.create(DumpRequest(dump_id, DumpKind.TABLE, (T,), chunk_size=5))
        store.dumps.mark(dump_id, DumpState.RUNNING)
    store.dumps.count("ok", chunks=3, rows=15)
    store.dumps.mark("ok", DumpState.DONE)
    store.dumps.mark("bad", DumpState.FAILED, reason="chunk 2 failed 5 times")

    done = first_event(DBLogDumpTrigger(conn_id, "ok", poll_interval=0.05))
    assert done["outcome"] == "done" and done["rows"] == 15 and done["chunks"] == 3
    failed = first_event(DBLogDumpTrigger(conn_id, "bad", poll_interval=0.05))
    assert failed["state"] == "failed" and failed["reason"] == "chunk 2 failed 5 times"
    missing = first_event(DBLogDumpTrigger(conn_id, "never", poll_interval=0.05))
    assert missing["outcome"] == "missing"
    stalled = first_event(
        DBLogDumpTrigger(conn_id, "dead", poll_interval=0.05, driver_timeout_s=0.3)
    )
    assert stalled["outcome"] == "stalled" and stalled["state"] == "running"


def test_dump_trigger_waits_while_a_driver_beats(
    dblog_conn: tuple[str, str, Path], redis_server: RedisInfo
) -> None:
    from airflow_provider_dblog.triggers.dblog import DBLogDumpTrigger

    conn_id, source, _ = dblog_conn
    store = StateStore(redis_server.client(), source)
    store.dumps.create(DumpRequest("alive", DumpKind.TABLE, (T,), chunk_size=5))
    store.dumps.mark("alive", DumpState.RUNNING)
    store.dumps.beat("alive", "spark-driver:1", ttl_ms=60_000)
    trigger = DBLogDumpTrigger(conn_id, "alive", poll_interval=0.05, driver_timeout_s=0.2)

    async def run() -> dict[str, Any]:
        events = trigger.run()
        waiting = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(1.0)  # five driver timeouts: a beating driver is never stalled
        assert not waiting.done()
        store.dumps.mark("alive", DumpState.DONE)
        return dict((await asyncio.wait_for(waiting, 10)).payload)

    assert asyncio.run(run())["outcome"] == "done"


def test_tailer_health_trigger_fires_once_the_lag_is_low(
    dblog_conn: tuple[str, str, Path], redis_server: RedisInfo
) -> None:
    from airflow_provider_dblog.triggers.dblog import DBLogTailerHealthTrigger

    conn_id, source, _ = dblog_conn
    store = StateStore(redis_server.client(), source)
    trigger = DBLogTailerHealthTrigger(conn_id, max_lag_ms=100, poll_interval=0.05)

    async def run() -> dict[str, Any]:
        events = trigger.run()
        waiting = asyncio.ensure_future(events.__anext__())
        store.tailer.beat("tailer-1", {"lag_ms": 5000}, ttl_s=60)
        await asyncio.sleep(0.3)  # several polls see the high lag and keep waiting
        assert not waiting.done()
        store.tailer.beat("tailer-1", {"lag_ms": 20}, ttl_s=60)
        return dict((await asyncio.wait_for(waiting, 10)).payload)

    event = asyncio.run(run())
    assert event["healthy"] is True and event["health"]["metrics"] == {"lag_ms": 20}


def test_dump_operator_reports_openlineage_facets_and_never_fails_on_them(
    dblog_conn: tuple[str, str, Path], redis_server: RedisInfo
) -> None:
    from airflow_provider_dblog.operators.dblog import DBLogDumpOperator

    conn_id, source, _ = dblog_conn
    store = StateStore(redis_server.client(), source)
    tables = (T, TableRef("public", "orders"))
    store.dumps.create(DumpRequest("seen", DumpKind.ALL, tables, chunk_size=5))
    operator = DBLogDumpOperator(task_id="dump", dblog_conn_id=conn_id, dump_id="seen")
    lineage = operator.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [
        ("postgres://127.0.0.1:1", "x.public.accounts"),
        ("postgres://127.0.0.1:1", "x.public.orders"),
    ]
    assert [(d.namespace, d.name) for d in lineage.outputs] == [
        ("file", str((Path.cwd() / "unused").resolve()))
    ]
    broken = DBLogDumpOperator(task_id="dump", dblog_conn_id="no_such_conn", dump_id="seen")
    assert broken.get_openlineage_facets_on_complete(None) is None


def test_killing_the_dump_task_while_deferred_cancels_the_dump_a_sensor_does_not(
    dblog_conn: tuple[str, str, Path], redis_server: RedisInfo
) -> None:
    from airflow_provider_dblog.triggers.dblog import DBLogDumpTrigger

    conn_id, source, _ = dblog_conn
    store = StateStore(redis_server.client(), source)
    for dump_id in ("watched", "owned"):
        store.dumps.create(DumpRequest(dump_id, DumpKind.TABLE, (T,), chunk_size=5))
        store.dumps.mark(dump_id, DumpState.RUNNING)
    asyncio.run(DBLogDumpTrigger(conn_id, "watched").on_kill())  # a sensor's trigger
    controls = store.dumps.controls("watched")
    assert controls is not None and not controls.cancelled
    asyncio.run(DBLogDumpTrigger(conn_id, "owned", cancel_on_kill=True).on_kill())
    controls = store.dumps.controls("owned")
    assert controls is not None and controls.cancelled


def test_control_operators_act_on_a_running_dump_and_refuse_a_finished_one(
    dblog_conn: tuple[str, str, Path], redis_server: RedisInfo
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_dblog.operators.dblog import (
        DBLogCancelDumpOperator,
        DBLogPauseDumpOperator,
        DBLogResumeDumpOperator,
        DBLogThrottleDumpOperator,
    )

    conn_id, source, _ = dblog_conn
    store = StateStore(redis_server.client(), source)
    store.dumps.create(DumpRequest("ctl", DumpKind.TABLE, (T,), chunk_size=5))
    store.dumps.mark("ctl", DumpState.RUNNING)
    common = {"dump_id": "ctl", "dblog_conn_id": conn_id}

    def controls() -> Any:
        found = store.dumps.controls("ctl")
        assert found is not None
        return found

    DBLogPauseDumpOperator(task_id="pause", **common).execute({})  # type: ignore[arg-type]
    assert controls().paused
    DBLogResumeDumpOperator(task_id="resume", **common).execute({})  # type: ignore[arg-type]
    assert not controls().paused
    DBLogThrottleDumpOperator(
        task_id="throttle", chunk_size="250", delay_ms=40, max_rows_per_s=1000.0, **common
    ).execute({})  # type: ignore[arg-type]
    assert (controls().chunk_size, controls().delay_ms, controls().max_rows_per_s) == (
        250,
        40,
        1000.0,
    )
    with pytest.raises(AirflowFailException, match="chunk_size must be at least 1"):
        DBLogThrottleDumpOperator(task_id="t0", chunk_size=0, **common).execute({})  # type: ignore[arg-type]
    DBLogCancelDumpOperator(task_id="cancel", **common).execute({})  # type: ignore[arg-type]
    assert controls().cancelled
    store.dumps.mark("ctl", DumpState.CANCELLED)
    with pytest.raises(AirflowFailException, match="dump ctl has finished: nothing to pause"):
        DBLogPauseDumpOperator(task_id="late", **common).execute({})  # type: ignore[arg-type]
    with pytest.raises(AirflowFailException, match="no dump never"):
        DBLogPauseDumpOperator(task_id="unknown", dump_id="never", dblog_conn_id=conn_id).execute(
            {}
        )  # type: ignore[arg-type]


def test_dump_sensor_pokes_until_done_and_fails_with_the_reason(
    dblog_conn: tuple[str, str, Path], redis_server: RedisInfo
) -> None:
    from airflow.sdk.exceptions import AirflowException

    from airflow_provider_dblog.sensors.dblog import DBLogDumpSensor, DBLogTailerHealthSensor

    conn_id, source, _ = dblog_conn
    store = StateStore(redis_server.client(), source)
    for dump_id in ("slow", "broken"):
        store.dumps.create(DumpRequest(dump_id, DumpKind.TABLE, (T,), chunk_size=5))
        store.dumps.mark(dump_id, DumpState.RUNNING)
    slow = DBLogDumpSensor(task_id="wait", dump_id="slow", dblog_conn_id=conn_id)
    assert slow.poke({}) is False  # type: ignore[arg-type]
    store.dumps.mark("slow", DumpState.DONE)
    assert slow.poke({}) is True  # type: ignore[arg-type]
    store.dumps.mark("broken", DumpState.FAILED, reason="chunk 3 failed 5 times")
    broken = DBLogDumpSensor(task_id="wait", dump_id="broken", dblog_conn_id=conn_id)
    with pytest.raises(AirflowException, match="dump broken failed: chunk 3 failed 5 times"):
        broken.poke({})  # type: ignore[arg-type]
    missing = DBLogDumpSensor(task_id="wait", dump_id="never", dblog_conn_id=conn_id)
    with pytest.raises(AirflowException, match="no dump never"):
        missing.poke({})  # type: ignore[arg-type]

    tailer = DBLogTailerHealthSensor(task_id="tailer", dblog_conn_id=conn_id, max_lag_ms=100)
    assert tailer.poke({}) is False  # type: ignore[arg-type]  # no heartbeat
    store.tailer.beat("t", {"lag_ms": 500}, ttl_s=60)
    assert tailer.poke({}) is False  # type: ignore[arg-type]
    store.tailer.beat("t", {"lag_ms": 50}, ttl_s=60)
    assert tailer.poke({}) is True  # type: ignore[arg-type]
