"""`dblog verify` of a MariaDB source on real servers: its tailer applying into a PostgreSQL SQL
target (the tables in PostgreSQL's types: numeric, timestamp, jsonb, bytea keys), a writer
writing all along. The target's rows are read back as the source's converters give them, so the
rows the output applied hash as the source's; the target is corrupted behind the tailer's back
(a row changed, one deleted, one added, a composite-keyed row changed) and the report names
exactly those keys, none of the keys the writer keeps changing. Written watermarks, and a
read-only source whose watermarks are binlog positions."""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pymysql
import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.verify import Difference
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import VerifyState
from tests.integration.e2e_support import (
    MysqlDatabases,
    drop_databases,
    make_mysql_databases,
    run_cli,
    wait_until,
)
from tests.integration.verify.deployment import Deployment, running_deployment

pytestmark = pytest.mark.integration
ROWS = 300
OWN_ACCOUNTS = (100_001, 100_002, 100_003)
"""Keys the writer never touches (its accounts are 1-1500, its regions eu, us, ap, sa): the
corruptions stay as made while it writes."""
TARGET_SCHEMA = """
CREATE TABLE {s}.accounts (id bigint PRIMARY KEY, owner varchar(100) NOT NULL,
    balance numeric(12,2), active smallint, updated timestamp(6), e2e_version bigint);
CREATE TABLE {s}.orders (region varchar(8), n int, amount numeric(14,2), note varchar(200),
    tags jsonb, e2e_version bigint, PRIMARY KEY (region, n));
CREATE TABLE {s}.items (id bytea PRIMARY KEY, name varchar(100), attrs jsonb, data bytea,
    e2e_version bigint);
"""
"""The demo's MariaDB tables in PostgreSQL's types, in a schema named as the source database
(the SQL-apply output's default table map)."""


@dataclass
class Target:
    pg: PostgresInfo
    db: str
    schema: str

    @property
    def dsn(self) -> str:
        return self.pg.dsn.rsplit("/", 1)[0] + "/" + self.db


@pytest.fixture
def dbs(mariadb: MariaDBInfo) -> Iterator[MysqlDatabases]:
    databases = make_mysql_databases(mariadb, ROWS, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


@pytest.fixture
def target(pg15: PostgresInfo, dbs: MysqlDatabases) -> Iterator[Target]:
    """An empty PostgreSQL target database holding the source's tables."""
    found = Target(pg15, f"e2e_tgt_{secrets.token_hex(4)}", dbs.source_db)
    with psycopg.connect(pg15.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {found.db} OWNER {pg15.user}")
    with psycopg.connect(found.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{found.schema}"')
        conn.execute(TARGET_SCHEMA.format(s=f'"{found.schema}"'))
    yield found
    with psycopg.connect(pg15.admin_dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {found.db} WITH (FORCE)")


@pytest.fixture(params=["written", "read-only"])
def deployment(
    request: pytest.FixtureRequest,
    dbs: MysqlDatabases,
    target: Target,
    redis_server: RedisInfo,
    tmp_path: Path,
) -> Iterator[Deployment]:
    with running_deployment(
        dbs, redis_server, tmp_path, target.dsn, read_only=request.param == "read-only"
    ) as deployment:
        yield deployment


def corrupt_target(
    dbs: MysqlDatabases, target: Target
) -> list[tuple[TableRef, Difference, tuple[object, ...]]]:
    """Rows of keys the writer never touches, written to the source, applied to the target,
    then corrupted there; the corruptions, sorted."""
    with (
        pymysql.connect(**{**dbs.info.connect_kwargs(), "database": dbs.source_db}) as source,
        source.cursor() as cursor,
    ):
        cursor.executemany(
            "INSERT INTO accounts (id, owner, balance, active) VALUES (%s, 'own', 1, true)",
            [(key,) for key in OWN_ACCOUNTS],
        )
        cursor.execute(
            "INSERT INTO orders (region, n, amount, tags) VALUES "
            "('zz', 1, 5, '[\"a\"]'), ('zz', 2, 6, '{\"b\": 1}')"
        )
        source.commit()
    s = f'"{target.schema}"'
    with psycopg.connect(target.dsn, autocommit=True) as conn:

        def applied() -> bool:
            found = conn.execute(
                f"SELECT (SELECT count(*) FROM {s}.accounts WHERE id > 100000) + "
                f"(SELECT count(*) FROM {s}.orders WHERE region = 'zz')"
            ).fetchone()
            return found is not None and found[0] == 5

        wait_until(applied, 60, "the rows written for the test applied to the target")
        conn.execute(f"UPDATE {s}.accounts SET owner = 'corrupt' WHERE id = 100001")
        conn.execute(f"DELETE FROM {s}.accounts WHERE id = 100002")
        conn.execute(
            f"INSERT INTO {s}.accounts (id, owner, balance, active) VALUES (100010, 'x', 0, 0)"
        )
        conn.execute(f"UPDATE {s}.orders SET tags = '[\"b\"]' WHERE region = 'zz' AND n = 1")
    accounts, orders = dbs.table("accounts"), dbs.table("orders")
    return sorted(
        [
            (accounts, Difference.CHANGED, (100_001,)),
            (accounts, Difference.MISSING, (100_002,)),
            (accounts, Difference.EXTRA, (100_010,)),
            (orders, Difference.CHANGED, ("zz", 1)),
        ],
        key=repr,
    )


def test_the_report_names_exactly_the_corrupted_keys_while_writes_go_on(
    dbs: MysqlDatabases, target: Target, deployment: Deployment
) -> None:
    config, env, store, writer = deployment
    corrupted = corrupt_target(dbs, target)
    written = len(writer.transactions())

    done = run_cli(
        *("verify", "-c", str(config), "--verify-id", "m1", "--chunk-size", "120"), env=env
    )

    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert len(writer.transactions()) > written, "the writer wrote while verify ran"
    found = [(d.table, d.kind, d.key) for d in store.verifies.differences("m1")]
    assert sorted(found, key=repr) == corrupted
    accounts = dbs.table("accounts")
    for line in (f"{accounts} changed [100001]", f"{dbs.table('orders')} changed ['zz', 1]"):
        assert line in done.stdout, done.stdout
    status = store.verifies.status("m1")
    assert status is not None and status.state is VerifyState.DONE
    counts = store.verifies.counts("m1")
    assert sum(c["checked"] + c["in_flux"] for c in counts.values()) >= 3 * ROWS
    assert all(c["checked"] > 0 for c in counts.values()), counts

    listed = run_cli(
        *("verify", "-c", str(config), "--table", str(accounts)),
        *("--keys", "100001,100002,100003,100010"),
        env=env,
    )
    assert listed.returncode == 1, listed.stdout + listed.stderr[-3000:]
    for line in ("changed [100001]", "missing [100002]", "extra [100010]"):
        assert f"{accounts} {line}" in listed.stdout, listed.stdout
