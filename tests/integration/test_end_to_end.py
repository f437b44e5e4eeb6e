"""DBLog end to end on real PostgreSQL or MariaDB, and Redis: tailer, dumps under writes from
another process, crashes, a Redis restart, TRUNCATE and ALTER TABLE, repair, lease takeover and
command-line errors.

The tests parametrized by `source` (convergence under writes during a dump, the tailer SIGKILLed
and restarted, a repair of given keys, standby takeover) run once on PostgreSQL 15 and once on
MariaDB through the same body (e2e_support's source kit). What they check on each:

- the NDJSON output, on both: it rebuilds the source's rows (`materialize` against
  `source_state`, the source read back through its own chunk reader), holds every change the
  writer committed, and never takes a key back to an older position or version;
- the SQL target, on PostgreSQL only (the SQL-apply output writes PostgreSQL): equal to the
  source row for row, and after a repair, exactly the listed keys fixed. On MariaDB the repair is
  checked in the NDJSON instead: the repair dumps emit exactly the listed keys' rows.

The others are about PostgreSQL (pgoutput's Relation messages, its DDL defaults, libpq's
errors) and run on it alone. Every test gets its own source database, slot or watermark
database, and source name on the shared servers, so the tests are independent of each other and
of concurrent sessions. Waiting is always on a condition with a deadline.
"""

from __future__ import annotations

