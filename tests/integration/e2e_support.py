"""Shared pieces of the end-to-end tests: private databases, the writer process, a fan-out
output, `dblog` subprocesses, and the checks on NDJSON output and targets.

The source kit: `make_databases` (PostgreSQL) and `make_mysql_databases` (MariaDB) each create
a private source database with the three demo tables (bigint key; composite (text, int) key;
uuid key, `binary(16)` on MySQL), seeded before capture starts; `Databases` and
`MysqlDatabases` answer the same questions (its tables, its `[source]` TOML lines, its
password, how the writer process reaches it), `drop_databases` drops either and
`wait_caught_up` waits on either's log. A test body written against that runs on both."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Event, Op, Row, TableRef
from airflow_provider_dblog.demo import mariadb as mariadb_demo
from airflow_provider_dblog.demo.postgres import SCHEMA, TABLES, seed
from airflow_provider_dblog.demo.story import TABLE_NAMES
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs.base import Output
from airflow_provider_dblog.sources.base import Source, SourceConfig
from airflow_provider_dblog.sources.factory import parse_source_config, source_for
from airflow_provider_dblog.sources.mysql.coordinates import binlog_file_number, mysql_commit
from airflow_provider_dblog.sources.postgres.lsn import parse_pg_lsn
from airflow_provider_dblog.state import StateStore
from tests.deadlines import deadline_s

REPO = Path(__file__).resolve().parents[2]
DBLOG = str(Path(sys.executable).with_name("dblog"))
PASSWORD_ENV = "E2E_SOURCE_PASSWORD"
MYSQL_PASSWORD_ENV = "E2E_MYSQL_PASSWORD"
"""The MariaDB source's own variable: a Spark JVM passes on the environment it started with,
so one that serves both sources needs both passwords, each under its own name."""
REDIS_PASSWORD_ENV = "E2E_REDIS_PASSWORD"
RowKey = tuple[str, str]
"""(table name, JSON list of the key values in primary-key order)."""
VERSION_COLUMN = "e2e_version"
VERSIONED = f"""
ALTER TABLE accounts ADD COLUMN {VERSION_COLUMN} bigint;
ALTER TABLE orders ADD COLUMN {VERSION_COLUMN} bigint;
ALTER TABLE items ADD COLUMN {VERSION_COLUMN} bigint;
CREATE SEQUENCE e2e_version_seq;
"""
"""The demo tables of an e2e database get a version column that the writer (e2e_writer.py)
stamps from the sequence; rows written before the workload have none (version 0)."""


def wait_until(
    condition: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05
) -> None:
    """Poll `condition` every `interval_s` until true; fail the test with `what` after
    `timeout_s`."""
    deadline = time.monotonic() + deadline_s(timeout_s)
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {deadline_s(timeout_s)}s")
        time.sleep(interval_s)


@dataclass
class Databases:
    """A private source database (and optionally a target) on a shared server."""

    pg: PostgresInfo
    source_db: str
    target_db: str | None
    config: SourceConfig
    slot: str
    kind = "postgres"
    password_env = PASSWORD_ENV

    @property
    def source(self) -> Source:
        return source_for(self.config)

    @property
    def tables(self) -> tuple[TableRef, ...]:
        return TABLES

    def table(self, name: str) -> TableRef:
        return TableRef("public", name)

    @property
    def password(self) -> str:
        return self.pg.password

    def toml_source(self, port: int | None = None) -> list[str]:
        """The `[source]` lines of a `dblog` TOML file, after `type` and before `password_env`."""
        return [
            'type = "postgres"',
            f'dsn = "host={self.pg.host} port={port or self.pg.port} dbname={self.source_db} '
            f'user={self.pg.user}"',
            f'slot = "{self.slot}"',
        ]

    @property
    def source_dsn(self) -> str:
        return self._dsn(self.source_db)

    @property
    def target_dsn(self) -> str:
        assert self.target_db is not None
        return self._dsn(self.target_db)

    def _dsn(self, dbname: str) -> str:
        return self.pg.dsn.rsplit("/", 1)[0] + "/" + dbname


def make_databases(pg: PostgresInfo, rows: int, *, target: bool, seed_value: int) -> Databases:
    """A fresh source database with the three demo tables (`rows` rows each, written before
    capture starts, with `seed_value`) and its own slot and source name; and an empty target
    with the same tables. Both have the writer's version column (`VERSIONED`)."""
    print(f"e2e databases: seed {seed_value}")
    suffix = secrets.token_hex(4)
    source_db, target_db = f"e2e_src_{suffix}", f"e2e_tgt_{suffix}" if target else None
    with psycopg.connect(pg.admin_dsn, autocommit=True) as conn:
        for db in (source_db, target_db):
            if db is not None:
                conn.execute(f"CREATE DATABASE {db} OWNER {pg.user}")
    base = pg.dsn.rsplit("/", 1)[0]
    with psycopg.connect(f"{base}/{source_db}", autocommit=True) as conn:
        if rows:
            seed(conn, rows, random.Random(seed_value))
        else:
            conn.execute(SCHEMA)
        conn.execute(VERSIONED)
    if target_db is not None:
        with psycopg.connect(f"{base}/{target_db}", autocommit=True) as conn:
            conn.execute(SCHEMA)
            conn.execute(VERSIONED)
    os.environ[PASSWORD_ENV] = pg.password
    config = parse_source_config(
        {
            "type": "postgres",
            "name": f"e2e_{suffix}",
            "dsn": f"host={pg.host} port={pg.port} dbname={source_db} user={pg.user}",
            "tables": [str(t) for t in TABLES],
            "password_env": PASSWORD_ENV,
            "slot": f"e2e_{suffix}",
        }
    )
    return Databases(pg, source_db, target_db, config, slot=f"e2e_{suffix}")


