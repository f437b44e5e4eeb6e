"""What the read-only and replica-read tests share: a role that may write nothing, and the
TOML of a `dblog tail` whose source reads as that role (from a replica too, if given)."""

from __future__ import annotations

import dataclasses
import os
import secrets
from pathlib import Path

import psycopg
import pymysql

from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.sources.base import SourceConfig
from tests.integration.e2e_support import MysqlDatabases, SourceDatabases
from tests.integration.e2e_support import write_config as e2e_config

RO_PASSWORD_ENV = "E2E_RO_PASSWORD"


@dataclasses.dataclass(frozen=True)
class ReadOnlyRole:
    config: SourceConfig
    toml: list[str]
    """The `[source]` lines but name, password_env and tables."""
    user: str
    dsn: str
    password: str


def read_only_role(dbs: SourceDatabases) -> ReadOnlyRole:
    """A role that reads the captured tables and the log and may write nothing, for a
    read-only source; on PostgreSQL the publication, which only the tables' owner can create,
    made by the owner."""
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


def write_config(
    path: Path,
    dbs: SourceDatabases,
    toml: list[str],
    password_env: str,
    redis: RedisInfo,
) -> Path:
    """`dblog tail`'s TOML: the `[source]` lines `toml` (but name, password_env and tables),
    NDJSON events beside `path`, a short lease."""
    output = {"type": "ndjson", "directory": str(path.parent / "events")}
    tailer = {"heartbeat_s": 0.2, "lease_ttl_ms": 2000}
    return e2e_config(path, dbs, redis, output, tailer, password_env=password_env, source=toml)
