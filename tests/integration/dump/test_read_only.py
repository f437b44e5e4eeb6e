"""Read-only sources (`[source] read_only = true`): the dump's watermarks are log positions, so
a role that may read the captured tables and the log, and write nothing at all, dumps them.

On PostgreSQL and MariaDB, under concurrent writes from another role, every table is dumped
while the tailer (`dblog tail`, a process of its own) is SIGKILLed and replaced: the windows it
armed fail and are read again, and the NDJSON replay equals the source with no time travel.
"""

from __future__ import annotations

import dataclasses
import os
import random
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pymysql
import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.sources.base import SourceConfig
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import StateStore
from tests.integration.e2e_support import (
    REDIS_PASSWORD_ENV,
    SOURCES,
    MysqlDatabases,
    SourceDatabases,
    TailProcess,
    Writer,
    backwards,
    drop_databases,
    make_source,
    materialize,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
)

pytestmark = pytest.mark.integration
RO_PASSWORD_ENV = "E2E_RO_PASSWORD"


@pytest.fixture(params=SOURCES)
def dbs(request: pytest.FixtureRequest) -> Iterator[SourceDatabases]:
    databases = make_source(request, 300, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


@dataclasses.dataclass(frozen=True)
class ReadOnlyRole:
    config: SourceConfig
    toml: list[str]
    """The `[source]` lines but name, password_env and tables."""
    user: str
    dsn: str
    password: str


def read_only_role(dbs: SourceDatabases) -> ReadOnlyRole:
    """A role that reads the captured tables and the log and may write nothing; on PostgreSQL
    the publication, which only the tables' owner can create, made by the owner."""
    user, password = f"ro_{secrets.token_hex(4)}", secrets.token_hex(12)
    os.environ[RO_PASSWORD_ENV] = password
    if isinstance(dbs, MysqlDatabases):
        dbs.admin(
            f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
            f"GRANT SELECT ON `{dbs.source_db}`.* TO '{user}'@'%'",
            f"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{user}'@'%'",
        )
        i = dbs.info
        dsn = f"mysql://{user}@{i.host}:{i.port}/{dbs.source_db}"
        toml = ['type = "mysql"', f'dsn = "{dsn}"']
    else:
        owner = dbs.pg.admin_dsn.rsplit("dbname=", 1)[0] + f"dbname={dbs.source_db}"
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {user} LOGIN REPLICATION PASSWORD '{password}'")
            conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {user}")
            tables = ", ".join(t.name for t in dbs.config.tables)
            conn.execute(f"CREATE PUBLICATION dblog FOR TABLE {tables}")  # every operation
        dsn = f"host={dbs.pg.host} port={dbs.pg.port} dbname={dbs.source_db} user={user}"
        toml = ['type = "postgres"', f'dsn = "{dsn}"', f'slot = "{dbs.slot}"']
    config = dataclasses.replace(
        dbs.config,  # type: ignore[type-var]
        dsn=dsn,
        password_env=RO_PASSWORD_ENV,
        read_only=True,
    )
    return ReadOnlyRole(config, [*toml, "read_only = true"], user, dsn, password)


def refuses_writes(dbs: SourceDatabases, role: ReadOnlyRole) -> bool:
    """The role's UPDATE of a captured table is refused for want of a grant."""
    table = dbs.config.tables[0]
    try:
        if isinstance(dbs, MysqlDatabases):
            kwargs = {**dbs.info.connect_kwargs(), "database": dbs.source_db}
            kwargs.update(user=role.user, password=role.password)
            with pymysql.connect(**kwargs) as conn, conn.cursor() as cursor:
                cursor.execute(f"UPDATE {table.name} SET id = id")
        else:
            with psycopg.connect(f"{role.dsn} password={role.password}") as conn:
                conn.execute(f"UPDATE {table} SET id = id")
    except (pymysql.err.OperationalError, psycopg.errors.InsufficientPrivilege):
        return True
    return False


def write_config(path: Path, dbs: SourceDatabases, role: ReadOnlyRole, redis: RedisInfo) -> Path:
    lines = [
        "[source]",
        f'name = "{dbs.config.name}"',
        *role.toml,
        f'password_env = "{RO_PASSWORD_ENV}"',
        "tables = [" + ", ".join(f'"{t}"' for t in dbs.config.tables) + "]",
        "",
        "[redis]",
        f'url = "redis://{redis.host}:{redis.port}/{redis.db}"',
        f'password_env = "{REDIS_PASSWORD_ENV}"',
        "",
        "[output]",
        'type = "ndjson"',
        f'directory = "{path.parent / "events"}"',
        "",
        "[tailer]",
        "heartbeat_s = 0.2",
        "lease_ttl_ms = 2000",
        "",
    ]
    path.write_text("\n".join(lines))
    return path


def test_a_read_only_role_dumps_under_writes_through_a_tailer_kill(
    dbs: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    role = read_only_role(dbs)
    assert refuses_writes(dbs, role), "the role must have no write grant"
    config = write_config(tmp_path / "ro.toml", dbs, role, redis_server)
    env = dict(
        os.environ, **{RO_PASSWORD_ENV: role.password, REDIS_PASSWORD_ENV: redis_server.password}
    )
    store = StateStore(redis_server.client(), dbs.config.name)
    tailers = [TailProcess(config, "ro-1", env, tmp_path / "tail-1.log")]
    writer: Writer | None = None
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the read-only tailer leading")
        writer = Writer(dbs, tmp_path, seed_value=random.randrange(1 << 30))
        writer.wait_for(10)
        store.dumps.create(
            DumpRequest("ro", DumpKind.ALL, dbs.tables, chunk_size=30, parallelism=2)
        )
        source = source_for(role.config)
        ended: list[str] = []
        dump = threading.Thread(
            target=lambda: ended.append(run_dump(store, source.chunk_source, "ro"))
        )
        dump.start()

        def chunks_done() -> int:
            status = store.dumps.status("ro")
            return 0 if status is None else status.chunks

        wait_until(lambda: chunks_done() >= 3, 120, "three chunks dumped")
        tailers[0].kill()
        tailers.append(TailProcess(config, "ro-2", env, tmp_path / "tail-2.log"))
        dump.join(300)
        assert ended == ["done"], f"dump ended {ended}; see {tmp_path}"
        assert writer.stop(), "the writer committed transactions"
        writer = None
        wait_caught_up(dbs, store=store)
    finally:
        if writer is not None:
            writer.stop()
        for tailer in tailers:
            tailer.stop()
    events = list(read_events(tmp_path / "events"))
    assert backwards(events) == []
    assert state_differences(source_state(dbs.source), materialize(events)) == []
    status = store.dumps.status("ro")
    assert status is not None and status.rows >= 900
