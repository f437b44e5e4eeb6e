"""The PostgreSQL tailer follows tables written by sysbench's oltp_write_only (a load generator
no one here wrote: an indexed update, an update, a delete and an insert a transaction) while a
dump copies them, and is killed (SIGKILL) and started again three times at random moments of
the load. Nothing is lost: after the load, the NDJSON replayed equals the source (a change may
come twice after a kill: at-least-once), and no log holds a traceback."""

from __future__ import annotations

import dataclasses
import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.state import StateStore
from tests.integration.e2e_support import (
    DBLOG,
    Databases,
    TailProcess,
    cli_env,
    drop_databases,
    make_databases,
    materialize,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration
TABLES = 2
TABLE_SIZE = 2000
KILLS = 3


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, 0, target=False, seed_value=random.randrange(1 << 30))
    captured = tuple(TableRef("public", f"sbtest{i}") for i in range(1, TABLES + 1))
    config = dataclasses.replace(databases.config, tables=captured)
    yield dataclasses.replace(databases, config=config)
    drop_databases(databases)


def sysbench(options: Path, action: str, *more: str) -> list[str]:
    binary = shutil.which("sysbench")
    assert binary is not None, "sysbench is not installed: run scripts/setup.sh"
    return [
        binary,
        f"--config-file={options}",  # the password is in it, never on the command line
        "oltp_write_only",
        f"--tables={TABLES}",
        f"--table-size={TABLE_SIZE}",
        *more,
        action,
    ]


def durable_lines(events: Path) -> int:
    return sum(path.read_bytes().count(b"\n") for path in events.glob("*.ndjson"))


def test_a_tailer_killed_under_sysbench_loses_nothing(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    options = tmp_path / "sysbench.cfg"
    options.touch(mode=0o600)
    pg = dbs.pg
    options.write_text(
        f"db-driver=pgsql\npgsql-host={pg.host}\npgsql-port={pg.port}\npgsql-user={pg.user}\n"
        f"pgsql-password={pg.password}\npgsql-db={dbs.source_db}\n"
    )
    subprocess.run(sysbench(options, "prepare"), check=True, capture_output=True, timeout=300)

    events = tmp_path / "events"
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(events)},
        {"heartbeat_s": 0.2, "window_ttl_s": 60},
    )
    env = cli_env(dbs, redis_server)
    store = StateStore(redis_server.client(), dbs.config.name)
    tail_log, dump_log, load_log = (tmp_path / f"{n}.log" for n in ("tail", "dump", "load"))
    tail = TailProcess(config, "tailer", env, tail_log)
    load: subprocess.Popen[bytes] | None = None
    dump: subprocess.Popen[bytes] | None = None
    rng = random.Random()
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the tailer's first heartbeat")
        with load_log.open("wb") as out:
            load = subprocess.Popen(
                sysbench(options, "run", "--threads=2", "--rate=200", "--time=900"),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        with dump_log.open("wb") as out:
            dump = subprocess.Popen(
                [DBLOG, "dump", "-c", str(config), "--dump-id", "under-load",
                 "--chunk-size", "500", "--window-timeout", "30"],
                stdout=subprocess.DEVNULL,
                stderr=out,
                env=env,
            )  # fmt: skip
        for _ in range(KILLS):
            # A random share of the load's changes made durable since the last start, then
            # a kill in the middle of whatever the tailer is doing.
            target = durable_lines(events) + rng.randrange(200, 2000)

            def written_on(target: int = target) -> bool:
                assert load is not None and load.poll() is None, load_log.read_text()[-2000:]
                assert tail.alive(), tail_log.read_text()[-3000:]
                return durable_lines(events) >= target

            wait_until(written_on, 120, f"{target} lines durable")
            tail.kill()
            tail.start()
        assert dump.wait(600) == 0, dump_log.read_text()[-3000:]
        load.terminate()
        load.wait(30)
        wait_caught_up(dbs, timeout_s=120)
        assert tail.stop() == 0, tail_log.read_text()[-3000:]
    finally:
        for process in (load, dump):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(30)
        if tail.alive():
            tail.kill()

    logs = tail_log.read_text() + dump_log.read_text()
    assert "Traceback" not in logs, logs[-5000:]
    status = store.dumps.status("under-load")
    assert status is not None and status.state == "done", status
    replayed = materialize(read_events(events))
    assert len(replayed) >= TABLES * TABLE_SIZE // 2
    assert state_differences(source_state(dbs.source), replayed) == []
