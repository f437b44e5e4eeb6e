"""A dump that adds a read-only window wakes the tailer (Redis pub/sub), which looks for it at
once instead of at its next poll: here the polls while no window is about are made so rare that
only the wakes can arm the dump's windows. On MariaDB the binlog reader's heartbeats (its idle
beats) are made rare too: only a reader woken out of its wait for the stream arms them in time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.event import Origin
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs import NdjsonOutput, read_events
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.sources.mysql.binlog import MysqlLogReader
from airflow_provider_dblog.sources.mysql.source import MysqlSource
from airflow_provider_dblog.state import DumpState, StateStore
from airflow_provider_dblog.tailer import Tailer
from airflow_provider_dblog.tailer import session as tailer_session
from tests.integration.dump.read_only_support import read_only_role
from tests.integration.e2e_support import SOURCES, SourceDatabases, drop_databases, make_source

pytestmark = pytest.mark.integration
ROWS = 600
RARE_HEARTBEAT_S = 600.0
"""A binlog reader idle this long before its beat: far past the dump's window timeout."""


@pytest.fixture(params=SOURCES)
def dbs(request: pytest.FixtureRequest) -> Iterator[SourceDatabases]:
    databases = make_source(request, ROWS, seed_value=7)
    yield databases
    drop_databases(databases)


def test_read_only_chunks_are_armed_by_wakes_not_by_polls(
    dbs: SourceDatabases,
    redis_server: RedisInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tailer_session, "_QUIET_POLLS", 10**9)  # no window about: no poll in years
    source = source_for(read_only_role(dbs).config)
    if isinstance(source, MysqlSource):
        config = source.config
        monkeypatch.setattr(
            source,
            "log_reader",
            lambda resume=None: MysqlLogReader(config, resume, heartbeat_s=RARE_HEARTBEAT_S),
        )
    source.ensure_setup()
    store = StateStore(redis_server.client(), dbs.config.name)
    stop = threading.Event()
    thread = Tailer(source, store, NdjsonOutput(tmp_path / "events")).start(stop)
    try:
        table = dbs.tables[0]
        store.dumps.create(DumpRequest("woken", DumpKind.TABLE, (table,), chunk_size=100))
        # Each chunk waits for its window to be armed; a chunk not armed within the
        # timeout fails the dump (one attempt): only a wake can arm it in time.
        state = run_dump(store, source.chunk_source, "woken", window_timeout_s=60, max_attempts=1)
    finally:
        stop.set()
        # An idle binlog reader waits for its rare beat: a wake gives the boundary it stops at.
        redis_server.client().publish(store.positional.keys.positional_wake, "stop")
        thread.join(60)
    assert not thread.is_alive(), "the tailer did not stop at the wake"
    assert state is DumpState.DONE, store.dumps.status("woken")
    events = list(read_events(tmp_path / "events"))
    dumped = {
        e.key["id"]
        for e in events
        if e.source.origin is Origin.DUMP and e.source.table == table.name
    }
    assert len(dumped) == ROWS
