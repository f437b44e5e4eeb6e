"""DBLog end to end on real PostgreSQL and Redis: tailer, dumps under writes from another
process, crashes, a Redis restart, repair, lease takeover and command-line errors.

Every test gets its own source database, slot and source name on the shared servers, so the
tests are independent of each other and of concurrent sessions. Waiting is always on a condition
with a deadline.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.event import Origin
from airflow_provider_dblog.demo import TABLES, compare
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump_runner import run_dump
from airflow_provider_dblog.outputs import NdjsonOutput, SqlApplyOutput, read_events
from airflow_provider_dblog.sources.postgres.chunks import PostgresChunkSource
from airflow_provider_dblog.sources.postgres.replication import PostgresLogReader
from airflow_provider_dblog.sources.postgres.setup import ensure_setup
from airflow_provider_dblog.state_store import StateStore
from airflow_provider_dblog.tailer import Tailer, TailerSettings
from tests.integration.e2e_support import (
    Databases,
    FanOut,
    Writer,
    backwards,
    drop_databases,
    make_databases,
    materialize,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    """A private source (600 rows per table, before capture) and an empty target."""
    databases = make_databases(pg15, 600, target=True, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


class InProcessTailer:
    """The tailer in a thread of the test process, writing to `output`."""

    def __init__(self, dbs: Databases, store: StateStore, output: FanOut) -> None:
        ensure_setup(dbs.config)
        self.output = output
        self.tailer = Tailer(
            dbs.config.name,
            dbs.source_db,
            lambda: PostgresLogReader(dbs.config),
            store,
            output,
            "e2e-tailer",
            TailerSettings(window_ttl_s=30, lease_ttl_ms=5000),
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None
        self._thread.start()
        wait_until(lambda: store.tailer_health() is not None, 30, "the tailer's first heartbeat")

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


def test_full_dump_under_writes_reaches_sql_target_and_ndjson_in_order(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """A full dump of three tables (bigint, (text, int) and uuid keys), chunks of 50 with three
    windows in flight, while another process inserts, updates and deletes: the SQL target
    (monotonic writes) ends equal to the source row for row, the NDJSON stream alone rebuilds
    the source, and no key ever goes back to an older position in it."""
    store = StateStore(redis_server.client(), dbs.config.name)
    ndjson_dir = tmp_path / "events"
    output = FanOut(SqlApplyOutput(dbs.target_dsn, monotonic=True), NdjsonOutput(ndjson_dir))
    tailer = InProcessTailer(dbs, store, output)
    writer = Writer(dbs, tmp_path, seed_value=11)
    try:
        writer.wait_for(20)
        store.create_dump(DumpRequest("full", DumpKind.ALL, TABLES, chunk_size=50, parallelism=3))
        state = run_dump(store, lambda: PostgresChunkSource(dbs.config), "full")
        assert state == "done"
        written_during_dump = len(writer.transactions())
        transactions = writer.stop()
        wait_caught_up(dbs)
    finally:
        writer.kill()
        tailer.stop()

    assert compare(dbs.source_dsn, dbs.target_dsn) == []
    events = list(read_events(ndjson_dir))
    assert backwards(events) == []
    assert state_differences(source_state(dbs.config), materialize(events)) == []

    status = store.dump_status("full")
    assert status is not None and status.state == "done"
    assert status.rows >= 3 * 600 * 0.8, "pre-existing rows reach the outputs through the dump"
    assert status.chunks >= 3 * 600 // 50
    dump_events = [e for e in events if e.source.origin is Origin.DUMP]
    # Rows read by a chunk but changed in its window are dropped: the log event carries them.
    assert status.rows * 0.8 <= len(dump_events) <= status.rows
    assert len(transactions) > written_during_dump > 20, "the writer wrote during the dump"
    first, last = dump_events[0].position, dump_events[-1].position
    interleaved = [e for e in events if e.source.origin is Origin.LOG and first < e.position < last]
    assert interleaved, "log events are interleaved with the dump's chunks"