MYSQL_VERSIONED = tuple(
    f"ALTER TABLE {table} ADD COLUMN {VERSION_COLUMN} bigint" for table in TABLE_NAMES
)
"""`VERSIONED` on MySQL (the writer counts versions itself: no sequence)."""


@dataclass
class MysqlDatabases:
    """A private source database and its own watermark database on a shared MariaDB (no SQL
    target: the SQL-apply output writes PostgreSQL)."""

    info: MariaDBInfo
    source_db: str
    config: SourceConfig
    kind = "mysql"
    target_db = None
    password_env = MYSQL_PASSWORD_ENV

    @property
    def source(self) -> Source:
        return source_for(self.config)

    @property
    def tables(self) -> tuple[TableRef, ...]:
        return tuple(self.table(t.name) for t in TABLES)

    def table(self, name: str) -> TableRef:
        return TableRef(self.source_db, name)

    @property
    def password(self) -> str:
        return self.info.password

    @property
    def source_dsn(self) -> str:
        """The writer's DSN, password included (it travels in the environment only)."""
        i = self.info
        return f"mysql://{i.user}:{i.password}@{i.host}:{i.port}/{self.source_db}"

    @property
    def watermark_db(self) -> str:
        return self.source_db + "_wm"

    def toml_source(self, port: int | None = None) -> list[str]:
        i = self.info
        return [
            'type = "mysql"',
            f'dsn = "mysql://{i.user}@{i.host}:{port or i.port}/{self.source_db}"',
            f'watermark_database = "{self.watermark_db}"',
        ]

    def admin(self, *statements: str) -> None:
        with (
            pymysql.connect(**self.info.admin_connect_kwargs(), autocommit=True) as conn,
            conn.cursor() as cursor,
        ):
            for statement in statements:
                cursor.execute(statement)


def make_mysql_databases(info: MariaDBInfo, rows: int, *, seed_value: int) -> MysqlDatabases:
    """`make_databases` on MariaDB: a fresh source database with the three demo tables, `rows`
    rows each written before capture starts, and a watermark database of its own."""
    print(f"e2e databases: seed {seed_value}")
    suffix = secrets.token_hex(4)
    source_db = f"e2e_src_{suffix}"
    os.environ[MYSQL_PASSWORD_ENV] = info.password
    config = parse_source_config(
        {
            "type": "mysql",
            "name": f"e2e_{suffix}",
            "dsn": f"mysql://{info.user}@{info.host}:{info.port}/{source_db}",
            "tables": [f"{source_db}.{t.name}" for t in TABLES],
            "password_env": MYSQL_PASSWORD_ENV,
            "watermark_database": source_db + "_wm",
        }
    )
    dbs = MysqlDatabases(info, source_db, config)
    grants = [
        statement
        for db in (source_db, dbs.watermark_db)
        for statement in (f"CREATE DATABASE `{db}`", f"GRANT ALL ON `{db}`.* TO '{info.user}'@'%'")
    ]
    dbs.admin(*grants)
    with (
        pymysql.connect(**{**info.connect_kwargs(), "database": source_db}) as conn,
        conn.cursor() as cursor,
    ):
        mariadb_demo.seed(cursor, rows, random.Random(seed_value))
        for statement in MYSQL_VERSIONED:
            cursor.execute(statement)
        conn.commit()
    return dbs