import json
import random
import secrets
import threading
import traceback
from collections.abc import Callable, Iterator
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.event import Event, Op, Origin, TableRef
from airflow_provider_dblog.core.schema import Column
from airflow_provider_dblog.demo.postgres import compare, snapshot
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.process import free_port
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs import NdjsonOutput, Output, SqlApplyOutput, read_events
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer, TailerSettings
from tests.integration.e2e_support import (
    PASSWORD_ENV,
    SOURCES,
    VERSION_COLUMN,
    Databases,
    FanOut,
    SourceDatabases,
    TailProcess,
    Writer,
    backwards,
    cli_env,
    drop_databases,
    make_databases,
    make_source,
    materialize,
    row_key,
    run_cli,
    source_state,
    state_differences,
    versions_back,
    wait_caught_up,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration
LEASE_TTL_MS = 2000


def holder(store: StateStore, redis: RedisInfo) -> str | None:
    """The owner of the tailer lease now, or None."""
    owner = redis.client().hget(store.tailer.keys.tailer_lease, "owner")
    return None if owner is None else owner.decode() if isinstance(owner, bytes) else str(owner)


def leading(store: StateStore, redis: RedisInfo, owner: str) -> bool:
    """`owner` holds the lease and has beaten as the active tailer (it is running)."""
    health = store.tailer.health()
    return holder(store, redis) == owner and health is not None and health.owner == owner


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest) -> Iterator[SourceDatabases]:
    """A private source on PostgreSQL or MariaDB (600 rows per table, before capture)."""
    databases = make_source(request, 600, random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


@pytest.fixture(params=SOURCES)
def empty(request: pytest.FixtureRequest) -> Iterator[SourceDatabases]:
    """A private source on PostgreSQL or MariaDB whose three tables are empty at capture."""
    databases = make_source(request, 0, 0)
    yield databases
    drop_databases(databases)


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    """A private PostgreSQL source (600 rows per table, before capture) and an empty target."""
    databases = make_databases(pg15, 600, target=True, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


def outputs(dbs: SourceDatabases, ndjson_dir: Path) -> Output:
    """NDJSON, and beside it on PostgreSQL the monotonic SQL target."""
    if dbs.target_db is None:
        return NdjsonOutput(ndjson_dir)
    assert isinstance(dbs, Databases)
    return FanOut(SqlApplyOutput(dbs.target_dsn, monotonic=True), NdjsonOutput(ndjson_dir))


class InProcessTailer:
    """The tailer in a thread of the test process, writing to `output`."""

    def __init__(self, dbs: SourceDatabases, store: StateStore, output: Output) -> None:
        dbs.source.ensure_setup()
        self.output = output
        self.tailer = Tailer(
            dbs.source,
            store,
            output,
            owner="e2e-tailer",
            settings=TailerSettings(window_ttl_s=30, lease_ttl_ms=5000),
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None
        self._thread.start()
        wait_until(lambda: store.tailer.health() is not None, 30, "the tailer's first heartbeat")

    def _run(self) -> None:
        try:
            self.tailer.run(self._stop)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the tailer did not stop"
        self.output.close()
        if self.error is not None:
            raise self.error


def test_full_dump_under_writes_reaches_the_outputs_in_order(
    source: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """A full dump of three tables (bigint, composite and uuid keys), chunks of 50 with three
    windows in flight, while another process inserts, updates and deletes: the NDJSON stream
    alone rebuilds the source and no key ever goes back to an older position in it; on
    PostgreSQL the SQL target (monotonic writes) also ends equal to the source row for row."""
    dbs = source
    store = StateStore(redis_server.client(), dbs.config.name)
    ndjson_dir = tmp_path / "events"
    tailer = InProcessTailer(dbs, store, outputs(dbs, ndjson_dir))
    writer = Writer(dbs, tmp_path, seed_value=11)
    try:
        writer.wait_for(20)
        written_before_dump = len(writer.transactions())
        request = DumpRequest("full", DumpKind.ALL, dbs.tables, chunk_size=50, parallelism=3)
        store.dumps.create(request)
        state = run_dump(store, dbs.source.chunk_source, "full")
        assert state == "done"
        written_after_dump = len(writer.transactions())
        transactions = writer.stop()
        wait_caught_up(dbs, store=store)
    finally:
        writer.kill()
        tailer.stop()

    if isinstance(dbs, Databases):
        assert compare(dbs.source_dsn, dbs.target_dsn) == []
    events = list(read_events(ndjson_dir))
    assert backwards(events) == []
    assert versions_back(events) == []
    assert missing_changes(transactions, events) == []
    assert state_differences(source_state(dbs.source), materialize(events)) == []

    status = store.dumps.status("full")
    assert status is not None and status.state == "done"
    assert status.rows >= 3 * 600 * 0.8, "pre-existing rows reach the outputs through the dump"
    assert status.chunks >= 3 * 600 // 50
    dump_events = [e for e in events if e.source.origin is Origin.DUMP]
    stamped = [e for e in dump_events if e.after and e.after.get(VERSION_COLUMN)]
    assert stamped, "the dump read rows the writer had stamped: the version check saw some"
    # Rows read by a chunk but changed in its window are dropped: the log event carries them.
    assert status.rows * 0.8 <= len(dump_events) <= status.rows
    assert written_after_dump > written_before_dump, "the writer wrote during the dump"
    first, last = dump_events[0].position, dump_events[-1].position
    interleaved = [e for e in events if e.source.origin is Origin.LOG and first < e.position < last]
    assert interleaved, "log events are interleaved with the dump's chunks"


@pytest.fixture
def empty_source(pg15: PostgresInfo) -> Iterator[Databases]:
    """A private PostgreSQL source whose three tables are empty at capture (no target)."""
    databases = make_databases(pg15, 0, target=False, seed_value=0)
    yield databases
    drop_databases(databases)


def missing_changes(transactions: list[dict[str, Any]], events: list[Event]) -> list[str]:
    """Committed changes (by the writer's journal) that have no event of their transaction."""
    seen = {(e.source.txid, row_key(e.source.table, e.key.values())) for e in events}
    return [
        f"xid {t['xid']}: {table} {key}"
        for t in transactions
        for table, key in t["changes"]
        if (t["xid"], row_key(table, key)) not in seen
    ]


def test_standby_takes_over_after_the_active_tailer_is_killed(
    empty: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """Two `dblog tail` processes on one source: the standby waits (without touching the NDJSON
    directory), takes the lease within its TTL after the active one is SIGKILLed, and goes on
    from the acknowledged position (the slot's; on MySQL the resume point saved with the
    checkpoint), so every committed change is in the output."""
    dbs = empty
    store = StateStore(redis_server.client(), dbs.config.name)
    events_dir = tmp_path / "events"
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(events_dir)},
        {"lease_ttl_ms": LEASE_TTL_MS, "heartbeat_s": 0.2},
    )
    env = cli_env(dbs, redis_server)
    active = TailProcess(config, "tailer-a", env, tmp_path / "a.log")
    standby: TailProcess | None = None
    writer: Writer | None = None
    try:
        wait_until(lambda: leading(store, redis_server, "tailer-a"), 30, "tailer-a leading")
        standby = TailProcess(config, "tailer-b", env, tmp_path / "b.log")
        wait_until(
            lambda: "is a standby" in (tmp_path / "b.log").read_text(),
            30,
            "tailer-b waiting as a standby",
        )
        writer = Writer(dbs, tmp_path, seed_value=23)
        writer.wait_for(40)
        assert standby.alive() and holder(store, redis_server) == "tailer-a", "the standby waits"

        active.kill()
        # The lease expires at most a TTL after the kill and the standby polls every TTL/4.
        within_s = LEASE_TTL_MS * 1.25 / 1000 + 5
        wait_until(lambda: holder(store, redis_server) == "tailer-b", within_s, "b taking over")
        wait_until(lambda: leading(store, redis_server, "tailer-b"), 30, "tailer-b leading")
        writer.wait_for(len(writer.transactions()) + 40)
        transactions = writer.stop()
        wait_caught_up(dbs, store=store)
        assert standby.stop() == 0, (tmp_path / "b.log").read_text()
    finally:
        if writer is not None:
            writer.kill()
        for tail in (active, standby):
            if tail is not None and tail.alive():
                tail.kill()

    events = list(read_events(events_dir))
    assert {e.source.origin for e in events} == {Origin.LOG}
    assert missing_changes(transactions, events) == []
    assert backwards(events) == []
    assert versions_back(events) == []
    assert state_differences(source_state(dbs.source), materialize(events)) == []
    for log in ("a.log", "b.log"):
        assert dbs.password not in (tmp_path / log).read_text()


def test_dump_completes_through_tailer_kills_and_a_redis_restart(
    source: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """`dblog tail` SIGKILLed three times at random points of a full dump (and restarted), and
    Redis restarted once (AOF), while another process writes: windows of a dead tailer expire
    or fail and their chunks are retried, the dump completes, the NDJSON rebuilds the source,
    holds every committed change and never takes a key back to an older position."""
    dbs = source
    seed_value = random.randrange(1 << 30)
    print(f"kill points: seed {seed_value}")
    rng = random.Random(seed_value)
    store = StateStore(redis_server.client(), dbs.config.name)
    events_dir = tmp_path / "events"
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(events_dir)},
        {
            "lease_ttl_ms": LEASE_TTL_MS,
            "heartbeat_s": 0.2,
            "window_ttl_s": 10,
            "reconnect_max_s": 2,
        },
    )
    tail = TailProcess(config, "tailer", cli_env(dbs, redis_server), tmp_path / "tail.log")
    writer: Writer | None = None
    dump = DumpThread(store, dbs, "crashy", window_timeout_s=5, tailer_log=tmp_path / "tail.log")
    try:
        wait_until(lambda: leading(store, redis_server, "tailer"), 30, "the tailer leading")
        writer = Writer(dbs, tmp_path, seed_value=rng.randrange(1000))
        writer.wait_for(20)
        dump.start(DumpRequest("crashy", DumpKind.ALL, dbs.tables, chunk_size=20, parallelism=3))
        for step, at_chunks in enumerate(sorted(rng.sample(range(5, 80), 4))):
            wait_until(partial(dump.reached, at_chunks), 120, f"the dump at {at_chunks} chunks")
            if step == 2:
                redis_server.restart()
            else:
                tail.kill()
                tail.start()
        dump.join(180)
        transactions = writer.stop()
        wait_caught_up(dbs, store=store)
        assert tail.stop() == 0, (tmp_path / "tail.log").read_text()[-3000:]
    finally:
        if writer is not None:
            writer.kill()
        if tail.alive():
            tail.kill()

    status = store.dumps.status("crashy")
    assert status is not None and status.state == "done", status
    events = list(read_events(events_dir))
    assert backwards(events) == []
    assert versions_back(events) == []
    assert missing_changes(transactions, events) == []
    assert state_differences(source_state(dbs.source), materialize(events)) == []
    assert dbs.password not in (tmp_path / "tail.log").read_text()


class DumpThread:
    """`run_dump` in a thread of the test process; `join` fails with what it raised and the
    end of the tailer's log (`tailer_log`), which says why windows did not close."""

    def __init__(
        self,
        store: StateStore,
        dbs: SourceDatabases,
        dump_id: str,
        window_timeout_s: float,
        tailer_log: Path,
    ):
        self._store, self._dbs, self._dump_id = store, dbs, dump_id
        self._timeout = window_timeout_s
        self._tailer_log = tailer_log
        self.state: str | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, request: DumpRequest) -> None:
        self._store.dumps.create(request)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.state = run_dump(
                self._store,
                self._dbs.source.chunk_source,
                self._dump_id,
                window_timeout_s=self._timeout,
                max_attempts=10,
            )
        except BaseException as exc:
            self.error = exc

    def _failed(self) -> AssertionError:
        log = self._tailer_log.read_text() if self._tailer_log.exists() else "(no log)"
        assert self.error is not None
        where = "".join(traceback.format_exception(self.error))[-3000:]
        return AssertionError(f"the dump failed: {where}\nthe tailer log ends:\n{log[-6000:]}")

    def chunks(self) -> int:
        if self.error is not None:
            raise self._failed() from self.error
        status = self._store.dumps.status(self._dump_id)
        return 0 if status is None else status.chunks

    def reached(self, chunks: int) -> bool:
        return self.chunks() >= chunks

    def reached_or_ended(self, chunks: int) -> bool:
        """`reached`, or the dump ended with fewer chunks (a truncate can shorten it)."""
        return self.reached(chunks) or not self._thread.is_alive()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"the dump did not end within {timeout_s}s"
        if self.error is not None:
            raise self._failed() from self.error
        assert self.state == "done", self.state


def test_truncate_and_alters_under_a_dump_and_a_tailer_kill_reach_every_output(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """While another process writes and a full dump runs, `items` is truncated and `orders`
    gets two columns with defaults and loses one of them again, and the tailer (writing a
    monotonic SQL target and NDJSON at once) is SIGKILLed and restarted once, at random points
    of the dump: the dump completes, the SQL target equals the source (the added column and its
    default included), and the NDJSON carries the truncate and the schema events in position
    order and rebuilds the source by the consumer rules (docs/operations.md)."""
    seed_value = random.randrange(1 << 30)
    print(f"truncate, alters and kill: seed {seed_value}")
    rng = random.Random(seed_value)
    store = StateStore(redis_server.client(), dbs.config.name)
    events_dir = tmp_path / "events"
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(events_dir)},
        {
            "lease_ttl_ms": LEASE_TTL_MS,
            "heartbeat_s": 0.2,
            "window_ttl_s": 10,
            "reconnect_max_s": 2,
        },
    )
    env = cli_env(dbs, redis_server, E2E_TARGET_DSN=dbs.target_dsn)
    log = tmp_path / "tail.log"
    tail = TailProcess(config, "tailer", env, log, module="tests.integration.e2e_tailer")

    def source_ddl(statement: str) -> None:
        with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
            conn.execute(statement)

    def kill_and_restart() -> None:
        tail.kill()
        tail.start()

    steps: list[Callable[[], None]] = [
        partial(source_ddl, "ALTER TABLE orders ADD COLUMN flag int DEFAULT 7"),
        partial(source_ddl, "ALTER TABLE orders ADD COLUMN legacy text DEFAULT 'old'"),
        partial(source_ddl, "TRUNCATE items"),
        partial(source_ddl, "ALTER TABLE orders DROP COLUMN legacy"),
    ]
    steps.insert(rng.randrange(len(steps) + 1), kill_and_restart)
    writer: Writer | None = None
    dump = DumpThread(store, dbs, "ddl", window_timeout_s=5, tailer_log=log)
    try:
        wait_until(lambda: leading(store, redis_server, "tailer"), 30, "the tailer leading")
        writer = Writer(dbs, tmp_path, seed_value=rng.randrange(1000))
        writer.wait_for(20)
        dump.start(DumpRequest("ddl", DumpKind.ALL, dbs.tables, chunk_size=20, parallelism=3))
        for step, at_chunks in zip(
            steps, sorted(rng.sample(range(5, 60), len(steps))), strict=True
        ):
            # 90 chunks and the writer's rows; an early truncate of `items` leaves about 62.
            wait_until(
                partial(dump.reached_or_ended, at_chunks), 120, f"the dump at {at_chunks} chunks"
            )
            step()
        dump.join(240)
        transactions = writer.stop()
        wait_caught_up(dbs)
        assert tail.stop() == 0, log.read_text()[-3000:]
    finally:
        if writer is not None:
            writer.kill()
        if tail.alive():
            tail.kill()

    assert compare(dbs.source_dsn, dbs.target_dsn) == []
    events = list(read_events(events_dir))
    assert all(a.position < b.position for a, b in pairwise(events)), "positions only grow"
    truncates = [e for e in events if e.op is Op.TRUNCATE]
    assert [e.table for e in truncates] == [TableRef("public", "items")]
    orders = [e.table_schema for e in events if e.op is Op.SCHEMA and e.table.name == "orders"]
    assert any(s is not None and s.column("legacy") for s in orders), "the added column showed"
    last = orders[-1]
    assert last is not None and last.column("legacy") is None
    assert last.column("flag") == Column("flag", "integer", True, "7")
    assert schema_versions_out_of_step(events) == []
    assert backwards(events) == []
    assert versions_back(events) == []
    assert missing_changes(transactions, events) == []
    assert state_differences(source_state(dbs.source), materialize(events)) == []
    assert dbs.pg.password not in log.read_text()


