"""A key repair of a read-only source writes nothing: run as a role with exactly the documented
read-only grants, `dblog dump --keys` emits exactly the rows of the listed keys, and the
server's own record of every statement the role ran (the tailer's and the dump's) holds no
write: on MariaDB the server_audit plugin's query log, where no statement failed either (the
MySQL-only @@GLOBAL.gtid_mode is never asked), on PostgreSQL the server log with
`log_statement = 'all'` set for that role alone."""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pymysql
import pytest

from airflow_provider_dblog.core.event import Origin
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.state import DumpState, StateStore
from tests.integration.dump.read_only_support import (
    RO_PASSWORD_ENV,
    read_only_role,
    refuses_writes,
    write_config,
)
from tests.integration.e2e_support import (
    REDIS_PASSWORD_ENV,
    SOURCES,
    MysqlDatabases,
    SourceDatabases,
    TailProcess,
    drop_databases,
    make_source,
    row_key,
    run_cli,
    source_state,
    wait_caught_up,
    wait_until,
)

pytestmark = pytest.mark.integration

ROWS = 40
READS = re.compile(
    r"\s*(?:(?:SELECT|SHOW|SET|START|BEGIN|COMMIT|ROLLBACK)\b|LOCK TABLE \S+ IN ACCESS SHARE MODE)",
    re.IGNORECASE,
)
"""The statements that write nothing: reads, the lock a read takes, session settings and
transaction control. MariaDB's audit logs each statement of an anonymous block (BEGIN NOT
ATOMIC ... END) on its own as well, so a write inside one is still seen."""


@pytest.fixture(params=SOURCES)
def dbs(request: pytest.FixtureRequest) -> Iterator[SourceDatabases]:
    databases = make_source(request, ROWS, seed_value=random.randrange(1 << 30))
    try:
        yield databases
    finally:
        drop_databases(databases)


class Audit:
    """Every statement one role runs from now on, as the server records it: (text, error
    code); PostgreSQL's log gives no error code (0)."""

    def __init__(self, dbs: SourceDatabases, user: str, directory: Path) -> None:
        self._dbs, self._user = dbs, user
        if isinstance(dbs, MysqlDatabases):
            self._file = directory / "audit.log"
            self._mariadb(
                "SET GLOBAL server_audit_logging = OFF",
                f"SET GLOBAL server_audit_file_path = '{self._file}'",
                "SET GLOBAL server_audit_events = 'QUERY'",
                f"SET GLOBAL server_audit_incl_users = '{user}'",
                "SET GLOBAL server_audit_logging = ON",
            )
            self._start = 0
        else:
            self._file = dbs.pg.log_file
            self._start = self._file.stat().st_size
            with psycopg.connect(dbs.pg.admin_dsn, autocommit=True) as conn:
                conn.execute(f"ALTER ROLE {user} SET log_statement = 'all'")

    def _mariadb(self, *statements: str) -> None:
        assert isinstance(self._dbs, MysqlDatabases)
        with (
            pymysql.connect(**self._dbs.info.admin_connect_kwargs(), autocommit=True) as conn,
            conn.cursor() as cursor,
        ):
            cursor.execute(
                "SELECT 1 FROM information_schema.PLUGINS WHERE PLUGIN_NAME = 'SERVER_AUDIT'"
            )
            if not cursor.fetchone():
                cursor.execute("INSTALL SONAME 'server_audit'")
            for statement in statements:
                cursor.execute(statement)

    def statements(self) -> list[tuple[str, int]]:
        with self._file.open("rb") as log:
            log.seek(self._start)
            text = log.read().decode(errors="replace")
        if isinstance(self._dbs, MysqlDatabases):
            # time,host,user,client,connection,query id,QUERY,database,'text',error code
            found = re.findall(
                rf"^[^,]*,[^,]*,{re.escape(self._user)},[^,]*,\d+,\d+,QUERY,[^,]*,'(.*)',(\d+)$",
                text,
                re.MULTILINE,
            )
            return [(q, int(code)) for q, code in found]
        # Only this role logs its statements, each before it runs (a refused one too); an
        # entry starts with its time, and a statement's own lines follow it.
        entries = re.split(r"^(?=\d{4}-\d\d-\d\d )", text, flags=re.MULTILINE)
        found = [
            re.search(r"LOG:  (?:statement|execute [^:]*): (.*)", e, re.DOTALL) for e in entries
        ]
        return [(m[1], 0) for m in found if m]

    def stop(self) -> None:
        if isinstance(self._dbs, MysqlDatabases):
            self._mariadb("SET GLOBAL server_audit_logging = OFF")
        else:
            with psycopg.connect(self._dbs.pg.admin_dsn, autocommit=True) as conn:
                conn.execute(f"ALTER ROLE {self._user} RESET log_statement")


def test_a_key_repair_of_a_read_only_source_writes_nothing(
    dbs: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    role = read_only_role(dbs)
    assert refuses_writes(dbs, role), "the role must have no write grant"
    config = write_config(tmp_path / "ro.toml", dbs, role.toml, RO_PASSWORD_ENV, redis_server)
    env = dict(
        os.environ, **{RO_PASSWORD_ENV: role.password, REDIS_PASSWORD_ENV: redis_server.password}
    )
    orders = dbs.table("orders")
    rows = source_state(dbs.source, [orders])
    keys = sorted(json.loads(key) for _, key in random.sample(sorted(rows), 5))
    store = StateStore(redis_server.client(), dbs.config.name)
    audit = Audit(dbs, role.user, tmp_path)
    tailer = TailProcess(config, "ro-keys", env, tmp_path / "tail.log")
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the read-only tailer leading")
        done = run_cli(
            "dump", "-c", str(config), "--table", str(orders), "--keys", json.dumps(keys),
            "--chunk-size", "2", "--dump-id", "repair", env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        wait_caught_up(dbs, store=store)
    finally:
        tailer.stop()
        audit.stop()
    status = store.dumps.status("repair")
    assert status is not None and status.state is DumpState.DONE, status
    request = store.dumps.get("repair")
    assert request is not None and request.request.read_only
    dumped = [e for e in read_events(tmp_path / "events") if e.source.origin is Origin.DUMP]
    expected = {row_key("orders", key) for key in keys}
    assert sorted(row_key(e.source.table, e.key.values()) for e in dumped) == sorted(expected)
    assert all(rows[row_key("orders", e.key.values())] == e.after for e in dumped)
    statements = audit.statements()
    assert any(orders.name in text for text, _ in statements), statements[:20]
    assert [s for s in statements if not READS.match(s[0]) or s[1]] == []
