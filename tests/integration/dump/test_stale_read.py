"""The stale-read guard (paper step 3') on real PostgreSQL: a commit in the log that a chunk read
cannot see yet.

PostgreSQL writes a commit record and marks the transaction committed before it leaves the
ProcArray; until it does, new snapshots do not see it, though logical decoding already sends it.
A commit waiting for a synchronous standby stays in between for as long as we like: on a private
server whose sessions commit with `synchronous_commit = local`, `synchronous_standby_names` names a
standby that does not exist, and one session commits with `synchronous_commit = on`. Resetting
the setting releases it. The server is private because these settings are server-wide.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from airflow_provider_dblog.core.dump_plan import Chunk, DumpKind, DumpRequest
from airflow_provider_dblog.core.event import Event, Origin
from airflow_provider_dblog.core.log import Change, LogItem, WatermarkWrite, single_changes
from airflow_provider_dblog.core.reconciler import (
    ChunkRows,
    Closed,
    Failed,
    FailureReason,
    Opened,
    Reconciler,
    Window,
)
from airflow_provider_dblog.demo.postgres import TABLES
from airflow_provider_dblog.devservices.embedded_postgres import EmbeddedPostgresServer
from airflow_provider_dblog.devservices.postgres import PostgresInfo, PostgresServer
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.chunk import StoredChunk, read_in_process
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs import NdjsonOutput, read_events
from airflow_provider_dblog.sources.base import ChunkRead, ChunkSource
from airflow_provider_dblog.sources.postgres.chunks import PostgresChunkSource
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig
from airflow_provider_dblog.state import DumpState, StateStore, WindowState
from airflow_provider_dblog.tailer import Tailer, TailerSettings
from tests.deadlines import deadline_s
from tests.integration.e2e_support import (
    Databases,
    drop_databases,
    make_databases,
    materialize,
    row_key,
    source_state,
    state_differences,
    wait_until,
)
from tests.pg_helpers import read_until
from tests.unit.broken_reconcilers import IgnoresInvisibleTransactions

pytestmark = pytest.mark.integration

ACCOUNTS = TABLES[0]
STUCK_ID = 5
STUCK_UPDATE = f"UPDATE accounts SET owner = 'stuck' WHERE id = {STUCK_ID}"
RESTORE_UPDATE = f"UPDATE accounts SET owner = 'owner-{STUCK_ID}' WHERE id = {STUCK_ID}"
WHOLE_TABLE = Chunk(ACCOUNTS, 0)
XID_MASK = 0xFFFF_FFFF
SERVERS = {"pg15": PostgresServer, "pg18": EmbeddedPostgresServer}


@pytest.fixture(scope="module", params=sorted(SERVERS))
def private_pg(request: pytest.FixtureRequest) -> Iterator[PostgresInfo]:
    """A server of our own whose sessions commit without waiting for a synchronous standby
    (autovacuum off, so no other transaction shows up in a snapshot)."""
    # Outside pytest's temp root, which a concurrent session may make unreachable (conftest).
    with (
        tempfile.TemporaryDirectory(prefix="dblog-test-stale-") as base,
        SERVERS[request.param](Path(base)) as server,
    ):
        info = server.info
        with psycopg.connect(info.admin_dsn, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM SET synchronous_commit = 'local'")
            admin.execute("ALTER SYSTEM SET autovacuum = off")
            admin.execute("SELECT pg_reload_conf()")
        wait_until(lambda: _setting(info, "synchronous_commit") == "local", 30, "reload")
        yield info


def _setting(info: PostgresInfo, name: str) -> str:
    """The setting as a new session gets it."""
    with psycopg.connect(info.admin_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture
def dbs(private_pg: PostgresInfo) -> Iterator[Databases]:
    """A source database with 20 rows in each demo table, written before capture starts."""
    databases = make_databases(private_pg, 20, target=False, seed_value=0)
    yield databases
    drop_databases(databases)


class StuckCommit:
    """`STUCK_UPDATE` committed in a thread, waiting for a synchronous standby that does not
    exist: in the log, committed, and invisible to new snapshots until `release()`."""

    def __init__(self, dbs: Databases) -> None:
        self._admin = psycopg.connect(dbs.pg.admin_dsn, autocommit=True)
        self._conn = psycopg.connect(dbs.source_dsn, autocommit=True)
        self._conn.execute("SET synchronous_commit = on")
        self._pid = self._conn.info.backend_pid
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.xid = 0
        """The transaction id as the log and `invisible_txids` name it (32 bits)."""

    def __enter__(self) -> StuckCommit:
        self._configure("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        try:
            self._start()
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _start(self) -> None:
        # Backends read the setting at once, but a commit waits only once the checkpointer has
        # read it too, which nothing shows: a commit that did not wait is simply made again.
        for _ in range(20):
            self._thread = threading.Thread(target=self._commit, daemon=True)
            self._thread.start()
            wait_until(
                lambda: self._waiting() or not self._alive(), 30, "the commit waiting or done"
            )
            if self._waiting():
                return
            assert self._thread is not None
            self._thread.join()
            if self._error is not None:
                raise self._error
            # It committed without waiting, so it is visible: undo it before trying again.
            with self._conn.transaction():
                self._conn.execute("SET LOCAL synchronous_commit = local")
                self._conn.execute(RESTORE_UPDATE)
        raise AssertionError("the commit never waited for the synchronous standby")

    def _commit(self) -> None:
        try:
            with self._conn.transaction():
                self._conn.execute(STUCK_UPDATE)
                row = self._conn.execute("SELECT pg_current_xact_id()::text").fetchone()
                assert row is not None
                self.xid = int(row[0]) & XID_MASK
        except BaseException as exc:
            self._error = exc

    def _alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _waiting(self) -> bool:
        row = self._admin.execute(
            "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (self._pid,)
        ).fetchone()
        return row is not None and row[0] == "SyncRep"

    def release(self) -> None:
        """Let the commit finish (it becomes visible); idempotent."""
        if self._admin.closed:
            return
        self._configure("ALTER SYSTEM RESET synchronous_standby_names")
        if self._thread is not None:
            self._thread.join(30)
            assert not self._thread.is_alive(), "the commit still waits after the release"
        self._admin.close()
        self._conn.close()
        if self._error is not None:
            raise self._error

    def _configure(self, statement: str) -> None:
        self._admin.execute(statement)
        self._admin.execute("SELECT pg_reload_conf()")


@dataclass
class StaleScenario:
    """A chunk read between lw and hw while `xid` waited, and one after its release."""

    xid: int
    stale: ChunkRead
    fresh: ChunkRead
    lw: str
    hw: str


def stale_scenario(dbs: Databases) -> StaleScenario:
    """The dump's steps by hand around a stuck commit: lw, read, hw; the slot exists first, so
    the log holds all of it."""
    dbs.source.ensure_setup()
    source = dbs.source.chunk_source()
    try:
        with StuckCommit(dbs) as stuck:
            source.write_watermark("lw-stale")
            stale = source.read_chunk(WHOLE_TABLE)
            source.write_watermark("hw-stale")
        fresh = source.read_chunk(WHOLE_TABLE)
    finally:
        source.close()
    return StaleScenario(stuck.xid, stale, fresh, "lw-stale", "hw-stale")


def owner_of(rows: ChunkRead) -> Any:
    return next(r["owner"] for r in rows.rows if r["id"] == STUCK_ID)


def test_a_read_while_a_commit_waits_names_it_invisible(dbs: Databases) -> None:
    """The read taken while the commit waits misses its row and names its transaction; a read
    after the release sees the new row and names nothing."""
    scenario = stale_scenario(dbs)
    assert scenario.xid != 0
    assert owner_of(scenario.stale) == f"owner-{STUCK_ID}"
    assert scenario.stale.invisible_txids == frozenset({scenario.xid})
    assert owner_of(scenario.fresh) == "stuck"
    assert scenario.fresh.invisible_txids == frozenset()


def reconcile(
    reconciler: Reconciler, items: list[LogItem], scenario: StaleScenario, chunk: ChunkRows
) -> tuple[list[Event], list[Event] | Failed]:
    """Feed the log to `reconciler` with the scenario's lw and hw as one window's; the log's
    events and what the window's chunk gives."""
    window = Window(chunk.window_id, "dump", ACCOUNTS)
    changes: list[Event] = []
    closed: Closed | Failed | None = None
    for item in items:
        if isinstance(item, Change):
            reconciler.change(item.event)
            changes.append(item.event)
        elif isinstance(item, WatermarkWrite) and item.value == scenario.lw:
            assert isinstance(reconciler.low_watermark(window, item.position), Opened)
        elif isinstance(item, WatermarkWrite) and item.value == scenario.hw:
            closed = reconciler.high_watermark(window, item.position)
    assert isinstance(closed, Closed)
    return changes, reconciler.chunk_events(closed, chunk)


