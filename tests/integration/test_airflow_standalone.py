"""The provider in a running Airflow, driven through its REST API as a user drives the UI.

Airflow (api-server, scheduler with the LocalExecutor, dag-processor, triggerer) runs on a
private AIRFLOW_HOME with the dblog connection from the environment; the source, the SQL target
and the tailer run in this process (`running_pipeline`), Spark (local[2]) in the application the
dump operator submits. One server session serves three checks, to pay its start once: the
connection form of the `dblog` type, a `dblog_dump` run with a table that does not exist (it
fails in check_request, naming the table, and never dumps), and a `dblog_repair` run of a key
list that leaves exactly those rows in the target.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from airflow_provider_dblog.demo.postgres import snapshot
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.operators.request import dump_id_for
from tests.integration.airflow_server import airflow_server
from tests.integration.airflow_support import airflow_env, dblog_connection
from tests.integration.e2e_support import wait_caught_up
from tests.integration.spark_support import running_pipeline

pytestmark = pytest.mark.integration
ROWS = 300


def test_connection_form_bad_dump_and_repair_in_a_running_airflow(
    pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    with running_pipeline(pg15, redis_server, tmp_path, rows=ROWS) as pipeline:
        dbs = pipeline.dbs
        conn = dblog_connection(redis_server, pg15, dbs.config.name, pipeline.config_path)
        home = tmp_path / "airflow"
        with airflow_server(home, airflow_env(home, conn)) as airflow:
            # The connection form: the dblog type with its own fields, as the UI renders it.
            hooks = {
                h["connection_type"]: h for h in airflow.api("GET", "/ui/connections/hook_meta")
            }
            assert "dblog" in hooks, sorted(hooks)
            form = hooks["dblog"]
            assert form["hook_name"] == "DBLog"
            assert {"source_name", "config_path", "source_conn_id", "source_password"} <= set(
                form["extra_fields"]
            )
            assert form["standard_fields"]["host"]["title"] == "Redis host"

            for dag_id in ("dblog_dump", "dblog_repair"):
                airflow.wait_dag(dag_id)

            # Both runs at once: the bad one fails in its first task while the repair runs.
            bad_run = airflow.trigger("dblog_dump", {"tables": ["public.nope"]})
            keys = list(range(5, ROWS, 7))
            repair_run = airflow.trigger(
                "dblog_repair", {"table": "public.accounts", "keys": keys, "chunk_size": 40}
            )
            try:
                state = airflow.wait_run("dblog_dump", bad_run, 90)
                tasks = airflow.task_states("dblog_dump", bad_run)
                report = airflow.report("dblog_dump", bad_run)
                assert state == "failed", report
                assert tasks["check_request"] == "failed", report
                assert tasks["dump"] == "upstream_failed", report
                check_log = airflow.task_log("dblog_dump", bad_run, "check_request", 1)
                assert "public.nope" in check_log, report

                state = airflow.wait_run("dblog_repair", repair_run, 150, fail_fast=True)
                assert state == "success", airflow.report("dblog_repair", repair_run)
                result = airflow.xcom("dblog_repair", repair_run, "dump")
            finally:
                # A failed test must not leave the detached Spark application dumping.
                pipeline.store.dumps.cancel(dump_id_for("dblog_repair", repair_run, "dump"))

        wait_caught_up(dbs)
        with psycopg.connect(dbs.source_dsn) as source:
            expected = [
                r[0]
                for r in source.execute(
                    "SELECT row_to_json(t)::text FROM accounts t WHERE id = ANY(%s) ORDER BY id",
                    (keys,),
                )
            ]
        assert len(expected) == len(keys)
        assert snapshot(dbs.target_dsn)["accounts"] == expected
        assert result["dump_id"] == dump_id_for("dblog_repair", repair_run, "dump"), result
        assert result["state"] == "done" and result["rows"] == len(keys), result
        assert result["chunks"] == -(-len(keys) // 40), result
