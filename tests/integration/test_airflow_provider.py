"""The provider against a real Redis: the hook with its TOML, the triggers' runs, the sensors'
pokes, the control operators and the dump operator's lineage. Its pure parts (DAG integrity,
provider metadata, the connection form, trigger serialization, connection parsing) are unit
tests under tests/unit/hooks/, operators/ and triggers/."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_dblog.config import ConfigError
from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest, TableProgress
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import DumpState, StateStore

pytestmark = pytest.mark.integration
T = TableRef("public", "accounts")


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


def test_dump_trigger_logs_each_tables_rows_rate_and_time_left(
    dblog_conn: tuple[str, str, Path], redis_server: RedisInfo, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the dump task's log shows while the dump runs: a line a step, per table (the
    triggerer's log lines, which Airflow shows in the task's log; structlog writes them to
    stdout here)."""
    from airflow_provider_dblog.triggers.dblog import DBLogDumpTrigger

    conn_id, source, _ = dblog_conn
    store = StateStore(redis_server.client(), source)
    keys = tuple((n,) for n in range(10))
    store.dumps.create(DumpRequest("paced", DumpKind.KEYS, (T,), keys, chunk_size=2))
    store.dumps.mark("paced", DumpState.RUNNING)
    store.dumps.beat("paced", "spark-driver:1", ttl_ms=60_000)
    trigger = DBLogDumpTrigger(conn_id, "paced", poll_interval=0.05)
    log: list[str] = []

    async def logged(pattern: str) -> None:
        deadline = time.monotonic() + 30
        while not re.search(pattern, "".join(log)):
            assert time.monotonic() < deadline, f"no log line like {pattern!r}: {log}"
            await asyncio.sleep(0.05)
            log.append(capsys.readouterr().out)

    async def run() -> dict[str, Any]:
        events = trigger.run()
        waiting = asyncio.ensure_future(events.__anext__())
        for chunk in (1, 2, 3, 4):
            await asyncio.sleep(0.2)  # the rows take time, so the rate is finite
            progress = TableProgress(T, started=True, key_index=2 * chunk, rows_done=2 * chunk)
            store.dumps.chunk_done("paced", replace(progress, chunks_done=chunk))
            await logged(rf"dump paced: public\.accounts: {2 * chunk} rows")
        store.dumps.mark("paced", DumpState.DONE)
        return dict((await asyncio.wait_for(waiting, 30)).payload)

    assert asyncio.run(run())["outcome"] == "done"
    text = "".join(log)
    assert "dump paced: running, 4 chunks, 8 rows, 0 windows retried" in text
    line = r"dump paced: public\.accounts: 8 rows, [\d.,]+ rows/s, 80%, ETA \d+:\d\d"
    assert re.search(line, text), text


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
    for bad, message in (
        ({"chunk_size": 0}, "chunk_size must be a whole number of at least 1, got 0"),
        ({"chunk_size": 9, "delay_ms": "soon"}, "delay_ms must be a whole number of at least 0"),
        ({"delay_ms": 9, "max_rows_per_s": "nan"}, "max_rows_per_s must be a number of at least"),
    ):
        with pytest.raises(AirflowFailException, match=message):
            DBLogThrottleDumpOperator(task_id="t0", **bad, **common).execute({})  # type: ignore[arg-type]
        assert (controls().chunk_size, controls().delay_ms) == (250, 40), "nothing was sent"
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
    from airflow.sdk.exceptions import AirflowException, TaskDeferred

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

    # Deferrable, it defers only while the tailer is not healthy yet.
    deferring = DBLogTailerHealthSensor(
        task_id="tailer", dblog_conn_id=conn_id, max_lag_ms=100, deferrable=True
    )
    assert deferring.execute({})["healthy"] is True  # type: ignore[arg-type]
    store.tailer.beat("t", {"lag_ms": 500}, ttl_s=60)
    with pytest.raises(TaskDeferred):
        deferring.execute({})  # type: ignore[arg-type]
