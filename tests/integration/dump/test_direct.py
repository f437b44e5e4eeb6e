"""Direct dumps on real servers: `dblog dump --mode direct` into a SQL target under a write
workload and a tailer kill ends equal to the source with no dump row through the tailer; and the
race the tombstones exist for: a delete after hw reaches the target before the dump's rows."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from airflow_provider_dblog.core.direct import DirectRecord, DumpMode
from airflow_provider_dblog.core.event import Event, Op, Origin, PlainEvent, SourceInfo, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import Window
from airflow_provider_dblog.demo.postgres import compare
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs.sql_apply import SqlApplyOutput, SqlDirectTarget
from airflow_provider_dblog.outputs.sql_apply.statements import POSITIONS_TABLE
from airflow_provider_dblog.state import StateStore
from tests.integration.e2e_support import (
    DBLOG,
    Databases,
    TailProcess,
    Writer,
    cli_env,
    drop_databases,
    make_databases,
    run_cli,
    wait_caught_up,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration
ROWS = 1500
TARGET_DSN_ENV = "E2E_TARGET_DSN"


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, ROWS, target=True, seed_value=13)
    yield databases
    drop_databases(databases)


def test_a_direct_dump_under_writes_and_a_tailer_kill_equals_the_source(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """The seeded rows reach the SQL target only through the dump, which writes them itself;
    the tailer is SIGKILLed mid-dump and started again (its open windows fail, their chunks are
    retried). At the end the target equals the source, the dump wrote rows per table, and the
    tailer emitted no dump row."""
    output = {"type": "sql_apply", "dsn_env": TARGET_DSN_ENV, "monotonic": True}
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        output,
        {"heartbeat_s": 0.2, "window_ttl_s": 30, "lease_ttl_ms": 3000},
    )
    env = cli_env(dbs, redis_server, **{TARGET_DSN_ENV: dbs.target_dsn})
    store = StateStore(redis_server.client(), dbs.config.name)
    tail = TailProcess(config, "direct-tailer", env, tmp_path / "tail.log")
    writer = Writer(dbs, tmp_path, seed_value=7)
    dump: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: store.tailer.health() is not None, 30, "the tailer beating")
        writer.wait_for(20)
        with (tmp_path / "dump.log").open("ab") as out:
            dump = subprocess.Popen(
                [
                    *(DBLOG, "dump", "-c", str(config), "--dump-id", "direct", "--mode", "direct"),
                    *("--chunk-size", "100", "--parallelism", "2", "--max-rows-per-s", "1500"),
                    *("--window-timeout", "30"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        chunks = lambda: (s := store.dumps.status("direct")) is not None and s.chunks  # noqa: E731
        wait_until(lambda: chunks() >= 4, 60, "four chunks written")
        tail.kill()
        tail.start()
        wait_until(lambda: chunks() >= 10, 60, "chunks after the tailer's restart")
        store.dumps.throttle("direct", max_rows_per_s=0)
        assert dump.wait(120) == 0, (tmp_path / "dump.log").read_text()[-3000:]
        writer.stop()
        wait_caught_up(dbs)
        assert compare(dbs.source_dsn, dbs.target_dsn) == []
        progress = store.dumps.load_progress("direct")
        assert all(p.done and 0 < p.rows_written <= p.rows_done for p in progress.values())
        health = store.tailer.health()
        assert health is not None and health.metrics["dump_rows"] == 0, health.metrics
        stored = store.dumps.get("direct")
        assert stored is not None and stored.request.mode is DumpMode.DIRECT
        assert store.directs.pending() == {}
    finally:
        writer.kill()
        if dump is not None and dump.poll() is None:
            dump.kill()
        if tail.alive():
            tail.kill()


def test_a_direct_dump_is_refused_where_the_output_is_a_stream(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    output = {"type": "ndjson", "directory": str(tmp_path / "events")}
    config = write_config(tmp_path / "dblog.toml", dbs, redis_server, output)
    done = run_cli("dump", "-c", str(config), "--mode", "direct", env=cli_env(dbs, redis_server))
    assert done.returncode == 2, done.stderr
    assert "a stream that must carry the rows in order" in done.stderr
    assert "'sequenced'" in done.stderr


def test_a_delete_after_hw_that_lands_first_keeps_the_dumped_row_out(
    dbs: Databases, redis_server: RedisInfo
) -> None:
    """The race tombstones exist for. A chunk read account 1; the tailer recorded its window
    (lw 100, hw 200); account 1 is deleted at 300 and that delete reaches the target before the
    dump's rows. The row positioned after hw must not come back, and the tombstone must stay
    while the window is pending; once it committed, the horizon (the checkpoint, 400) passes the
    delete and pruning forgets it."""
    table = TableRef("public", "accounts")
    store = StateStore(redis_server.client(), dbs.config.name)
    token = store.tailer.acquire_lease("race", 60_000)
    assert token is not None
    window = Window("w-race", "race", table, DumpMode.DIRECT)
    store.windows.register(window, "lw-race", "hw-race", {}, 600)
    assert store.windows.open(window.window_id, token)
    record = DirectRecord(window.window_id, Position(100, 0), Position(200, 0), frozenset())
    assert store.directs.record(record, token)
    store.tailer.save_checkpoint(400, token)

    name = dbs.config.name
    row = {"id": 1, "owner": "one", "balance": "1.00", "active": True, "e2e_version": 0}
    deleted = PlainEvent(
        Op.DELETE,
        {"id": 1},
        row,
        None,
        SourceInfo(name, "db", "public", "accounts", Position(300, 1), Origin.LOG),
        0,
    )
    with SqlApplyOutput(dbs.target_dsn, monotonic=True) as output:
        created = PlainEvent(
            Op.CREATE,
            {"id": 1},
            None,
            row,
            SourceInfo(name, "db", "public", "accounts", Position(50, 1), Origin.LOG),
            0,
        )
        output.write([created, deleted], token)

    target = SqlDirectTarget(dbs.target_dsn, name)
    try:
        handle = target.stage(table, [row])
        assert target.commit(table, [handle], record, ("id",)) == 0, "older than the delete"
        assert accounts(dbs) == []
        horizon = store.directs.horizon()
        assert horizon == Position(100, 0)
        assert target.prune_tombstones(table, horizon) == 0, "the window is pending"
        assert tombstones(dbs) == [{"id": 1}]

        store.directs.committed(window.window_id)
        horizon = store.directs.horizon()
        assert horizon == Position(400, 0)
        assert target.prune_tombstones(table, horizon) == 1
        assert tombstones(dbs) == []
        # Pruned too early, the same row would have come back: the tombstone was all that
        # kept it out.
        handle = target.stage(table, [row])
        assert target.commit(table, [handle], record, ("id",)) == 1
        assert accounts(dbs) == [1]
    finally:
        target.close()


def test_dblog_prune_forgets_the_tombstones_before_the_horizon(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """Deletes keep leaving tombstones between dumps; `dblog prune` forgets those before the
    horizon (here the checkpoint, 400: no direct window is pending) and keeps the newer one."""
    store = StateStore(redis_server.client(), dbs.config.name)
    token = store.tailer.acquire_lease("prune", 60_000)
    assert token is not None
    store.tailer.save_checkpoint(400, token)
    name = dbs.config.name

    def event(op: Op, key: int, commit: int) -> Event:
        row = {"id": key, "owner": "o", "balance": "1.00", "active": True, "e2e_version": 0}
        before, after = (row, None) if op is Op.DELETE else (None, row)
        where = SourceInfo(name, "db", "public", "accounts", Position(commit, 1), Origin.LOG)
        return PlainEvent(op, {"id": key}, before, after, where, 0)

    with SqlApplyOutput(dbs.target_dsn, monotonic=True) as output:
        events = [event(Op.CREATE, 1, 50), event(Op.CREATE, 2, 60)]
        output.write([*events, event(Op.DELETE, 1, 300), event(Op.DELETE, 2, 500)], token)
    assert tombstones(dbs) == [{"id": 1}, {"id": 2}]
    output_config = {"type": "sql_apply", "dsn_env": TARGET_DSN_ENV, "monotonic": True}
    config = write_config(tmp_path / "dblog.toml", dbs, redis_server, output_config)
    env = cli_env(dbs, redis_server, **{TARGET_DSN_ENV: dbs.target_dsn})
    done = run_cli("prune", "-c", str(config), env=env)
    assert done.returncode == 0, done.stderr
    assert "public.accounts: 1 tombstones before [400, 0] pruned" in done.stdout
    assert tombstones(dbs) == [{"id": 2}]


def accounts(dbs: Databases) -> list[int]:
    with psycopg.connect(dbs.target_dsn) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM accounts ORDER BY id")]


def tombstones(dbs: Databases) -> list[object]:
    with psycopg.connect(dbs.target_dsn) as conn:
        query = f"SELECT key FROM {POSITIONS_TABLE} WHERE deleted ORDER BY key"
        return [r[0] for r in conn.execute(query)]