SourceDatabases = Databases | MysqlDatabases
"""Either kit's databases: what a test parametrized by source gets."""


SOURCES = ["postgres", "mariadb"]
"""The kinds of source a test parametrized over both runs on (`make_source`)."""


def make_source(request: pytest.FixtureRequest, rows: int, seed_value: int) -> SourceDatabases:
    """A private source of `request.param`'s kind with `rows` rows per table (and on
    PostgreSQL an empty SQL target)."""
    if request.param == "mariadb":
        info: MariaDBInfo = request.getfixturevalue("mariadb")
        return make_mysql_databases(info, rows, seed_value=seed_value)
    pg: PostgresInfo = request.getfixturevalue("pg15")
    return make_databases(pg, rows, target=True, seed_value=seed_value)


def capturing(dbs: SourceDatabases, *names: str) -> SourceDatabases:
    """`dbs` with a config that captures its tables `names` only (for `write_config`)."""
    tables = tuple(dbs.table(n) for n in names)
    config = dataclasses.replace(dbs.config, tables=tables)  # type: ignore[type-var]
    return dataclasses.replace(dbs, config=config)


def drop_databases(dbs: SourceDatabases) -> None:
    """Drop the slot and the databases so the shared server does not keep WAL for them."""
    if isinstance(dbs, MysqlDatabases):
        dbs.admin(*(f"DROP DATABASE IF EXISTS `{db}`" for db in (dbs.source_db, dbs.watermark_db)))
        return
    with psycopg.connect(dbs.pg.admin_dsn, autocommit=True) as conn:

        def released() -> bool:
            # A tailer that just closed its replication connection leaves the slot active
            # until its walsender has exited, and an active slot keeps its database.
            found = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (dbs.slot,)
            ).fetchone()
            return found is None or not found[0]

        wait_until(released, 30, f"slot {dbs.slot} released by its walsender")
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s AND NOT active",
            (dbs.slot,),
        )
        for db in (dbs.source_db, dbs.target_db):
            if db is not None:
                conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def wait_caught_up(
    dbs: SourceDatabases, timeout_s: float = 60, store: StateStore | None = None
) -> None:
    """Wait until the slot's confirmed position (on MySQL: the tailer's checkpoint in `store`)
    passes everything written until now."""
    if isinstance(dbs, MysqlDatabases):
        assert store is not None, "the MySQL tailer's progress is its checkpoint in the store"
        _wait_binlog_caught_up(dbs, store, timeout_s)
        return
    with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    end = parse_pg_lsn(row[0])

    def caught_up() -> bool:
        with psycopg.connect(dbs.source_dsn) as conn:
            found = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                (dbs.slot,),
            ).fetchone()
        return found is not None and found[0] is not None and parse_pg_lsn(found[0]) >= end

    wait_until(caught_up, timeout_s, "the tailer catching up with the source")


def _wait_binlog_caught_up(dbs: MysqlDatabases, store: StateStore, timeout_s: float) -> None:
    """The tailer checkpoints at a heartbeat just below the binlog's end (`Idle(end - 1)`)
    once everything before it is durable."""
    with (
        pymysql.connect(**{**dbs.info.connect_kwargs(), "database": dbs.source_db}) as conn,
        conn.cursor() as cursor,
    ):
        cursor.execute("SHOW MASTER STATUS")
        row = cursor.fetchone()
    assert row is not None, "the binlog is off"
    end = mysql_commit(binlog_file_number(str(row[0])), int(row[1]))
    wait_until(
        lambda: (store.tailer.load_checkpoint() or 0) >= end - 1,
        timeout_s,
        "the tailer catching up with the binlog",
    )


