"""The dump as a Spark application (spark_jobs/dump.py) on local[2], against real PostgreSQL and
Redis with a tailer running in this process into a SQL target: a full dump under writes, a repair
of a key list, and an application killed mid-dump that resumes from its stored progress.

One SparkSession serves the in-process dumps of this module (a session starts in about 5 s); the
kill test runs the entry point as its own application, twice.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from airflow_provider_dblog.config import load_config
from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.demo import TABLES, Workload, compare, snapshot
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import SqlApplyOutput
from airflow_provider_dblog.sources.postgres.replication import PostgresLogReader
from airflow_provider_dblog.sources.postgres.setup import ensure_setup
from airflow_provider_dblog.state_store import DumpState, StateStore
from airflow_provider_dblog.tailer import Tailer, TailerSettings
from spark_jobs.dump import run_spark_dump
from tests.integration.e2e_support import (
    PASSWORD_ENV,
    REDIS_PASSWORD_ENV,
    REPO,
    Databases,
    cli_env,
    drop_databases,
    make_databases,
    wait_caught_up,
    wait_until,
    write_config,
)
from tests.integration.spark_support import stop_spark

pytestmark = pytest.mark.integration
ROWS = 600


@pytest.fixture(scope="module")
def spark(pg15: PostgresInfo, redis_server: RedisInfo) -> Iterator[SparkSession]:
    """Executors inherit the environment the JVM started with: passwords must be set first."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ[PASSWORD_ENV] = pg15.password
    os.environ[REDIS_PASSWORD_ENV] = redis_server.password
    session = (
        SparkSession.builder.master("local[2]")
        .appName("dblog-test-spark-dump")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    yield session
    stop_spark(session)


@dataclass
class Pipeline:
    dbs: Databases
    config_path: Path
    store: StateStore
    tailer_stop: threading.Event
    tailer_thread: threading.Thread


@pytest.fixture
def pipeline(
    pg15: PostgresInfo,
    redis_server: RedisInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Pipeline]:
    """A private source (ROWS rows per table before capture), an empty SQL target, and a tailer
    applying the log and the dump rows into it, in this process."""
    dbs = make_databases(pg15, ROWS, target=True, seed_value=random.randrange(1 << 30))
    monkeypatch.setenv(REDIS_PASSWORD_ENV, redis_server.password)
    config_path = write_config(
        tmp_path / "dblog.toml", dbs, redis_server, {"type": "ndjson", "directory": "unused"}
    )
    ensure_setup(dbs.config)
    store = StateStore(redis_server.client(), dbs.config.name)
    output = SqlApplyOutput(dbs.target_dsn, monotonic=True)
    tailer = Tailer(
        dbs.config.name,
        dbs.source_db,
        lambda: PostgresLogReader(dbs.config),
        store,
        output,
        "spark-test-tailer",
        TailerSettings(window_ttl_s=5),
    )
    stop = threading.Event()
    thread = threading.Thread(target=tailer.run, args=(stop,), daemon=True)
    thread.start()
    wait_until(lambda: store.tailer_health() is not None, 30, "the tailer's first heartbeat")
    try:
        yield Pipeline(dbs, config_path, store, stop, thread)
    finally:
        stop.set()
        thread.join(30)
        output.close()
        drop_databases(dbs)


def test_full_dump_under_writes_converges(spark: SparkSession, pipeline: Pipeline) -> None:
    dbs, store = pipeline.dbs, pipeline.store
    config = load_config(pipeline.config_path)
    workload = Workload(dbs.source_dsn, seed=11)
    workload.start()
    try:
        request = DumpRequest("full", DumpKind.ALL, TABLES, chunk_size=150, parallelism=2)
        store.create_dump(request)
        assert run_spark_dump(spark.sparkContext, config, "full") is DumpState.DONE
    finally:
        workload.join()
    assert workload.writes > 0
    wait_caught_up(dbs)
    assert compare(dbs.source_dsn, dbs.target_dsn) == []
    status = store.dump_status("full")
    assert status is not None and status.state is DumpState.DONE and status.rows >= ROWS * 3


def test_key_list_repair_copies_exactly_those_keys(spark: SparkSession, pipeline: Pipeline) -> None:
    dbs, store = pipeline.dbs, pipeline.store
    keys = tuple((k,) for k in range(5, ROWS, 7))
    request = DumpRequest("repair", DumpKind.KEYS, (TABLES[0],), keys, chunk_size=40)
    store.create_dump(request)
    config = load_config(pipeline.config_path)
    assert run_spark_dump(spark.sparkContext, config, "repair", tasks=3) is DumpState.DONE
    wait_caught_up(dbs)
    wanted = {k for (k,) in keys}
    with psycopg.connect(dbs.source_dsn) as conn:
        expected = [
            r[0]
            for r in conn.execute(
                "SELECT row_to_json(t)::text FROM accounts t WHERE id = ANY(%s) ORDER BY id",
                (sorted(wanted),),
            )
        ]
    assert snapshot(dbs.target_dsn)["accounts"] == expected
    status = store.dump_status("repair")
    assert status is not None and status.rows == len(keys)
    assert status.chunks == -(-len(keys) // 40)


def test_killed_application_resumes_without_rereading(
    pipeline: Pipeline, redis_server: RedisInfo, tmp_path: Path
) -> None:
    dbs, store = pipeline.dbs, pipeline.store
    request = DumpRequest("resumed", DumpKind.ALL, TABLES, chunk_size=100)
    store.create_dump(request)
    store.throttle_dump("resumed", delay_ms=400)  # slow enough to be killed in the middle
    env = cli_env(dbs, redis_server, PYSPARK_PYTHON=sys.executable)
    command = [
        sys.executable,
        str(REPO / "spark_jobs" / "dump.py"),
        "--dump-id",
        "resumed",
        "--config",
        str(pipeline.config_path),
        "--master",
        "local[2]",
    ]
    log = (tmp_path / "spark-dump.log").open("ab")
    first = subprocess.Popen(
        command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:

        def some_chunks_done() -> bool:
            status = store.dump_status("resumed")
            assert first.poll() is None, "the Spark dump ended before it was killed"
            return status is not None and status.chunks >= 4

        wait_until(some_chunks_done, 120, "the Spark dump completing 4 chunks")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    killed = store.dump_status("resumed")
    assert killed is not None and killed.state is DumpState.RUNNING
    done_before = sum(p.chunks_done for p in store.load_progress("resumed").values())
    assert 4 <= done_before < 18

    store.throttle_dump("resumed", delay_ms=0)
    second = subprocess.run(
        command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=180
    )
    assert second.returncode == 0, (tmp_path / "spark-dump.log").read_text()[-3000:]
    wait_caught_up(dbs)
    assert compare(dbs.source_dsn, dbs.target_dsn) == []
    status = store.dump_status("resumed")
    assert status is not None and status.state is DumpState.DONE
    # 600 rows per table in chunks of 100: 6 chunks each. A re-read chunk would count again.
    assert status.chunks == 18
    assert status.rows == ROWS * 3
