"""Event-driven DAGs in a running Airflow: `dblog_on_change` runs when a captured table changes.

Airflow (api-server, scheduler, dag-processor, triggerer) watches `public.accounts` of a private
source whose tailer, in this process, writes the change stream into a Redis Stream; the DAG
watches it the standard way, common-messaging's `MessageQueueTrigger(scheme="dblog", ...)`,
which the triggerer runs as DBLog's change trigger. Checked in one server session, to pay its
start once:
- a DELETE in the source starts a run within seconds, whose log names the table and the op;
- the triggerer killed (SIGKILL) right after its consumer group was handed a change, and a
  second change made while it is down: after a restart both run the DAG, each batch exactly
  once, and the group's pending list ends empty (everything acknowledged);
- a dump of the table, once it completes, runs the DAG again through the asset event the dump
  operator emits.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.operators.request import dump_id_for
from tests.integration.airflow_server import AirflowServer, airflow_server, wait_for
from tests.integration.airflow_support import airflow_env, dblog_connection
from tests.integration.spark_support import running_pipeline

pytestmark = pytest.mark.integration
DAG = "dblog_on_change"
TABLE = "public.accounts"
STREAM_URL_ENV = "E2E_STREAM_URL"


def runs(airflow: AirflowServer) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = airflow.api(
        "GET", f"/api/v2/dags/{DAG}/dagRuns", params={"order_by": "run_after"}
    )["dag_runs"]
    return found


def triggering_events(airflow: AirflowServer, run_id: str) -> list[dict[str, Any]]:
    """The asset events' extras that started a run."""
    events = airflow.api("GET", f"/api/v2/dags/{DAG}/dagRuns/{run_id}/upstreamAssetEvents")
    return [event["extra"] for event in events["asset_events"]]


def batches(airflow: AirflowServer, states: set[str] | None = None) -> dict[str, list[Any]]:
    """The triggering events of every started run (in `states`), by run id. A run not started
    yet is left for the next look: Airflow's API answers 500 for the events of a run without
    a start date (its response model requires one)."""
    return {
        run["dag_run_id"]: triggering_events(airflow, run["dag_run_id"])
        for run in runs(airflow)
        if run.get("start_date") is not None and (states is None or run["state"] in states)
    }


def run_with(
    airflow: AirflowServer, wanted: Any, what: str, timeout_s: float = 60, *, started: bool = False
) -> str:
    """The id of the successful run (with `started`, of any run) one of whose events
    `wanted(extra)` accepts."""

    def found() -> str | None:
        airflow.check_alive()
        for run_id, extras in batches(airflow, None if started else {"success"}).items():
            if any(wanted(extra) for extra in extras):
                return run_id
        return None

    run_id: str = wait_for(found, timeout_s, what)
    return run_id


def log_change(payload_table: str, op: str) -> Any:
    def wanted(extra: dict[str, Any]) -> bool:
        payload = extra.get("payload") or {}
        return bool(payload.get("table") == payload_table and payload.get("ops", {}).get(op))

    return wanted