def test_a_replay_across_an_added_and_dropped_column_reaches_the_sql_target(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """A tailer SIGKILLed once a column's ADD and DROP are durable, but not yet checkpointed,
    replays the rows written with the column: they carry the version they were read with, so
    the SQL target (which no longer has the column) leaves it out of them, and goes on: the
    changed rows equal the source's. (The target holds only the changed rows: no dump runs.)"""
    store = StateStore(redis_server.client(), dbs.config.name)
    orders = TableRef("public", "orders")
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(tmp_path / "events")},
        # The first checkpoint is saved at once, the next an hour later: the restart replays.
        {"lease_ttl_ms": LEASE_TTL_MS, "heartbeat_s": 0.2, "checkpoint_s": 3600},
    )
    env = cli_env(dbs, redis_server, E2E_TARGET_DSN=dbs.target_dsn)
    log = tmp_path / "tail.log"
    tail = TailProcess(config, "tailer", env, log, module="tests.integration.e2e_tailer")

    def target_note(n: int) -> object:
        with psycopg.connect(dbs.target_dsn) as conn:
            row = conn.execute(
                "SELECT note FROM orders WHERE n = %s ORDER BY region LIMIT 1", (n,)
            ).fetchone()
        return None if row is None else row[0]

    def orders_version() -> int:
        return max((k.version for k in store.tailer.load_schemas() if k.table == orders), default=0)

    try:
        wait_until(lambda: leading(store, redis_server, "tailer"), 30, "the tailer leading")
        wait_until(lambda: store.tailer.load_checkpoint() is not None, 60, "a first checkpoint")
        with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
            conn.execute("UPDATE orders SET note = 'before' WHERE n = 1")
            wait_until(lambda: orders_version() == 1, 60, "orders described")
            conn.execute("ALTER TABLE orders ADD COLUMN legacy text DEFAULT 'old'")
            conn.execute("UPDATE orders SET note = 'with legacy', legacy = 'x' WHERE n = 1")
            conn.execute("ALTER TABLE orders DROP COLUMN legacy")
            conn.execute("UPDATE orders SET note = 'after drop' WHERE n = 2")
        wait_until(lambda: target_note(2) == "after drop", 60, "the drop applied")
        # A schema is saved once the batch that carries its event is written, so the row
        # after the DROP may reach the target a moment before version 3 is in the store.
        wait_until(lambda: orders_version() == 3, 60, "the added and the dropped column durable")
        tail.kill()
        tail.start()
        with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
            conn.execute("UPDATE orders SET note = 'after restart' WHERE n = 3")
        wait_until(
            lambda: target_note(3) == "after restart" or not tail.alive(),
            60,
            "the restart caught up",
        )
        assert tail.stop() == 0, log.read_text()[-3000:]
    finally:
        if tail.alive():
            tail.kill()
    changed = "SELECT * FROM orders WHERE n IN (1, 2, 3) ORDER BY region, n"
    with psycopg.connect(dbs.source_dsn) as source, psycopg.connect(dbs.target_dsn) as target:
        assert target.execute(changed).fetchall() == source.execute(changed).fetchall()
        columns = target.execute(changed).description
    assert columns is not None and "legacy" not in [c.name for c in columns]
    assert dbs.pg.password not in log.read_text()