WRITER_PER_S = float(os.environ.get("E2E_WRITER_PER_S", "200")) or None
"""The writer's transactions a second at most (`E2E_WRITER_PER_S`; 0: as fast as it can).
Enough to keep every chunk read racing writes; unbounded, the writer takes a core of the two a
CI machine has from the tailer the test waits for."""


class Writer:
    """The write workload of e2e_writer.py, in another process; `stop()` returns its journal."""

    def __init__(
        self, dbs: SourceDatabases, work: Path, seed_value: int, per_s: float | None = WRITER_PER_S
    ) -> None:
        print(f"e2e writer: seed {seed_value}")
        self.journal = work / f"writes-{seed_value}.ndjson"
        self._stop_file = work / f"stop-writer-{seed_value}"
        env = dict(os.environ, E2E_WRITER_DSN=dbs.source_dsn)
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.e2e_writer",
                dbs.kind,
                str(seed_value),
                str(self.journal),
                str(self._stop_file),
                *([str(per_s)] if per_s else []),
            ],
            cwd=REPO,
            env=env,
        )

    def transactions(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        lines = self.journal.read_text().splitlines(keepends=True)
        return [json.loads(line) for line in lines if line.endswith("\n")]

    def wait_for(self, transactions: int, timeout_s: float = 30) -> None:
        wait_until(
            lambda: self._alive() and len(self.transactions()) >= transactions,
            timeout_s,
            f"the writer committing {transactions} transactions",
        )

    def _alive(self) -> bool:
        if self._process.poll() is not None:
            raise AssertionError(f"the writer exited with {self._process.returncode}")
        return True

    def stop(self) -> list[dict[str, Any]]:
        self._stop_file.touch()
        assert self._process.wait(30) == 0, "the writer failed"
        return self.transactions()

    def kill(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()


class FanOut(Output):
    """Writes every batch to each of several outputs, in order (a test-local output)."""

    def __init__(self, *outputs: Output) -> None:
        self._outputs = outputs

    def write(self, events: Sequence[Event], token: int) -> None:
        for output in self._outputs:
            output.write(events, token)

    def close(self) -> None:
        for output in self._outputs:
            output.close()


def write_config(
    path: Path,
    dbs: SourceDatabases,
    redis: RedisInfo,
    output: dict[str, Any],
    tailer: dict[str, Any] | None = None,
    *,
    port: int | None = None,
    password_env: str | None = None,
    source: list[str] | None = None,
) -> Path:
    """A `dblog` TOML file for this source (passwords only by environment variable name);
    `source`: its `[source]` lines but name, password_env and tables, if not `dbs`'s own."""
    lines = [
        "[source]",
        f'name = "{dbs.config.name}"',
        *(dbs.toml_source(port) if source is None else source),
        f'password_env = "{password_env or dbs.password_env}"',
        "tables = [" + ", ".join(f'"{t}"' for t in dbs.config.tables) + "]",
        "",
        "[redis]",
        f'url = "redis://{redis.host}:{redis.port}/{redis.db}"',
        f'password_env = "{REDIS_PASSWORD_ENV}"',
        "",
        "[output]",
        *(f"{k} = {json.dumps(v)}" for k, v in output.items()),
        "",
    ]
    if tailer:
        lines += ["[tailer]", *(f"{k} = {json.dumps(v)}" for k, v in tailer.items()), ""]
    path.write_text("\n".join(lines))
    return path


def cli_env(dbs: SourceDatabases, redis: RedisInfo, **extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env[dbs.password_env] = dbs.password
    env[REDIS_PASSWORD_ENV] = redis.password
    return env


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`dblog ARGS` to its end, its output captured."""
    return subprocess.run(
        [DBLOG, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


@dataclass
class TailProcess:
    """`dblog tail` as a subprocess, its stdout and stderr in one log file; with `module`,
    `python -m MODULE CONFIG OWNER` instead (e2e_tailer.py: the tailer with two outputs)."""

    config: Path
    owner: str
    env: dict[str, str]
    log: Path
    module: str | None = None
    extra: tuple[str, ...] = ()
    """More `dblog tail` options."""
    process: subprocess.Popen[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.start()

    def start(self) -> None:
        argv = [DBLOG, "tail", "--config", str(self.config), "--owner", self.owner, *self.extra]
        if self.module is not None:
            argv = [sys.executable, "-m", self.module, str(self.config), self.owner]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=REPO
            )

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def reload(self) -> None:
        """SIGHUP: `dblog tail` reads its TOML again."""
        self.process.send_signal(signal.SIGHUP)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)

    def alive(self) -> bool:
        return self.process.poll() is None


def row_key(table: str, key_values: Iterable[Any]) -> RowKey:
    return table, json.dumps(list(key_values))


def backwards(events: Iterable[Event]) -> list[str]:
    """Keys whose position goes back in output order (exact duplicates are allowed)."""
    last: dict[RowKey, Any] = {}
    problems = []
    for event in events:
        key = row_key(event.source.table, event.key.values())
        before = last.get(key)
        if before is not None and event.position < before:
            problems.append(f"{key} went from {before} back to {event.position}")
        last[key] = event.position if before is None else max(before, event.position)
    return problems


def versions_back(events: Iterable[Event]) -> list[str]:
    """Keys whose version (the writer's `VERSION_COLUMN`) goes down in output order: a row
    older than one already written, as a stale chunk row is. Positions cannot show it (a dump
    row takes its window's position) and neither can the final state when the key is written
    again later. A row without a version counts as version 0; a delete carries no row and is
    passed over (the writer stamps a row just before deleting it)."""
    highest: dict[RowKey, int] = {}
    problems = []
    for event in events:
        if event.after is None:
            continue
        key = row_key(event.source.table, event.key.values())
        version = int(event.after.get(VERSION_COLUMN) or 0)
        before = highest.get(key, 0)
        if version < before:
            problems.append(
                f"{key} went from version {before} back to {version} "
                f"({event.source.origin} event at {event.position.to_json()})"
            )
        highest[key] = max(before, version)
    return problems


def materialize(events: Iterable[Event]) -> dict[RowKey, Row]:
    """The state of every table the event stream describes, as the consumer rules
    build it: each key's last row, deletes gone; a truncate empties its table; a schema event
    drops the columns it no longer has from the table's rows and gives the rows that lack a new
    column its default."""
    state: dict[RowKey, Row] = {}
    for event in events:
        table = event.source.table
        if event.op is Op.TRUNCATE:
            state = {k: v for k, v in state.items() if k[0] != table}
        elif event.op is Op.SCHEMA:
            assert event.table_schema is not None
            columns = event.table_schema.columns
            for key in [k for k in state if k[0] == table]:
                row = state[key]
                state[key] = {
                    c.name: row[c.name] if c.name in row else constant(c.default) for c in columns
                }
        elif event.op is Op.DELETE:
            state.pop(row_key(table, event.key.values()), None)
        else:
            assert event.after is not None
            state[row_key(table, event.key.values())] = event.after
    return state


def constant(default: str | None) -> Any:
    """The JSON value of a constant PostgreSQL default as `pg_get_expr` spells it (`7`,
    `'old'::text`): the value the source gave every existing row when the column was added."""
    if default is None:
        return None
    literal = re.fullmatch(r"'((?:[^']|'')*)'::[\w ]+", default)
    if literal:
        return literal.group(1).replace("''", "'")
    if re.fullmatch(r"-?\d+", default):
        return int(default)
    raise AssertionError(f"not a constant default: {default}")


def source_state(source: Source, tables: Sequence[TableRef] | None = None) -> dict[RowKey, Row]:
    """Every row of the source (of its captured tables unless `tables`), converted as the dump
    converts it."""
    chunks = source.chunk_source()
    try:
        state = {}
        for table in source.tables if tables is None else tables:
            columns = chunks.key_columns(table)
            for row in chunks.read_chunk(Chunk(table, 0)).rows:
                state[row_key(table.name, (row[c] for c in columns))] = row
        return state
    finally:
        chunks.close()


def state_differences(expected: dict[RowKey, Row], actual: dict[RowKey, Row]) -> list[str]:
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    differ = sorted(k for k in set(expected) & set(actual) if expected[k] != actual[k])
    problems = [
        f"{len(missing)} missing (e.g. {missing[:3]})" if missing else "",
        f"{len(extra)} extra (e.g. {extra[:3]})" if extra else "",
        f"{len(differ)} differ (e.g. {[(k, expected[k], actual[k]) for k in differ[:2]]})"
        if differ
        else "",
    ]
    return [p for p in problems if p]
