"""The dump as a Spark application (spark_jobs/dump.py) on local[2], against real PostgreSQL and
Redis with a tailer running in this process into a SQL target: a full dump under writes with one
and three windows in flight, a repair of a key list, pause and resume, cancel, a chunk size
changed while the dump runs, Python workers killed while a chunk's job runs, an application
killed mid-dump that resumes from its stored progress, and the source restarted mid-dump. A
full dump under writes also runs on a MariaDB source (its tailer writing NDJSON, replayed against
the source's rows): the executors read their key sub-ranges with PyMySQL.

One SparkSession serves the in-process dumps of this module (a session starts in about 5 s);
the dumps that are controlled while they run go in a thread. The kill test runs the entry point
as its own application, twice.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psutil
import psycopg
import pytest
from pyspark.sql import SparkSession

from airflow_provider_dblog.config import load_config
from airflow_provider_dblog.core.dump_plan import Chunk, DumpKind, DumpRequest
from airflow_provider_dblog.demo.postgres import TABLES, Workload, compare, snapshot
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.process import free_port
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import PAUSE_POLL_S
from airflow_provider_dblog.dump.spark_chunk import SparkChunkReader
from airflow_provider_dblog.dump.spark_run import run_spark_dump
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.sources.base import SourceUnavailable
from airflow_provider_dblog.state import DumpState, DumpStatus, StateStoreUnavailable
from airflow_provider_dblog.targets import direct_target_for
from tests.integration.e2e_support import (
    MYSQL_PASSWORD_ENV,
    PASSWORD_ENV,
    REDIS_PASSWORD_ENV,
    REPO,
    Writer,
    cli_env,
    materialize,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
)
from tests.integration.spark_support import (
    Pipeline,
    python_workers,
    running_mysql_pipeline,
    running_pipeline,
    stop_spark,
)

pytestmark = pytest.mark.integration
ROWS = 600


@pytest.fixture(scope="module")
def spark(
    pg15: PostgresInfo, mariadb: MariaDBInfo, redis_server: RedisInfo
) -> Iterator[SparkSession]:
    """Executors inherit the environment the JVM started with: passwords must be set first."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ[PASSWORD_ENV] = pg15.password
    os.environ[MYSQL_PASSWORD_ENV] = mariadb.password
    os.environ[REDIS_PASSWORD_ENV] = redis_server.password
    session = (
        SparkSession.builder.master("local[2]")
        .appName("dblog-test-spark-dump")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    yield session
    stop_spark(session)


@pytest.fixture
def pipeline(pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path) -> Iterator[Pipeline]:
    with running_pipeline(pg15, redis_server, tmp_path, ROWS) as pipeline:
        yield pipeline


@pytest.mark.parametrize("parallelism", [1, 3])
def test_full_dump_under_writes_converges(
    spark: SparkSession, pipeline: Pipeline, parallelism: int
) -> None:
    dbs, store = pipeline.dbs, pipeline.store
    config = load_config(pipeline.config_path)
    workload = Workload(dbs.source_dsn, seed=11)
    workload.start()
    try:
        request = DumpRequest("full", DumpKind.ALL, TABLES, chunk_size=150, parallelism=parallelism)
        store.dumps.create(request)
        assert (
            run_spark_dump(spark.sparkContext, config, "full", direct_target_for) is DumpState.DONE
        )
    finally:
        workload.join()
    assert workload.writes > 0
    wait_caught_up(dbs)
    assert compare(dbs.source_dsn, dbs.target_dsn) == []
    status = store.dumps.status("full")
    assert status is not None and status.state is DumpState.DONE and status.rows >= ROWS * 3


def test_full_dump_of_a_mariadb_source_under_writes_converges(
    spark: SparkSession, mariadb: MariaDBInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """Three windows in flight, each chunk read by two executors with PyMySQL, while another
    process writes: the dump ends done and the NDJSON the binlog tailer wrote rebuilds the
    source's rows."""
    events_dir = tmp_path / "events"
    with running_mysql_pipeline(mariadb, redis_server, tmp_path, ROWS, events_dir) as pipeline:
        dbs, store = pipeline.dbs, pipeline.store
        config = load_config(pipeline.config_path)
        writer = Writer(dbs, tmp_path, seed_value=17)
        try:
            writer.wait_for(10)
            request = DumpRequest("full", DumpKind.ALL, dbs.tables, chunk_size=150, parallelism=3)
            store.dumps.create(request)
            assert (
                run_spark_dump(spark.sparkContext, config, "full", direct_target_for)
                is DumpState.DONE
            )
            written = len(writer.stop())
        finally:
            writer.kill()
        wait_caught_up(dbs, store=store)
        rows = source_state(dbs.source)
    assert written > 10, "the writer wrote during the dump"
    events = list(read_events(events_dir))
    assert state_differences(rows, materialize(events)) == []
    status = store.dumps.status("full")
    assert status is not None and status.state is DumpState.DONE and status.rows >= ROWS * 3


def test_key_list_repair_copies_exactly_those_keys(spark: SparkSession, pipeline: Pipeline) -> None:
    """Read-only (the request's `read_only`, on a source that may be written): the Spark
    driver writes no watermark (the row keeps its value and version), the tailer arms and
    closes the windows, and exactly the keys asked arrive."""
    dbs, store = pipeline.dbs, pipeline.store
    keys = tuple((k,) for k in range(5, ROWS, 7))
    request = DumpRequest(
        "repair", DumpKind.KEYS, (TABLES[0],), keys, chunk_size=40, read_only=True
    )
    store.dumps.create(request)
    config = load_config(pipeline.config_path)
    watermark = "SELECT xmin::text, value FROM dblog.watermark"
    with psycopg.connect(dbs.source_dsn) as conn:
        before = conn.execute(watermark).fetchall()
    assert (
        run_spark_dump(spark.sparkContext, config, "repair", direct_target_for, tasks=3)
        is DumpState.DONE
    )
    with psycopg.connect(dbs.source_dsn) as conn:
        assert conn.execute(watermark).fetchall() == before
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
    status = store.dumps.status("repair")
    assert status is not None and status.rows == len(keys)
    assert status.chunks == -(-len(keys) // 40)


def status_of(pipeline: Pipeline, dump_id: str) -> DumpStatus:
    status = pipeline.store.dumps.status(dump_id)
    assert status is not None
    return status


@contextmanager
def dump_in_thread(
    spark: SparkSession, pipeline: Pipeline, dump_id: str
) -> Iterator[Future[DumpState]]:
    """The stored dump run by this module's Spark in a thread, to be controlled meanwhile."""
    config = load_config(pipeline.config_path)
    with ThreadPoolExecutor(1, thread_name_prefix="spark-dump") as pool:
        run = pool.submit(run_spark_dump, spark.sparkContext, config, dump_id, direct_target_for)
        try:
            yield run
        finally:
            pipeline.store.dumps.cancel(dump_id)  # a failed test must not leave it running


def slow_dump(pipeline: Pipeline, request: DumpRequest) -> None:
    """Store the request, slowed down enough to be controlled before it ends."""
    pipeline.store.dumps.create(request)
    pipeline.store.dumps.throttle(request.dump_id, delay_ms=300)


def test_pause_holds_between_chunks_and_resume_finishes(
    spark: SparkSession, pipeline: Pipeline
) -> None:
    store = pipeline.store
    slow_dump(pipeline, DumpRequest("paused", DumpKind.ALL, TABLES, chunk_size=100))
    with dump_in_thread(spark, pipeline, "paused") as run:
        wait_until(lambda: status_of(pipeline, "paused").chunks >= 2, 60, "2 chunks")
        assert store.dumps.pause("paused")
        wait_until(lambda: status_of(pipeline, "paused").state is DumpState.PAUSED, 30, "the pause")
        held = status_of(pipeline, "paused")

        def paused_for_three_polls() -> bool:
            now = status_of(pipeline, "paused")
            assert now.state is DumpState.PAUSED and now.chunks == held.chunks, now
            return now.updated_ms >= held.updated_ms + 3000 * PAUSE_POLL_S

        wait_until(paused_for_three_polls, 30, "the paused dump reading its controls")
        assert not run.done()
        store.dumps.throttle("paused", delay_ms=0)
        assert store.dumps.resume("paused")
        assert run.result(timeout=120) is DumpState.DONE
    wait_caught_up(pipeline.dbs)
    assert compare(pipeline.dbs.source_dsn, pipeline.dbs.target_dsn) == []
    final = status_of(pipeline, "paused")
    assert held.chunks < 18
    assert final.state is DumpState.DONE and final.chunks == 18 and final.rows == ROWS * 3


def test_cancel_ends_the_run_and_no_chunk_follows(spark: SparkSession, pipeline: Pipeline) -> None:
    store = pipeline.store
    slow_dump(pipeline, DumpRequest("cancelled", DumpKind.ALL, TABLES, chunk_size=100))
    with dump_in_thread(spark, pipeline, "cancelled") as run:
        wait_until(lambda: status_of(pipeline, "cancelled").chunks >= 2, 60, "2 chunks")
        assert store.dumps.cancel("cancelled")
        assert run.result(timeout=60) is DumpState.CANCELLED
    stopped = status_of(pipeline, "cancelled")
    assert stopped.state is DumpState.CANCELLED and 2 <= stopped.chunks < 18
    progress = store.dumps.load_progress("cancelled").values()
    assert sum(p.chunks_done for p in progress) == stopped.chunks
    # Running the cancelled request again reads nothing.
    config = load_config(pipeline.config_path)
    assert (
        run_spark_dump(spark.sparkContext, config, "cancelled", direct_target_for)
        is DumpState.CANCELLED
    )
    assert status_of(pipeline, "cancelled").chunks == stopped.chunks


def test_chunk_size_changed_mid_run_applies_from_the_next_chunk(
    spark: SparkSession, pipeline: Pipeline
) -> None:
    store = pipeline.store
    accounts = DumpRequest("resized", DumpKind.TABLE, (TABLES[0],), chunk_size=50)
    slow_dump(pipeline, accounts)  # keys 1..ROWS, so a chunk holds exactly chunk_size rows
    with dump_in_thread(spark, pipeline, "resized") as run:
        wait_until(lambda: status_of(pipeline, "resized").chunks >= 2, 60, "2 chunks")
        seen = status_of(pipeline, "resized").chunks
        assert store.dumps.throttle("resized", chunk_size=200, delay_ms=0)
        assert run.result(timeout=120) is DumpState.DONE
    final = status_of(pipeline, "resized")
    assert final.rows == ROWS
    # `seen` chunks of 50 were done, and at most one more was already planned with 50.
    possible = {small + math.ceil((ROWS - 50 * small) / 200) for small in (seen, seen + 1)}
    assert final.chunks in possible, (seen, final.chunks)
    wait_caught_up(pipeline.dbs)
    source, target = snapshot(pipeline.dbs.source_dsn), snapshot(pipeline.dbs.target_dsn)
    assert target["accounts"] == source["accounts"]


def test_killed_application_resumes_without_rereading(
    pipeline: Pipeline, redis_server: RedisInfo, tmp_path: Path
) -> None:
    dbs, store = pipeline.dbs, pipeline.store
    request = DumpRequest("resumed", DumpKind.ALL, TABLES, chunk_size=100)
    store.dumps.create(request)
    store.dumps.throttle("resumed", delay_ms=400)  # slow enough to be killed in the middle
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
            status = store.dumps.status("resumed")
            assert first.poll() is None, "the Spark dump ended before it was killed"
            return status is not None and status.chunks >= 4

        wait_until(some_chunks_done, 120, "the Spark dump completing 4 chunks")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    killed = store.dumps.status("resumed")
    assert killed is not None and killed.state is DumpState.RUNNING
    done_before = sum(p.chunks_done for p in store.dumps.load_progress("resumed").values())
    assert 4 <= done_before < 18

    store.dumps.throttle("resumed", delay_ms=0)
    second = subprocess.run(
        command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=180
    )
    assert second.returncode == 0, (tmp_path / "spark-dump.log").read_text()[-3000:]
    wait_caught_up(dbs)
    assert compare(dbs.source_dsn, dbs.target_dsn) == []
    status = store.dumps.status("resumed")
    assert status is not None and status.state is DumpState.DONE
    # 600 rows per table in chunks of 100: 6 chunks each. A re-read chunk would count again.
    assert status.chunks == 18
    assert status.rows == ROWS * 3


def test_killed_python_workers_fail_the_chunk_job_and_the_chunk_is_retried(
    spark: SparkSession, pipeline: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGKILL to the Python workers while a chunk's job runs: the task fails ("Python worker
    exited unexpectedly"), local mode does not retry a task (`local[2]`: one attempt), so the
    job fails, the driver's `SparkChunkReader` raises `ChunkJobFailed` and the runner retries
    the chunk with new watermarks; the window left open is abandoned, its rows never emitted.

    A kill is only sure to fail a job if it lands while a task runs: an idle worker killed
    between two jobs is replaced by Spark and nothing fails, and a warm worker's task lasts
    milliseconds. So the workers are killed whenever the status tracker reports a job running,
    again, until the retried-window counter moves (in practice the first job seen running
    fails). The retry's backoff (`ChunkRetries.window_backoff`) comes before the counter moves, so
    the kills stop before the new window's job starts."""
    store = pipeline.store
    slow_dump(pipeline, DumpRequest("crashed", DumpKind.ALL, TABLES, chunk_size=100))
    tracker = spark.sparkContext.statusTracker()
    kills = 0
    with (
        caplog.at_level(logging.INFO, logger="airflow_provider_dblog.dump.runner"),
        dump_in_thread(spark, pipeline, "crashed") as run,
    ):
        wait_until(lambda: status_of(pipeline, "crashed").chunks >= 2, 60, "2 chunks")
        # A window that expired before (a slow first Spark job on a crowded machine) is not
        # the retry the kills must cause.
        retried_before = status_of(pipeline, "crashed").windows_retried

        def killed_until_retried() -> bool:
            nonlocal kills
            if status_of(pipeline, "crashed").windows_retried > retried_before:
                return True
            assert not run.done(), f"the dump ended before a window was retried: {run.result()}"
            if tracker.getActiveJobsIds():
                for worker in python_workers():
                    with contextlib.suppress(psutil.NoSuchProcess):
                        worker.kill()
                        kills += 1
            return False

        wait_until(killed_until_retried, 30, "a chunk's Spark job failing under the kills")
        assert kills >= 1
        store.dumps.throttle("crashed", delay_ms=0)
        assert run.result(timeout=120) is DumpState.DONE
    failed = [r for r in caplog.records if "the Spark job of chunk" in r.getMessage()]
    assert failed, "no chunk was retried for a failed Spark job"
    final = status_of(pipeline, "crashed")
    assert final.state is DumpState.DONE and final.windows_retried >= 1
    # 600 rows per table in chunks of 100: 6 chunks each. A chunk completed twice counts twice.
    assert final.chunks == 18 and final.rows == ROWS * 3
    wait_caught_up(pipeline.dbs)
    assert compare(pipeline.dbs.source_dsn, pipeline.dbs.target_dsn) == []


@pytest.fixture
def restartable(pipeline: Pipeline) -> Iterator[Pipeline]:
    """The pipeline, its pg15 (the session's) brought back up whatever the test did to it."""
    try:
        yield pipeline
    finally:
        pipeline.dbs.pg.start()


def test_spark_dump_rides_through_a_source_restart(
    spark: SparkSession, restartable: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    """A fast shutdown and start of PostgreSQL (a failover, a minor upgrade) while chunks' jobs
    run: the chunk it broke (on the driver's connection, or in a task) is retried with new
    watermarks once the server is back, the dump ends done and the target equals the source."""
    pipeline = restartable
    slow_dump(pipeline, DumpRequest("restarted", DumpKind.ALL, TABLES, chunk_size=100))
    with (
        caplog.at_level(logging.WARNING, logger="airflow_provider_dblog.dump"),
        dump_in_thread(spark, pipeline, "restarted") as run,
    ):
        wait_until(lambda: status_of(pipeline, "restarted").chunks >= 2, 60, "2 chunks")
        pipeline.dbs.pg.restart()  # SIGINT: a fast shutdown, every session ended, then a start
        at_restart = status_of(pipeline, "restarted")
        pipeline.store.dumps.throttle("restarted", delay_ms=0)
        assert run.result(timeout=180) is DumpState.DONE
    assert at_restart.state is DumpState.RUNNING and at_restart.chunks < 18, at_restart
    # The driver's connection was lost (its next query, planning or a watermark, met it), or a
    # task's: either way the dump waited and went on.
    met = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("airflow_provider_dblog.dump") and "unavailable (" in r.getMessage()
    ]
    assert any("source" in m for m in met), "the dump never met the restart"
    final = status_of(pipeline, "restarted")
    assert final.state is DumpState.DONE, final
    # 600 rows per table in chunks of 100: 6 chunks each. A chunk completed twice counts twice.
    assert final.chunks == 18 and final.rows == ROWS * 3
    wait_caught_up(pipeline.dbs)
    assert compare(pipeline.dbs.source_dsn, pipeline.dbs.target_dsn) == []


def test_a_spark_task_that_finds_the_source_gone_makes_the_chunk_unavailable(
    spark: SparkSession, restartable: Pipeline
) -> None:
    """With the server down, each task of a key chunk (no query on the driver) fails to
    connect: the tasks report it, and the reader raises SourceUnavailable, which the runner
    waits out, instead of a failed job, which would spend a window attempt."""
    pipeline = restartable
    config = load_config(pipeline.config_path)
    reader = SparkChunkReader(spark.sparkContext, config, "none", tasks=2, default_chunk_size=10)
    chunk = Chunk(TABLES[0], 0, keys=((1,), (2,), (3,), (4,)))
    source = pipeline.dbs.source.chunk_source()
    pipeline.dbs.pg.stop()
    try:
        with pytest.raises(SourceUnavailable, match="a Spark task could not read the source"):
            reader(pipeline.store, source, "no-window", chunk, ("id",))
    finally:
        source.close()


def test_a_spark_task_that_finds_redis_gone_makes_the_chunk_wait_not_fail(
    spark: SparkSession, pipeline: Pipeline, tmp_path: Path
) -> None:
    """The tasks' Redis cannot be reached (the driver's can: it reads the dump's controls
    there): each task reports it, and the reader raises StateStoreUnavailable, which the runner
    waits out within its patience, instead of a failed job, which would spend one of the
    chunk's window attempts."""
    text = pipeline.config_path.read_text()
    closed = re.sub(r"redis://([^:/]+):\d+", rf"redis://\1:{free_port()}", text)
    assert closed != text
    (tmp_path / "closed.toml").write_text(closed)
    config = load_config(tmp_path / "closed.toml")
    reader = SparkChunkReader(spark.sparkContext, config, "none", tasks=2, default_chunk_size=10)
    chunk = Chunk(TABLES[0], 0, keys=((1,), (2,), (3,), (4,)))
    source = pipeline.dbs.source.chunk_source()
    try:
        with pytest.raises(
            StateStoreUnavailable, match="a Spark task could not reach the state store"
        ):
            reader(pipeline.store, source, "no-window", chunk, ("id",))
    finally:
        source.close()