def test_c_the_guard_fails_the_window_that_ignoring_it_would_emit_stale(dbs: Databases) -> None:
    """On the real log and the real stale read: the stuck commit is in the log before lw, so
    our reconciler fails the window as a stale read, while one that ignores `invisible_txids`
    emits the row's old image after the log's newer one, and the replay ends stale."""
    scenario = stale_scenario(dbs)
    reader = dbs.source.log_reader()
    try:
        items = read_until(
            single_changes(reader.items()),
            lambda seen: any(
                isinstance(i, WatermarkWrite) and i.value == scenario.hw for i in seen
            ),
        )
    finally:
        reader.close()
    chunk = ChunkRows("w-stale", ("id",), scenario.stale.rows, 1, scenario.stale.invisible_txids)
    stuck_events = [
        i.event for i in items if isinstance(i, Change) and i.event.source.txid == scenario.xid
    ]
    lw_position = next(
        i.position for i in items if isinstance(i, WatermarkWrite) and i.value == scenario.lw
    )
    assert [e.after["owner"] for e in stuck_events if e.after] == ["stuck"]
    assert stuck_events[0].position.commit < lw_position.commit

    _, ours = reconcile(Reconciler(dbs.config.name, dbs.source_db), items, scenario, chunk)
    assert isinstance(ours, Failed) and ours.reason is FailureReason.STALE_READ
    assert f"transaction {scenario.xid}" in ours.detail

    ignoring = IgnoresInvisibleTransactions(dbs.config.name, dbs.source_db)
    changes, emitted = reconcile(ignoring, items, scenario, chunk)
    assert isinstance(emitted, list)
    replayed = materialize([*changes, *emitted])
    assert replayed[row_key("accounts", [STUCK_ID])]["owner"] == f"owner-{STUCK_ID}"
    assert owner_of(scenario.fresh) == "stuck"


