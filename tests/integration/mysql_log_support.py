"""Shared pieces of the MySQL log tests: a private database on the session's MariaDB, the
tailer (the real `Tailer` in a thread, or `dblog tail` from a TOML file), and reading its NDJSON
output back."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql

from airflow_provider_dblog.core.event import Event, Op, TableRef
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import NdjsonOutput, read_events
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.mysql.source import MysqlSource
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer, TailerSettings

REPO = Path(__file__).resolve().parents[2]
PASSWORD_ENV = "MYLOG_SOURCE_PASSWORD"
REDIS_PASSWORD_ENV = "MYLOG_REDIS_PASSWORD"
SETTINGS = TailerSettings(window_ttl_s=30, lease_ttl_ms=3000, heartbeat_s=0.2, reconnect_max_s=2)


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
            MysqlSource(capture.config), self.store, self.output, owner="mylog", settings=SETTINGS
        )
        self._stop = threading.Event()
        self.thread = self.tailer.start(self._stop)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the tailer did not stop"
        self.output.close()


def write_toml(capture: MysqlCapture, redis_server: RedisInfo, directory: Path, path: Path) -> Path:
    """A `dblog` TOML file for this capture (passwords only by environment variable name)."""
    config = capture.config
    path.write_text(
        "\n".join(
            [
                "[source]",
                'type = "mysql"',
                f'name = "{config.name}"',
                f'dsn = "{config.dsn}"',
                f'password_env = "{PASSWORD_ENV}"',
                f'tables = ["{capture.database}.items"]',
                f'watermark_database = "{capture.watermark_database}"',
                "",
                "[redis]",
                f'url = "redis://{redis_server.host}:{redis_server.port}/{redis_server.db}"',
                f'password_env = "{REDIS_PASSWORD_ENV}"',
                "",
                "[output]",
                'type = "ndjson"',
                f'directory = "{directory}"',
                "",
                "[tailer]",
                "heartbeat_s = 0.2",
                "lease_ttl_ms = 3000",
                "window_ttl_s = 30",
                "",
            ]
        )
    )
    return path


def cli_env(capture: MysqlCapture, redis_server: RedisInfo) -> dict[str, str]:
    return {
        **os.environ,
        PASSWORD_ENV: capture.info.password,
        REDIS_PASSWORD_ENV: redis_server.password,
        "PYTHONPATH": str(REPO),
    }


def events_in(directory: Path) -> list[Event]:
    return list(read_events(directory)) if directory.exists() else []


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
