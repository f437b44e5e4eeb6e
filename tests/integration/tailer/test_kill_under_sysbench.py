"""The PostgreSQL tailer (`dblog tail`, NDJSON) SIGKILLed three times at random moments while
sysbench's oltp_write_only writes and a dump copies its tables, and started again each time:
after the load, caught up and stopped, the dump is done, the NDJSON replayed by the consumer
rules (e2e_support's `materialize`) equals the source tables, no key's position goes back, and
no log holds a traceback. A change may be written twice across a kill (at-least-once); none is
lost.

sysbench (Debian's package, installed by scripts/install-system-deps.sh; the test fails without
it) is a load no one here wrote: transactions of an indexed update, an update, a delete and an
insert of the same key, from three threads at a rate a loaded two-core machine holds. Its tables
are prepared before capture starts: the dump brings their rows, its first kill at a random chunk.
A restarted tailer takes its lease over after `lease_ttl_ms`, kept short here."""

from __future__ import annotations

import random
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import psycopg
import pytest

from airflow_provider_dblog.core.event import Origin
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.outputs.ndjson import event_files
from airflow_provider_dblog.sources.factory import parse_source_config
from airflow_provider_dblog.state import StateStore
from tests.deadlines import deadline_s
from tests.integration.e2e_support import (
    DBLOG,
    PASSWORD_ENV,
    Databases,
    TailProcess,
    backwards,
    cli_env,
    drop_databases,
    materialize,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

SYSBENCH_TABLES = 2
SYSBENCH_ROWS = 2000
KILLS = 3
DUMP = "under-load"
LOG_EVENT = b'"origin":"log"'
"""In every NDJSON line of a change read from the log (dumped rows say `"dump"`)."""


def sysbench() -> str:
    """The sysbench program: the test fails, never skips, without it (setup installs it)."""
    found = shutil.which("sysbench")
    if found is None:
        pytest.fail("sysbench not found: run scripts/setup.sh (scripts/install-system-deps.sh)")
    return found


@pytest.fixture
def dbs(pg15: PostgresInfo, monkeypatch: pytest.MonkeyPatch) -> Iterator[Databases]:
    """A private source database for sysbench's tables, its own slot, and a source capturing
    them (its password in the environment)."""
    monkeypatch.setenv(PASSWORD_ENV, pg15.password)
    suffix = secrets.token_hex(4)
    source_db = f"sysbench_{suffix}"
    with psycopg.connect(pg15.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {source_db} OWNER {pg15.user}")
    config = parse_source_config(
        {
            "type": "postgres",
            "name": source_db,
            "dsn": f"host={pg15.host} port={pg15.port} dbname={source_db} user={pg15.user}",
            "tables": [f"public.sbtest{n}" for n in range(1, SYSBENCH_TABLES + 1)],
            "password_env": PASSWORD_ENV,
            "slot": source_db,
        }
    )
    databases = Databases(pg15, source_db, None, config, slot=source_db)
    yield databases
    drop_databases(databases)


class Sysbench:
    """sysbench oltp_write_only on the private database, its options (the password among
    them) in a file only this user reads: never on a command line."""

    def __init__(self, dbs: Databases, work: Path) -> None:
        self.binary = sysbench()
        pg = dbs.pg
        self.options = work / "sysbench.cfg"
        self.options.touch(mode=0o600)
        self.options.write_text(
            "db-driver=pgsql\n"
            f"pgsql-host={pg.host}\npgsql-port={pg.port}\npgsql-user={pg.user}\n"
            f"pgsql-password={pg.password}\npgsql-db={dbs.source_db}\n"
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
        """Three threads at 300 transactions/s for up to ten minutes (stopped before)."""
        with self.log.open("ab") as out:
            return subprocess.Popen(
                self.command("--threads=3", "--rate=300", "--time=600", "run"),
                stdout=out,
                stderr=subprocess.STDOUT,
            )


class LogLines:
    """Counts the complete NDJSON lines of changes read from the log, reading only what was
    appended since the last count (the test polls it while the tailer writes)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.offsets: dict[Path, int] = {}
        self.count = 0

    def __call__(self) -> int:
        for path in event_files(self.directory):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            complete = data.rfind(b"\n") + 1
            self.count += data[:complete].count(LOG_EVENT)
            self.offsets[path] = self.offsets.get(path, 0) + complete
        return self.count


def test_tailer_killed_again_and_again_under_sysbench_replays_to_the_source(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    load = Sysbench(dbs, tmp_path)
    load.prepare()
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
    tail_log, dump_log = tmp_path / "tail.log", tmp_path / "dump.log"
    tail = TailProcess(config, "tailer", env, tail_log)
    logged = LogLines(events_dir)
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    print(f"kill moments: seed {seed}")
    rng.seed(seed)
    writes: subprocess.Popen[bytes] | None = None
    dump: subprocess.Popen[bytes] | None = None
    kills: list[tuple[int, int]] = []
    """(log lines durable at the start before the kill, at the kill) for each kill."""
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the tailer's first beat")
        writes = load.start()
        # The rows sysbench prepared came before capture: a dump under the load and the kills
        # brings them (a chunk whose window a kill cut short is read again).
        with dump_log.open("wb") as out:
            dump = subprocess.Popen(
                [DBLOG, "dump", "--config", str(config), "--dump-id", DUMP,
                 "--chunk-size", "100", "--window-timeout", "30"],
                stdout=subprocess.DEVNULL,
                stderr=out,
                env=env,
            )  # fmt: skip

        def killable(target: int, chunks: int) -> bool:
            """`target` log lines durable and the dump `chunks` chunks in; all running."""
            assert writes is not None and writes.poll() is None, load.log.read_text()[-2000:]
            assert tail.alive(), tail_log.read_text()[-3000:]
            status = store.dumps.status(DUMP)
            return logged() >= target and status is not None and status.chunks >= chunks

        for kill in range(KILLS):
            # The first kill at a random chunk of the dump (of its 40), the others at a random
            # number of changes from the log made durable since the tailer started.
            started_at = logged()
            target = started_at + (rng.randrange(1, 200) if kill == 0 else rng.randrange(50, 1500))
            chunks = rng.randrange(1, 20) if kill == 0 else 0
            wait_until(partial(killable, target, chunks), 120, f"{target} log lines durable")
            tail.kill()
            kills.append((started_at, logged()))
            print(f"killed; the dump {'running' if dump.poll() is None else 'done'}")
            tail.start()
        last_start = logged()
        wait_until(partial(killable, last_start + 1, 0), 120, "the last tailer writing the load")
        assert dump.wait(deadline_s(120)) == 0, dump_log.read_text()[-3000:]
        writes.send_signal(signal.SIGTERM)  # the server rolls back what it had open
        writes.wait(30)
        wait_caught_up(dbs, timeout_s=120)
        assert tail.stop() == 0, tail_log.read_text()[-3000:]
    finally:
        for process in (writes, dump):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        if tail.alive():
            tail.kill()

    print(f"log lines durable at each start and kill: {kills}")
    assert len(kills) == KILLS and all(before < at for before, at in kills), kills
    logs = tail_log.read_text() + dump_log.read_text()
    assert "Traceback" not in logs, logs[-5000:]
    assert dbs.password not in logs
    status = store.dumps.status(DUMP)
    assert status is not None and status.state == "done", status
    print(f"the dump: {status.chunks} chunks, {status.windows_retried} windows read again")
    events = list(read_events(events_dir))
    from_log = sum(1 for e in events if e.source.origin is Origin.LOG)
    assert from_log > kills[-1][1], "sysbench's changes reached the output through the log"
    assert backwards(events) == []
    assert state_differences(source_state(dbs.source), materialize(events)) == []
