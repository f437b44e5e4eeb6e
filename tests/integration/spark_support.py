"""Shared pieces of the Spark tests: the dump pipeline (source, target, tailer; on PostgreSQL or
MariaDB), the Python workers of this process's Spark (to kill them) and stopping a test's Spark
for good.

Python workers inherit the environment the JVM was launched with; a JVM left over from an
earlier module would not know the passwords a later module puts in the environment, so each
module stops its JVM (`stop_spark`).
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import psutil
import redis
from pyspark import SparkContext
from pyspark.sql import SparkSession

from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import RedisStreamOutput, SqlApplyOutput
from airflow_provider_dblog.outputs.base import Output
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer, TailerSettings
from tests.integration.e2e_support import (
    REDIS_PASSWORD_ENV,
    Databases,
    FanOut,
    MysqlDatabases,
    drop_databases,
    make_databases,
    make_mysql_databases,
    write_config,
)


def stop_spark(session: SparkSession) -> None:
    session.stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None


D = TypeVar("D", Databases, MysqlDatabases)

WINDOW_TTL_S = 30
"""How long the tailer waits for a window's hw: a chunk's Spark job on a crowded machine can take
several seconds between lw and hw."""


@dataclass
class Pipeline(Generic[D]):
    dbs: D
    config_path: Path
    store: StateStore
    tailer_stop: threading.Event
    tailer_thread: threading.Thread


@contextmanager
def running_pipeline(
    pg: PostgresInfo,
    redis_server: RedisInfo,
    work: Path,
    rows: int,
    events_dir: Path | None = None,
    stream_url_env: str | None = None,
) -> Iterator[Pipeline]:
    """A private source (`rows` rows per table before capture), an empty SQL target, and a
    tailer applying the log and the dump rows into it, in this process. Sets the password
    variables in this process's environment (a Spark JVM started later passes them on).
    With `events_dir`, the tailer also writes the change stream there as NDJSON; with
    `stream_url_env`, into a Redis Stream (the TOML's output) at the URL that variable holds."""
    dbs = make_databases(pg, rows, target=True, seed_value=random.randrange(1 << 30))
    os.environ[REDIS_PASSWORD_ENV] = redis_server.password
    output_config: dict[str, str] = {"type": "ndjson", "directory": "unused"}
    if stream_url_env is not None:
        output_config = {"type": "redis_stream", "url_env": stream_url_env}
    config_path = write_config(work / "dblog.toml", dbs, redis_server, output_config)
    dbs.source.ensure_setup()
    store = StateStore(redis_server.client(), dbs.config.name)
    output: Output = SqlApplyOutput(dbs.target_dsn, monotonic=True)
    if events_dir is not None:
        output = FanOut(output, NdjsonOutput(events_dir))
    if stream_url_env is not None:
        stream = RedisStreamOutput(redis.Redis.from_url(os.environ[stream_url_env]))
        output = FanOut(output, stream)
    tailer = Tailer(
        dbs.source,
        store,
        output,
        owner="spark-test-tailer",
        settings=TailerSettings(window_ttl_s=WINDOW_TTL_S),
    )
    stop = threading.Event()
    thread = tailer.start(stop)
    try:
        yield Pipeline(dbs, config_path, store, stop, thread)
    finally:
        stop.set()
        thread.join(30)
        output.close()
        drop_databases(dbs)


@contextmanager
def running_mysql_pipeline(
    info: MariaDBInfo, redis_server: RedisInfo, work: Path, rows: int, events_dir: Path
) -> Iterator[Pipeline[MysqlDatabases]]:
    """`running_pipeline` on MariaDB: the tailer writes the change stream as NDJSON into
    `events_dir` (the SQL-apply output writes PostgreSQL)."""
    dbs = make_mysql_databases(info, rows, seed_value=random.randrange(1 << 30))
    os.environ[REDIS_PASSWORD_ENV] = redis_server.password
    output_config = {"type": "ndjson", "directory": str(events_dir)}
    config_path = write_config(work / "dblog.toml", dbs, redis_server, output_config)
    dbs.source.ensure_setup()
    store = StateStore(redis_server.client(), dbs.config.name)
    output = NdjsonOutput(events_dir)
    tailer = Tailer(
        dbs.source,
        store,
        output,
        owner="spark-test-tailer",
        settings=TailerSettings(window_ttl_s=WINDOW_TTL_S, heartbeat_s=0.2),
    )
    stop = threading.Event()
    thread = tailer.start(stop)
    try:
        yield Pipeline(dbs, config_path, store, stop, thread)
    finally:
        stop.set()
        thread.join(30)
        output.close()
        drop_databases(dbs)


def python_workers() -> list[psutil.Process]:
    """The Python workers of this process's Spark: in local mode the JVM (a child of this
    process) starts `python -m pyspark.daemon`, which forks one worker per running task, reused
    for the next ones (without the daemon the JVM starts `python -m pyspark.worker` itself).
    Not the daemon: it only forks, and it reaps what is killed."""
    modules: dict[int, str] = {}
    parents: dict[int, int] = {}
    processes: dict[int, psutil.Process] = {}
    for process in psutil.Process().children(recursive=True):
        try:
            argv, parent = process.cmdline(), process.ppid()
        except psutil.Error:
            continue  # ended meanwhile
        if argv[1:3] in (["-m", "pyspark.daemon"], ["-m", "pyspark.worker"]):
            modules[process.pid], parents[process.pid] = argv[2], parent
            processes[process.pid] = process
    return [
        processes[pid]
        for pid, module in modules.items()
        if module == "pyspark.worker" or parents[pid] in modules
    ]