def test_an_alter_with_no_later_write_reaches_the_stream_through_the_dump(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """pgoutput describes `orders` again only at its next change; after an ALTER with no write,
    a dump's chunk shows the new column: the tailer asks the catalog and emits the schema event
    at the chunk's hw, before its rows. The version is kept across a tailer restart: the
    restarted tailer's Relation messages describe the same columns, so no event repeats and
    the rows written afterwards carry the same version."""
    store = StateStore(redis_server.client(), dbs.config.name)
    events_dir = tmp_path / "events"
    orders = TableRef("public", "orders")
    tailer = InProcessTailer(dbs, store, NdjsonOutput(events_dir))
    try:
        with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
            conn.execute("UPDATE orders SET note = 'seen' WHERE n = 1")
            wait_caught_up(dbs)
            conn.execute("ALTER TABLE orders ADD COLUMN flag int DEFAULT 7")
        request = DumpRequest("after-alter", DumpKind.TABLE, (orders,), chunk_size=200)
        store.dumps.create(request)
        assert run_dump(store, dbs.source.chunk_source, "after-alter") == "done"
        wait_caught_up(dbs)
    finally:
        tailer.stop()
    tailer = InProcessTailer(dbs, store, NdjsonOutput(events_dir))
    try:
        with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
            conn.execute("UPDATE orders SET note = 'after restart' WHERE n = 2")
        wait_caught_up(dbs)
    finally:
        tailer.stop()

    events = [e for e in read_events(events_dir) if e.table == orders]
    schemas = [e for e in events if e.op is Op.SCHEMA]
    assert [s.schema_version for s in schemas] == [1, 2]
    assert schemas[1].table_schema is not None
    assert schemas[1].table_schema.column("flag") == Column("flag", "integer", True, "7")
    first_row = next(e for e in events if e.source.origin is Origin.DUMP)
    assert events.index(schemas[1]) == events.index(first_row) - 1, "at hw, just before the rows"
    assert schemas[1].position.commit == first_row.position.commit
    assert first_row.after is not None and first_row.after["flag"] == 7
    assert schema_versions_out_of_step(events) == []
    last = events[-1]
    assert last.op is Op.UPDATE and last.schema_version == 2
    assert last.after is not None and last.after["note"] == "after restart"


def schema_versions_out_of_step(events: list[Event]) -> list[str]:
    """Row events whose schema_version is not the version of the last schema event of their
    table before them, and schema versions that do not grow by one."""
    current: dict[TableRef, int] = {}
    problems = []
    for event in events:
        version = current.get(event.table, 0)
        if event.op is Op.SCHEMA:
            if event.schema_version != version + 1:
                problems.append(
                    f"{event.table} went from version {version} to {event.schema_version}"
                )
            current[event.table] = event.schema_version
        elif event.schema_version != version:
            problems.append(
                f"{event.op} of {event.table} at {event.position} has version "
                f"{event.schema_version}, not {version}"
            )
    return problems


def test_repair_fixes_exactly_the_given_keys(
    source: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """After a full dump, `dblog dump --table T --keys ...` (bigint keys as a list, composite
    keys as JSON) dumps exactly the listed keys: in the NDJSON the repair dumps emit the listed
    keys' source rows and nothing else. On PostgreSQL, rows corrupted on purpose in the SQL
    target (equal to the source after the full dump) are repaired for exactly the listed keys:
    corrupted rows that were not listed stay corrupted."""
    dbs = source
    store = StateStore(redis_server.client(), dbs.config.name)
    events_dir = tmp_path / "events"
    tailer = InProcessTailer(dbs, store, outputs(dbs, events_dir))
    seed_value = random.randrange(1 << 30)
    print(f"corrupted keys: seed {seed_value}")
    rng = random.Random(seed_value)
    ids = rng.sample(range(1, 601), 20)
    bad_orders = rng.sample([(r, n) for r in ("eu", "us", "ap", "sa") for n in range(1, 151)], 6)
    repair_ids, kept_ids = sorted(ids[:10]), sorted(ids[10:])
    repair_orders, kept_orders = sorted(bad_orders[:3]), sorted(bad_orders[3:])
    try:
        request = DumpRequest("full", DumpKind.ALL, dbs.tables, chunk_size=100, parallelism=3)
        store.dumps.create(request)
        assert run_dump(store, dbs.source.chunk_source, "full") == "done"
        wait_caught_up(dbs, store=store)
        if isinstance(dbs, Databases):
            assert compare(dbs.source_dsn, dbs.target_dsn) == []
            corrupt(dbs, ids, bad_orders)
        before_repair = len(list(read_events(events_dir)))
        config = write_config(
            tmp_path / "dblog.toml",
            dbs,
            redis_server,
            {"type": "ndjson", "directory": str(tmp_path / "unused")},
        )
        env = cli_env(dbs, redis_server)
        keys = ",".join(map(str, repair_ids))
        for table, key_text, dump_id in (
            (dbs.table("accounts"), keys, "repair-accounts"),
            (dbs.table("orders"), json.dumps(repair_orders), "repair-orders"),
        ):
            done = run_cli(
                "dump", "-c", str(config), "--table", str(table), "--keys", key_text,
                "--chunk-size", "4", "--dump-id", dump_id, env=env,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
        wait_caught_up(dbs, store=store)
    finally:
        tailer.stop()

    events = list(read_events(events_dir))
    repaired = [e for e in events[before_repair:] if e.source.origin is Origin.DUMP]
    expected = {row_key("accounts", [i]) for i in repair_ids}
    expected |= {row_key("orders", list(k)) for k in repair_orders}
    assert {row_key(e.source.table, e.key.values()) for e in repaired} == expected
    assert len(repaired) == len(expected)
    rows = source_state(dbs.source)
    assert all(rows[row_key(e.source.table, e.key.values())] == e.after for e in repaired)
    assert state_differences(rows, materialize(events)) == []
    for dump_id, count in (("repair-accounts", 10), ("repair-orders", 3)):
        status = store.dumps.status(dump_id)
        assert status is not None and status.state == "done" and status.rows == count
    if not isinstance(dbs, Databases):
        return
    with psycopg.connect(dbs.target_dsn) as conn:
        bad = conn.execute("SELECT id FROM accounts WHERE owner = 'CORRUPTED' ORDER BY id")
        still_bad = [r[0] for r in bad]
        bad = conn.execute("SELECT region, n FROM orders WHERE note = 'CORRUPTED' ORDER BY 1, 2")
        still_bad_orders = [tuple(r) for r in bad]
    assert still_bad == kept_ids
    assert still_bad_orders == kept_orders
    source_rows, target = snapshot(dbs.source_dsn), snapshot(dbs.target_dsn)
    assert len(set(source_rows["accounts"]) - set(target["accounts"])) == len(kept_ids)
    assert len(set(source_rows["orders"]) - set(target["orders"])) == len(kept_orders)
    assert source_rows["items"] == target["items"]


def corrupt(dbs: Databases, ids: list[int], orders: list[tuple[str, int]]) -> None:
    """Overwrite the owner of accounts `ids` and the note of `orders` in the SQL target."""
    with psycopg.connect(dbs.target_dsn, autocommit=True) as conn:
        conn.execute("UPDATE accounts SET owner = 'CORRUPTED' WHERE id = ANY(%s)", (ids,))
        for region, n in orders:
            conn.execute(
                "UPDATE orders SET note = 'CORRUPTED' WHERE region = %s AND n = %s", (region, n)
            )


def test_cli_refuses_bad_input_with_clear_errors_and_exit_code_2(
    empty_source: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """Unknown table, malformed keys, chunk size 0, an unset or wrong password and a closed
    port: each `dblog dump` run exits 2 with a message naming the problem, registers no dump,
    and prints no password. The closed port is the one a retry could change: the dump waits
    for it its `--source-patience` first, as `dblog tail` waits for a source it cannot reach
    (tests/integration/tailer/test_startup.py)."""
    dbs = empty_source
    output = {"type": "ndjson", "directory": str(tmp_path / "events")}
    good = write_config(tmp_path / "good.toml", dbs, redis_server, output)
    unset = write_config(
        tmp_path / "unset.toml", dbs, redis_server, output, password_env="E2E_UNSET_PASSWORD"
    )
    closed = write_config(tmp_path / "closed.toml", dbs, redis_server, output, port=free_port())
    env = cli_env(dbs, redis_server)
    env.pop("E2E_UNSET_PASSWORD", None)
    wrong_password = "wrong-" + secrets.token_hex(8)
    wrong_env = dict(env, **{PASSWORD_ENV: wrong_password})
    cases: list[tuple[list[str], dict[str, str], list[str]]] = [
        (["dump", "-c", str(good), "--table", "public.nope"], env, ["public.nope", "captured"]),
        (["dump", "-c", str(good), "--table", "public.accounts", "--keys", "[1,"], env,
         ["public.accounts", "not valid JSON"]),
        (["dump", "-c", str(good), "--table", "public.orders", "--keys", "1,2"], env,
         ["public.orders", "composite primary key"]),
        (["dump", "-c", str(good), "--keys", "1,2"], env, ["--keys needs --table"]),
        (["dump", "-c", str(good), "--chunk-size", "0"], env, ["--chunk-size", "at least 1"]),
        (["dump", "-c", str(unset)], env, ["E2E_UNSET_PASSWORD", "not set"]),
        (["dump", "-c", str(good)], wrong_env, ["password authentication failed"]),
        (["dump", "-c", str(closed), "--source-patience", "2"], env,
         ["source unavailable", "cannot start: the source was unreachable for", "refused"]),
        (["dump", "-c", str(tmp_path / "missing.toml")], env, ["missing.toml", "does not exist"]),
    ]  # fmt: skip
    store = StateStore(redis_server.client(), dbs.config.name)
    for args, case_env, expected in cases:
        done = run_cli(*args, env=case_env)
        said = done.stdout + done.stderr
        assert done.returncode == 2, (args, said)
        for words in expected:
            assert words in said, (args, said)
        assert "Traceback" not in said, (args, said)
        for secret in (dbs.pg.password, redis_server.password, wrong_password):
            assert secret not in said, (args, "a password was printed")
    assert store.dumps.ids() == [], "a refused request must not be registered"
