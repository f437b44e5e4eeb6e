"""A direct dump through the Spark application (spark_jobs/dump.py, `mode = "direct"`) into the
lake on real PostgreSQL and Redis, under concurrent writes, with every kind of
kill: the
tailer (`dblog tail`, SIGKILLed and started again), Spark's Python workers (a task dies; local
mode `local[2,2]` runs it again, or its job fails and the chunk is retried) and the driver (the
whole application SIGKILLed, then run again: it resumes from its stored progress). The target
ends equal to the source (the lake once the compaction folded the tailer's NDJSON into it, as
DuckDB reads it), the dump wrote its rows itself and the tailer emitted none.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from airflow_provider_dblog.compaction.run import CompactOptions, compact
from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.dump_plan import Chunk, DumpKind, DumpRequest
from airflow_provider_dblog.demo.postgres import TABLES
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.lake.catalog import source_lake_schema
from airflow_provider_dblog.lake.schema import POSITION_COLUMNS, LakeRow
from airflow_provider_dblog.outputs.ndjson import event_files
from airflow_provider_dblog.state import DumpState, StateStore
from tests.integration.compaction.test_spark_compact import by_key, read_lake
from tests.integration.e2e_support import (
    REPO,
    Databases,
    TailProcess,
    Writer,
    cli_env,
    drop_databases,
    make_databases,
    wait_caught_up,
    wait_until,
    write_config,
)
from tests.integration.spark_support import python_workers

pytestmark = pytest.mark.integration
ROWS = 1200
CHUNK = 150
TASK_LOST = re.compile(r"Lost task|Python worker exited unexpectedly")


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, ROWS, target=False, seed_value=31)
    yield databases
    drop_databases(databases)


def test_a_spark_direct_dump_survives_tailer_task_and_driver_kills(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """Into the lake only: the SQL target's direct writes are the same `DirectTarget` calls,
    tested under a tailer kill through `dblog dump` (dump/test_direct.py); a second Spark
    run of this test would cost the suite minutes."""
    events, lake = tmp_path / "events", tmp_path / "lake"
    output: dict[str, object] = {"type": "ndjson", "directory": str(events)}
    tailer = {"heartbeat_s": 0.2, "window_ttl_s": 30, "lease_ttl_ms": 3000}
    config = write_config(tmp_path / "dblog.toml", dbs, redis_server, output, tailer)
    config.write_text(config.read_text() + f'\n[lake]\nroot = "{lake}"\n')
    env = cli_env(dbs, redis_server, PYSPARK_PYTHON=sys.executable)
    store = StateStore(redis_server.client(), dbs.config.name)
    request = DumpRequest(
        "spark-direct", DumpKind.ALL, dbs.tables, chunk_size=CHUNK, parallelism=2,
        mode=DumpMode.DIRECT,
    )  # fmt: skip
    store.dumps.create(request)
    store.dumps.throttle("spark-direct", delay_ms=300)  # slow enough to kill things meanwhile
    command = [
        *(sys.executable, str(REPO / "spark_jobs" / "dump.py"), "--dump-id", "spark-direct"),
        *("--config", str(config), "--master", "local[2,2]", "--window-timeout", "30"),
    ]
    log_path = tmp_path / "spark-dump.log"
    tail = TailProcess(config, "direct-spark-tailer", env, tmp_path / "tail.log")
    writer = Writer(dbs, tmp_path, seed_value=5)
    first: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: store.tailer.health() is not None, 30, "the tailer beating")
        writer.wait_for(10)
        with log_path.open("ab") as log:
            first = subprocess.Popen(
                command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

        def chunks() -> int:
            assert first is not None and first.poll() is None, log_path.read_text()[-3000:]
            status = store.dumps.status("spark-direct")
            return status.chunks if status is not None else 0

        wait_until(lambda: chunks() >= 2, 300, "two chunks written (a Spark start)")
        tail.kill()
        tail.start()
        wait_until(lambda: chunks() >= 4, 120, "chunks after the tailer's restart")

        kills = 0

        def a_task_lost() -> bool:
            nonlocal kills
            if TASK_LOST.search(log_path.read_text(errors="replace")):
                return True
            chunks()  # the application still runs
            for worker in python_workers():
                with contextlib.suppress(psutil.NoSuchProcess):
                    worker.kill()
                    kills += 1
            return False

        wait_until(a_task_lost, 120, "a Spark task dying under the kills")
        assert kills >= 1
        at_kill = chunks()
        wait_until(lambda: chunks() > at_kill, 120, "a chunk written after the task died")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
        killed = store.dumps.status("spark-direct")
        assert killed is not None and killed.state is DumpState.RUNNING
        done_before = sum(p.chunks_done for p in store.dumps.load_progress("spark-direct").values())

        store.dumps.throttle("spark-direct", delay_ms=0)
        with log_path.open("ab") as log:
            second = subprocess.run(
                command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=600
            )
        assert second.returncode == 0, log_path.read_text()[-3000:]
        writer.stop()
        wait_caught_up(dbs)
        assert_lake_equals_source(dbs, store, events, lake)
        status = store.dumps.status("spark-direct")
        assert status is not None and status.state is DumpState.DONE
        progress = store.dumps.load_progress("spark-direct")
        chunks_in_all = sum(p.chunks_done for p in progress.values())
        assert done_before < chunks_in_all, "the dump ended before its driver was killed"
        assert status.chunks == chunks_in_all, "a chunk completed before the kill was read again"
        assert all(p.done and 0 < p.rows_written <= p.rows_done for p in progress.values())
        health = store.tailer.health()
        assert health is not None and health.metrics["dump_rows"] == 0, health.metrics
    finally:
        writer.kill()
        if first is not None and first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        if tail.alive():
            tail.kill()


def assert_lake_equals_source(dbs: Databases, store: StateStore, events: Path, lake: Path) -> None:
    """The compaction folds the tailer's NDJSON (log events only) into the tables the dump
    wrote; DuckDB then reads each equal to the source's rows now."""
    lines = [json.loads(line) for f in event_files(events) for line in f.open()]
    assert lines and all(e["op"] != "r" for e in lines), "a dump row went through the tailer"
    schemas = {t: source_lake_schema(dbs.config, t) for t in TABLES}
    source = dbs.source.chunk_source()
    try:
        wanted = {
            t: schemas[t]
            .to_arrow([LakeRow(r, 1, 0, "r") for r in source.read_chunk(Chunk(t, 0)).rows])
            .drop_columns(list(POSITION_COLUMNS))
            for t in TABLES
        }
    finally:
        source.close()
    horizon = store.directs.horizon()
    report = compact(
        None, events, lake, CompactOptions(describe=schemas.__getitem__, prune_before=horizon)
    )
    assert report.events == len(lines)
    for table in TABLES:
        read = read_lake(lake, str(table)).drop_columns(list(POSITION_COLUMNS))
        key = schemas[table].key
        assert read.num_rows == wanted[table].num_rows > 0
        assert by_key(read, key) == by_key(wanted[table], key)