class ReleaseAfterFirstRead:
    """A `ChunkReader`: the in-process read, and right after the first one the stuck commit's
    release. The first window has read a stale snapshot; its retry reads a fresh one."""

    def __init__(self, stuck: StuckCommit) -> None:
        self._stuck = stuck
        self.windows: list[str] = []

    def __call__(
        self,
        store: StateStore,
        source: ChunkSource,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> StoredChunk | None:
        stored = read_in_process(store, source, window_id, chunk, key_columns)
        self.windows.append(window_id)
        if len(self.windows) == 1:
            self._stuck.release()
        return stored


def test_b_the_stale_window_fails_and_its_retry_emits_the_committed_row(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """End to end, with the real tailer: the stuck commit is in the log before the dump's first
    lw, the first window's read misses it, so the tailer fails the window as a stale read; the
    retry reads after the release, the dump ends done, and the NDJSON output replayed equals
    the source, the stuck change included."""
    dbs.source.ensure_setup()
    store = StateStore(redis_server.client(), dbs.config.name)
    events_dir = tmp_path / "events"
    tailer = Tailer(
        dbs.source,
        store,
        lambda: NdjsonOutput(events_dir),
        owner="stale-tailer",
        settings=TailerSettings(window_ttl_s=30, lease_ttl_ms=5000),
    )
    stop = threading.Event()
    thread = tailer.start(stop)
    try:
        with StuckCommit(dbs) as stuck:
            reader = ReleaseAfterFirstRead(stuck)
            store.dumps.create(DumpRequest("stale", DumpKind.ALL, (ACCOUNTS,), chunk_size=100))
            state = run_dump(
                store,
                dbs.source.chunk_source,
                "stale",
                read=reader,
                window_timeout_s=30,
            )
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive(), "the tailer did not stop"

    assert state is DumpState.DONE
    assert len(reader.windows) == 2
    first, retry = (store.windows.state(w) for w in reader.windows)
    assert first is not None and first.state is WindowState.FAILED
    assert first.reason.startswith(f"{FailureReason.STALE_READ}: transaction {stuck.xid} ")
    assert retry is not None and retry.state is WindowState.CLOSED
    status = store.dumps.status("stale")
    assert status is not None and status.windows_retried == 1 and status.rows == 20
    assert tailer.stats.windows_failed == 1 and tailer.stats.windows_closed == 1

    events = list(read_events(events_dir))
    assert state_differences(source_state(dbs.source, (ACCOUNTS,)), materialize(events)) == []
    stuck_row = [
        e.after["owner"]
        for e in events
        if e.source.origin is Origin.DUMP and e.key_value() == (STUCK_ID,) and e.after
    ]
    assert stuck_row == ["stuck"], "the retry's row carries the stuck commit's change"
    assert any(e.source.txid == stuck.xid for e in events), "the stuck change is in the log"


def test_d_a_read_waits_for_a_commit_in_the_log_and_sees_it(dbs: Databases) -> None:
    """A chunk read first waits for the transactions running when it starts to end (`test_a`'s
    read waited its second for the stuck commit, then read around it): released while the read
    waits, the commit is seen by the read, which names nothing invisible."""
    dbs.source.ensure_setup()
    source = dbs.source.chunk_source()
    assert isinstance(source, PostgresChunkSource)
    source.commits_wait_s = 600  # far longer than the test takes to release the commit
    reads: list[ChunkRead] = []
    try:
        with StuckCommit(dbs) as stuck, psycopg.connect(dbs.pg.admin_dsn) as admin:
            source.write_watermark("lw-waits")
            reader = threading.Thread(target=lambda: reads.append(source.read_chunk(WHOLE_TABLE)))
            reader.start()

            def waiting() -> bool:
                found = admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE datname = %s AND query LIKE %s",
                    (dbs.source_db, "%FROM pg_locks%"),
                ).fetchall()
                admin.rollback()  # a fresh view of the activity at each look
                return bool(found)

            wait_until(lambda: waiting() or not reader.is_alive(), 60, "the read waiting")
            assert reader.is_alive() and not reads, "the read did not wait for the commit"
            stuck.release()
            reader.join(deadline_s(60))
    finally:
        source.close()
    assert len(reads) == 1, "the read did not end once the commit was visible"
    assert owner_of(reads[0]) == "stuck"
    assert reads[0].invisible_txids == frozenset()


def test_e_a_commit_above_the_snapshot_s_xmax_is_named_invisible(dbs: Databases) -> None:
    """lw's transaction takes its id first and commits after the stuck commit: the stuck one
    is then above the read's snapshot xmax (one past the latest to end), so not in its xip
    list, and still invisible. The read names it, so the guard can fail the window."""
    dbs.source.ensure_setup()
    source = dbs.source.chunk_source()
    assert isinstance(source, PostgresChunkSource)
    source.commits_wait_s = 0.1  # it stays stuck: no need to wait the default second for it
    assert isinstance(dbs.config, PostgresSourceConfig)
    watermark = dbs.config.watermark
    update = sql.SQL("UPDATE {}.{} SET value = 'lw-xmax'").format(
        sql.Identifier(watermark.schema), sql.Identifier(watermark.name)
    )
    try:
        with psycopg.connect(dbs.source_dsn) as lw:
            lw.execute(update)
            with StuckCommit(dbs) as stuck:
                lw.commit()
                read = source.read_chunk(WHOLE_TABLE)
                with psycopg.connect(dbs.source_dsn, autocommit=True) as look:
                    row = look.execute("SELECT pg_current_snapshot()::text").fetchone()
    finally:
        source.close()
    assert row is not None
    xmax = int(str(row[0]).split(":")[1]) & XID_MASK
    assert stuck.xid >= xmax, "the scenario did not put the stuck commit above xmax"
    assert owner_of(read) == f"owner-{STUCK_ID}"
    assert stuck.xid in read.invisible_txids
