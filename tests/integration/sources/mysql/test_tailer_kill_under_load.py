"""The MariaDB tailer SIGKILLed in the middle of a large transaction while sysbench's
oltp_write_only writes: restarted, it resumes where its last durable transaction ended, and the
NDJSON replayed by the consumer rules (e2e_support's `materialize`) equals the source tables.

sysbench (Debian's package) is a load no one here wrote: transactions of an indexed update, an
update, a delete and an insert of the same key, from two threads."""

from __future__ import annotations

import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest

from airflow_provider_dblog.core.event import Origin
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.outputs.ndjson import event_files
from airflow_provider_dblog.sources.factory import parse_source_config
from airflow_provider_dblog.state import StateStore
from tests.installed import installed
from tests.integration.e2e_support import (
    MYSQL_PASSWORD_ENV,
    MysqlDatabases,
    TailProcess,
    backwards,
    cli_env,
    drop_databases,
    materialize,
    run_cli,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

SYSBENCH_TABLES = 2
SYSBENCH_ROWS = 1000
BULK_TABLE = "bulk_rows"
BULK_ROWS = 30_000
"""One transaction of this many inserts: the tailer is killed after its first rows are durable,
long before its last are (the tailer writes at most 2000 events a batch)."""


def sysbench() -> str:
    found = shutil.which("sysbench")
    if found is None:
        raise FileNotFoundError("sysbench not found: run scripts/install-system-deps.sh")
    return found


@pytest.fixture
def dbs(mariadb: MariaDBInfo, monkeypatch: pytest.MonkeyPatch) -> Iterator[MysqlDatabases]:
    """A private source database for sysbench's tables and the bulk table, its own watermark
    database, and a source capturing the three tables (its password in the environment)."""
    monkeypatch.setenv(MYSQL_PASSWORD_ENV, mariadb.password)
    source_db = f"sysbench_{secrets.token_hex(4)}"
    tables = [*(f"sbtest{n}" for n in range(1, SYSBENCH_TABLES + 1)), BULK_TABLE]
    config = parse_source_config(
        {
            "type": "mysql",
            "name": source_db,
            "dsn": f"mysql://{mariadb.user}@{mariadb.host}:{mariadb.port}/{source_db}",
            "tables": [f"{source_db}.{table}" for table in tables],
            "password_env": MYSQL_PASSWORD_ENV,
            "watermark_database": source_db + "_wm",
        }
    )
    databases = MysqlDatabases(mariadb, source_db, config)
    databases.admin(
        *(
            statement
            for db in (source_db, databases.watermark_db)
            for statement in (
                f"CREATE DATABASE `{db}`",
                f"GRANT ALL ON `{db}`.* TO '{mariadb.user}'@'%'",
            )
        )
    )
    yield databases
    drop_databases(databases)


class Sysbench:
    """sysbench oltp_write_only on the private database, its options (the password among
    them) in a file only this user reads."""

    def __init__(self, dbs: MysqlDatabases, work: Path) -> None:
        self.binary = installed(sysbench)
        info = dbs.info
        self.options = work / "sysbench.cfg"
        self.options.touch(mode=0o600)
        self.options.write_text(
            "db-driver=mysql\n"
            f"mysql-host={info.host}\nmysql-port={info.port}\nmysql-user={info.user}\n"
            f"mysql-password={info.password}\nmysql-db={dbs.source_db}\n"
        )
        self.log = work / "sysbench.log"

    def command(self, *args: str) -> list[str]:
        return [
            self.binary,
            f"--config-file={self.options}",
            "oltp_write_only",
            f"--tables={SYSBENCH_TABLES}",
            f"--table-size={SYSBENCH_ROWS}",
            *args,
        ]

    def prepare(self) -> None:
        done = subprocess.run(self.command("prepare"), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr

    def start(self) -> subprocess.Popen[bytes]:
        """Two threads at 100 transactions/s for up to five minutes (stopped before)."""
        with self.log.open("ab") as out:
            return subprocess.Popen(
                self.command("--threads=2", "--rate=100", "--time=300", "run"),
                stdout=out,
                stderr=subprocess.STDOUT,
            )


class MarkedLines:
    """Counts the complete NDJSON lines that contain `marker`, reading only what was appended
    since the last count (the test polls it while the tailer writes)."""

    def __init__(self, directory: Path, marker: bytes) -> None:
        self.directory, self.marker = directory, marker
        self.offsets: dict[Path, int] = {}
        self.count = 0

    def __call__(self) -> int:
        for path in event_files(self.directory):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            complete = data.rfind(b"\n") + 1
            self.count += data[:complete].count(self.marker)
            self.offsets[path] = self.offsets.get(path, 0) + complete
        return self.count


def test_tailer_killed_mid_transaction_under_sysbench_replays_to_the_source(
    dbs: MysqlDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    load = Sysbench(dbs, tmp_path)
    load.prepare()
    with (
        pymysql.connect(**{**dbs.info.connect_kwargs(), "database": dbs.source_db}) as conn,
        conn.cursor() as cursor,
    ):
        cursor.execute(f"CREATE TABLE {BULK_TABLE} (id int PRIMARY KEY, n int, note varchar(80))")
    events_dir = tmp_path / "events"
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(events_dir)},
        {"lease_ttl_ms": 2000, "heartbeat_s": 0.2, "window_ttl_s": 30, "reconnect_max_s": 2},
    )
    env = cli_env(dbs, redis_server)
    store = StateStore(redis_server.client(), dbs.config.name)
    tail = TailProcess(config, "tailer", env, tmp_path / "tail.log")
    writes: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the tailer's first beat")
        # The rows sysbench prepared came before capture: a dump brings them.
        dumped = run_cli("dump", "--config", str(config), "--dump-id", "initial", env=env)
        assert dumped.returncode == 0, dumped.stdout + dumped.stderr
        writes = load.start()
        bulk = MarkedLines(events_dir, f'"{BULK_TABLE}"'.encode())
        with (
            pymysql.connect(**{**dbs.info.connect_kwargs(), "database": dbs.source_db}) as conn,
            conn.cursor() as cursor,
        ):
            cursor.execute(
                f"INSERT INTO {BULK_TABLE} SELECT seq, seq % 1000, 'a note of some length'"
                f" FROM seq_1_to_{BULK_ROWS}"
            )
            conn.commit()
        # Polled often: a fast reader and writer get through the transaction in a few batches.
        wait_until(lambda: bulk() > 0, 120, "the bulk transaction's first rows", interval_s=0.002)
        tail.kill()
        durable = sum(1 for e in read_events(events_dir) if e.source.table == BULK_TABLE)
        print(f"the tailer killed after {durable} of {BULK_ROWS} bulk rows were durable")
        assert 0 < durable < BULK_ROWS, f"killed after {durable} of {BULK_ROWS} bulk rows"

        tail.start()
        wait_until(
            lambda: writes is not None and writes.poll() is None and bulk() > durable,
            120,
            "the restarted tailer writing the bulk transaction again while sysbench writes",
        )
        writes.send_signal(signal.SIGTERM)  # the server rolls back what it had open
        writes.wait(30)
        wait_caught_up(dbs, timeout_s=180, store=store)
        assert tail.stop() == 0, (tmp_path / "tail.log").read_text()[-3000:]
    finally:
        if writes is not None and writes.poll() is None:
            writes.kill()
            writes.wait()
        if tail.alive():
            tail.kill()

    events = list(read_events(events_dir))
    logged = sum(
        1 for e in events if e.source.origin is Origin.LOG and e.source.table != BULK_TABLE
    )
    assert logged > 0, "sysbench's changes reached the output through the log"
    assert backwards(events) == []
    assert state_differences(source_state(dbs.source), materialize(events)) == []
    assert dbs.password not in (tmp_path / "tail.log").read_text()
