"""The dump operator outside a DAG run, against real PostgreSQL, Redis and Spark (local[2]):
`on_kill` cancels the dump and stops the Spark application, a retry of the same task resumes
the dump without reading completed chunks again, and a dump that fails fails the task with
its reason."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from airflow_provider_dblog.demo.postgres import compare
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import DumpState
from tests.integration.airflow_support import BIN, dblog_connection
from tests.integration.e2e_support import (
    PASSWORD_ENV,
    REDIS_PASSWORD_ENV,
    wait_caught_up,
    wait_until,
)
from tests.integration.spark_support import Pipeline, running_pipeline

pytestmark = pytest.mark.integration
ROWS = 300


@pytest.fixture
def pipeline(
    pg15: PostgresInfo,
    redis_server: RedisInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Pipeline]:
    """The pipeline, and the connections the operator reads: the passwords reach it only
    through the dblog connection, never as the TOML's variables."""
    with running_pipeline(pg15, redis_server, tmp_path, ROWS) as pipeline:
        connection = dblog_connection(
            redis_server, pg15, pipeline.dbs.config.name, pipeline.config_path
        )
        monkeypatch.setenv("AIRFLOW_CONN_DBLOG_DEFAULT", json.dumps(connection))
        monkeypatch.setenv(
            "AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"})
        )
        monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.delenv(PASSWORD_ENV)
        monkeypatch.delenv(REDIS_PASSWORD_ENV)
        yield pipeline


def spark_submits(dump_id: str) -> list[psutil.Process]:
    """spark-submit JVMs this process started for `dump_id` (named `dblog-dump-<id>`): an
    earlier test's detached application may still be ending beside them on a loaded machine."""
    children = psutil.Process().children(recursive=True)
    return [
        p
        for p in children
        for line in [" ".join(_cmdline(p))]
        if "SparkSubmit" in line and f"dblog-dump-{dump_id}" in line
    ]


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def test_on_kill_cancels_and_a_retry_resumes(pipeline: Pipeline) -> None:
    from airflow.sdk.exceptions import AirflowException

    from airflow_provider_dblog.operators.dblog import DBLogDumpOperator

    store = pipeline.store

    def operator() -> DBLogDumpOperator:
        return DBLogDumpOperator(
            task_id="dump", dump_id="killed", tables=["public.accounts"], chunk_size=20
        )

    first = operator()
    errors: list[BaseException] = []

    def execute() -> None:
        try:
            first.execute({})  # type: ignore[arg-type]
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=execute)
    thread.start()
    wait_until(lambda: store.dumps.status("killed") is not None, 60, "the dump request stored")
    store.dumps.throttle("killed", delay_ms=300)  # slow enough to be killed in the middle

    def some_chunks() -> bool:
        status = store.dumps.status("killed")
        return status is not None and status.chunks >= 3

    wait_until(some_chunks, 120, "the Spark dump completing 3 chunks")
    assert spark_submits("killed"), "no spark-submit runs while the dump does"
    first.on_kill()
    thread.join(60)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], AirflowException)
    # on_kill writes the cancel, then kills the processes: a driver killed first leaves the
    # dump running, one that read the cancel between two chunks (a loaded machine) ends it
    # cancelled. The retry below resumes it either way.
    said = str(errors[0])
    assert ("ended running without finishing" in said and "a retry resumes it" in said) or (
        "was cancelled" in said
    ), said
    status = store.dumps.status("killed")
    assert status is not None and status.state is not DumpState.DONE
    wait_until(lambda: not spark_submits("killed"), 60, "spark-submit gone after on_kill")
    done_before = status.chunks
    assert 3 <= done_before < ROWS // 20

    result = operator().execute({})  # type: ignore[arg-type]  # the task's retry
    assert result["state"] == "done"
    status = store.dumps.status("killed")
    assert status is not None and status.state is DumpState.DONE
    # 300 rows in chunks of 20: 15 chunks in all; a chunk read again would count twice.
    assert status.chunks == ROWS // 20 and status.rows == ROWS
    wait_caught_up(pipeline.dbs)
    diff = compare(pipeline.dbs.source_dsn, pipeline.dbs.target_dsn)
    assert [d for d in diff if "accounts" in str(d)] == []


def test_a_failed_dump_fails_the_task_with_its_reason(pipeline: Pipeline) -> None:
    from airflow.sdk.exceptions import AirflowException

    from airflow_provider_dblog.operators.dblog import DBLogDumpOperator

    pipeline.tailer_stop.set()  # no tailer: no window closes, every chunk times out
    pipeline.tailer_thread.join(30)
    operator = DBLogDumpOperator(
        task_id="dump",
        dump_id="doomed",
        tables=["public.orders"],
        chunk_size=50,
        window_timeout_s=0.5,
    )
    with pytest.raises(AirflowException, match=r"dump doomed failed: chunk 0 of public.orders"):
        operator.execute({})  # type: ignore[arg-type]
    status = pipeline.store.dumps.status("doomed")
    assert status is not None and status.state is DumpState.FAILED
    assert "Is the tailer running" in status.reason
