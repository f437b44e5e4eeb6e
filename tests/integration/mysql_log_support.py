"""Shared pieces of the MySQL log tests: a private database on the session's MariaDB, the
tailer over the real binlog reader (in a thread, or as a process to SIGKILL), and reading its
NDJSON output back.

Run as a module, it is that tailer process: `python -m tests.integration.mysql_log_support
SPEC.json`, where the spec (written by `TailerProcess`) says where the source, Redis and the
output are; the passwords come from the environment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql
import redis

from airflow_provider_dblog.core.event import Event, Op, TableRef
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import NdjsonOutput, read_events
from airflow_provider_dblog.sources.mysql.binlog import MysqlLogReader
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer, TailerSettings

REPO = Path(__file__).resolve().parents[2]
PASSWORD_ENV = "MYLOG_SOURCE_PASSWORD"
REDIS_URL_ENV = "MYLOG_REDIS_URL"
SETTINGS = TailerSettings(window_ttl_s=30, lease_ttl_ms=3000, heartbeat_s=0.2, reconnect_max_s=2)
HEARTBEAT_S = 0.2


class BinlogSource:
    """The parts of a `Source` the tailer uses, over the real binlog reader."""

    def __init__(self, config: MysqlSourceConfig) -> None:
        self.config = config

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def tables(self) -> tuple[TableRef, ...]:
        return self.config.tables

    def database(self) -> str:
        return self.config.database or ""

    def log_reader(self, resume: str | None = None) -> MysqlLogReader:
        return MysqlLogReader(self.config, resume, heartbeat_s=HEARTBEAT_S)


@dataclass
class MysqlCapture:
    """A private database with one captured table `items (id int unsigned, note, amount)` and
    a private watermark database, on a shared MariaDB."""

    info: MariaDBInfo
    database: str = field(default_factory=lambda: f"mylog_{uuid.uuid4().hex[:10]}")

    def __post_init__(self) -> None:
        self.watermark_database = self.database + "_wm"
        with self.admin() as cursor:
            for db in (self.database, self.watermark_database):
                cursor.execute(f"CREATE DATABASE `{db}`")
                cursor.execute(f"GRANT ALL ON `{db}`.* TO 'dblog'@'%'")
            cursor.execute(
                f"CREATE TABLE `{self.watermark_database}`.watermark "
                "(id int PRIMARY KEY, value varchar(64) NOT NULL)"
            )
            cursor.execute(f"INSERT INTO `{self.watermark_database}`.watermark VALUES (1, '-')")
            cursor.execute(
                f"CREATE TABLE `{self.database}`.items (id int unsigned PRIMARY KEY, "
                "note varchar(40) NOT NULL, amount decimal(10,2)) ENGINE=InnoDB"
            )
        os.environ[PASSWORD_ENV] = self.info.password
        self.config = MysqlSourceConfig(
            name=self.database,
            dsn=f"mysql://{self.info.user}@{self.info.host}:{self.info.port}/{self.database}",
            tables=(TableRef(self.database, "items"),),
            password_env=PASSWORD_ENV,
            watermark_database=self.watermark_database,
        )

    def admin(self) -> _Cursor:
        return _Cursor(self.info.admin_connect_kwargs())

    def execute(self, *statements: str) -> None:
        """Statements in one transaction, as the `dblog` user."""
        conn = pymysql.connect(**{**self.info.connect_kwargs(), "database": self.database})
        try:
            with conn.cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement)
            conn.commit()
        finally:
            conn.close()

    def rows(self) -> dict[int, tuple[str, str | None]]:
        conn = pymysql.connect(**{**self.info.connect_kwargs(), "database": self.database})
        try:
            with conn.cursor() as cursor:
                cursor.execute("SELECT id, note, amount FROM items")
                return {
                    int(i): (str(n), None if a is None else f"{a:.2f}")
                    for i, n, a in cursor.fetchall()
                }
        finally:
            conn.close()

    def drop(self) -> None:
        with self.admin() as cursor:
            for db in (self.database, self.watermark_database):
                cursor.execute(f"DROP DATABASE IF EXISTS `{db}`")


class _Cursor:
    def __init__(self, kwargs: dict[str, Any]) -> None:
        self._conn = pymysql.connect(**kwargs, autocommit=True)

    def __enter__(self) -> pymysql.cursors.Cursor:
        return self._conn.cursor()

    def __exit__(self, *exc: object) -> None:
        self._conn.close()


def rebuild(events: list[Event]) -> dict[int, tuple[str, str | None]]:
    """The table as the change stream says it is."""
    state: dict[int, tuple[str, str | None]] = {}
    for event in events:
        if event.op is Op.TRUNCATE:
            state.clear()
            continue
        if event.op is Op.SCHEMA:
            continue
        key = int(event.key["id"])
        if event.after is None:
            state.pop(key, None)
        else:
            state[key] = (event.after["note"], event.after["amount"])
    return state


class InThreadTailer:
    """The real `Tailer` in a thread of the test process, writing NDJSON into `directory`."""

    def __init__(self, capture: MysqlCapture, redis_server: RedisInfo, directory: Path) -> None:
        self.store = StateStore(redis_server.client(), capture.config.name)
        self.output = NdjsonOutput(directory)
        self.tailer = Tailer(
            BinlogSource(capture.config), self.store, self.output, owner="mylog", settings=SETTINGS
        )
        self._stop = threading.Event()
        self.thread = self.tailer.start(self._stop)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the tailer did not stop"
        self.output.close()


@dataclass
class TailerProcess:
    """The tailer as a process of its own (this module run as a program)."""

    capture: MysqlCapture
    redis_server: RedisInfo
    directory: Path
    log: Path
    process: subprocess.Popen[bytes] = field(init=False)

    def __post_init__(self) -> None:
        spec = {
            "name": self.capture.config.name,
            "dsn": self.capture.config.dsn,
            "table": self.capture.database,
            "watermark_database": self.capture.watermark_database,
            "directory": str(self.directory),
        }
        spec_file = self.log.with_suffix(".json")
        spec_file.write_text(json.dumps(spec))
        env = {
            **os.environ,
            PASSWORD_ENV: self.capture.info.password,
            REDIS_URL_ENV: self.redis_server.url,
            "PYTHONPATH": str(REPO),
        }
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.mysql_log_support", str(spec_file)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
            )

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)


def events_in(directory: Path) -> list[Event]:
    return list(read_events(directory)) if directory.exists() else []


def _serve(spec_file: str) -> None:
    spec = json.loads(Path(spec_file).read_text())
    config = MysqlSourceConfig(
        name=spec["name"],
        dsn=spec["dsn"],
        tables=(TableRef(spec["table"], "items"),),
        password_env=PASSWORD_ENV,
        watermark_database=spec["watermark_database"],
    )
    client = redis.Redis.from_url(os.environ[REDIS_URL_ENV])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    Tailer(
        BinlogSource(config),
        StateStore(client, config.name),
        NdjsonOutput(spec["directory"]),
        owner=f"mylog-{os.getpid()}",
        settings=SETTINGS,
    ).run(stop)


def iter_transactions(events: list[Event]) -> Iterator[list[Event]]:
    """Events grouped by their commit, in output order."""
    group: list[Event] = []
    for event in events:
        if group and group[-1].position.commit != event.position.commit:
            yield group
            group = []
        group.append(event)
    if group:
        yield group


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    _serve(sys.argv[1])
