"""The chain every DBLog DAG runs: check request -> wait for a healthy tailer -> dump on Spark.

Bad params fail the first task at once (no retry), before anything waits; the dump task
retries, and a retry resumes the same dump from its last completed chunk. Defaults come from
the environment of the DAG processor, so one DAG file serves several deployments:
DBLOG_CONN_ID, DBLOG_SPARK_CONN_ID, DBLOG_MAX_TAILER_LAG_MS, DBLOG_POLL_S.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pendulum

from airflow_provider_dblog.operators.dblog import (
    DBLogCheckDumpRequestOperator,
    DBLogDumpOperator,
)
from airflow_provider_dblog.sensors.dblog import DBLogTailerHealthSensor

DBLOG_CONN_ID = os.environ.get("DBLOG_CONN_ID", "dblog_default")
SPARK_CONN_ID = os.environ.get("DBLOG_SPARK_CONN_ID", "spark_default")
MAX_TAILER_LAG_MS = int(os.environ.get("DBLOG_MAX_TAILER_LAG_MS", "60000"))
POLL_S = float(os.environ.get("DBLOG_POLL_S", "5"))

DEFAULT_ARGS: dict[str, Any] = {"owner": "data-platform", "retries": 0}

DAG_DEFAULTS: dict[str, Any] = {
    "start_date": pendulum.datetime(2026, 1, 1, tz="UTC"),
    "catchup": False,
    "default_args": DEFAULT_ARGS,
    "tags": ["dblog", "cdc"],
}
"""What every DBLog DAG passes to `DAG(...)`."""


def dump_chain(**request: Any) -> DBLogDumpOperator:
    """check_request >> wait_for_tailer >> dump, in the DAG being defined, for the request
    given (`tables`, `keys`, `where`, `chunk_size`, `parallelism`, `mode`, `read_only`,
    `dblog_conn_id`:
    templated, or a DAG param as `params.ParamValue`; and `subset_only`)."""
    conn = request.pop("dblog_conn_id", DBLOG_CONN_ID)
    check = DBLogCheckDumpRequestOperator(
        task_id="check_request", dblog_conn_id=conn, retries=0, **request
    )
    wait = DBLogTailerHealthSensor(
        task_id="wait_for_tailer",
        dblog_conn_id=conn,
        max_lag_ms=MAX_TAILER_LAG_MS,
        poke_interval=POLL_S,
        timeout=15 * 60,
        deferrable=True,
    )
    dump = DBLogDumpOperator(
        task_id="dump",
        dblog_conn_id=conn,
        spark_conn_id=SPARK_CONN_ID,
        deferrable=True,
        poll_interval=POLL_S,
        retries=2,
        retry_delay=timedelta(seconds=30),
        **request,
    )
    check >> wait >> dump
    return dump