def test_changes_and_dumps_run_the_on_change_dag(
    pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STREAM_URL_ENV, redis_server.url)
    with running_pipeline(
        pg15, redis_server, tmp_path, rows=40, stream_url_env=STREAM_URL_ENV
    ) as pipeline:
        dbs = pipeline.dbs
        source = dbs.config.name
        stream = f"dblog:{source}:events"
        redis = redis_server.client(decode_responses=True)
        conn = dblog_connection(redis_server, pg15, source, pipeline.config_path)
        home = tmp_path / "airflow"
        env = airflow_env(
            home,
            conn,
            DBLOG_SOURCE_NAME=source,
            DBLOG_WATCH_TABLES=TABLE,
            AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="5",
            AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC="1",
            AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD="6",
        )
        env[STREAM_URL_ENV] = redis_server.url
        with airflow_server(home, env) as airflow:
            airflow.wait_dag(DAG)
            airflow.api("PATCH", f"/api/v2/dags/{DAG}", json={"is_paused": False})

            def group() -> str | None:
                airflow.check_alive()
                if not redis.exists(stream):
                    return None
                names = [g["name"] for g in redis.xinfo_groups(stream)]
                return next((n for n in names if n.startswith(f"airflow:{TABLE}:")), None)

            name: str = wait_for(group, 120, "the change trigger's consumer group")

            # A delete runs the DAG within seconds; its log names the table and the op.
            with psycopg.connect(dbs.source_dsn, autocommit=True) as db:
                db.execute("DELETE FROM accounts WHERE id = 7")
            deleted_at = datetime.now(UTC)
            delete_run = run_with(
                airflow, log_change(TABLE, "d"), "a run for the DELETE", 60, started=True
            )
            run = airflow.api("GET", f"/api/v2/dags/{DAG}/dagRuns/{delete_run}")
            queued = datetime.fromisoformat(run["queued_at"]) - deleted_at
            print(f"DELETE -> {DAG} run {delete_run} queued after {queued.total_seconds():.1f}s")
            assert queued < timedelta(seconds=10), f"the run came {queued} after the DELETE"
            state = airflow.wait_run(DAG, delete_run, 90)
            report = airflow.report(DAG, delete_run)
            log = airflow.task_log(DAG, delete_run, "log_changes", 1)
            assert state == "success", report
            assert f"table {TABLE}, ops {{'d': 1}}" in log, report

            # The triggerer dies just after its group was handed a change (not yet fired), and
            # another change comes while it is down: after a restart both fire, once each.
            def pending() -> int:
                return int(redis.xpending(stream, name)["pending"])

            wait_for(lambda: pending() == 0, 30, "the DELETE's batch acknowledged")
            with psycopg.connect(dbs.source_dsn, autocommit=True) as db:
                db.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 11")
                wait_for(lambda: pending() > 0, 10, "the UPDATE delivered", every_s=0.02)
                airflow.kill_component("triggerer")
                db.execute("INSERT INTO accounts (id, owner, balance) VALUES (9001, 'late', 1)")
            airflow.start_component("triggerer")
            run_with(airflow, log_change(TABLE, "u"), "a run for the UPDATE", 120)
            run_with(airflow, log_change(TABLE, "c"), "a run for the INSERT", 120)
            wait_for(lambda: pending() == 0, 30, "every batch acknowledged")
            fired = [
                (e["payload"]["first_position"], e["payload"]["last_position"])
                for extras in batches(airflow).values()
                for e in extras
                if e.get("from_trigger")
            ]
            assert len(fired) == len({tuple(map(tuple, f)) for f in fired}), fired
            changes = sorted(
                op
                for extras in batches(airflow).values()
                for e in extras
                if e.get("from_trigger")
                for op, n in e["payload"]["ops"].items()
                for _ in range(n)
            )
            assert changes == ["c", "d", "u"], changes

            # A dump of the table emits the asset event once it completes.
            dump_run = airflow.trigger("dblog_dump", {"tables": [TABLE]})
            dump_id = dump_id_for("dblog_dump", dump_run, "dump")
            try:
                state = airflow.wait_run("dblog_dump", dump_run, 240, fail_fast=True)
                assert state == "success", airflow.report("dblog_dump", dump_run)
            finally:
                pipeline.store.dumps.cancel(dump_id)
            dumped = run_with(airflow, lambda e: e.get("dump_id") == dump_id, "a run for the dump")
            (extra,) = [e for e in triggering_events(airflow, dumped) if e.get("dump_id")]
            assert extra["table"] == TABLE and extra["source"] == source, extra
            assert extra["rows"] == 40, extra
            assert f"table {TABLE}, dump {dump_id}" in airflow.task_log(
                DAG, dumped, "log_changes", 1
            )
