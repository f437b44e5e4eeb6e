"""Redis restarted from an older append-only file (what a failover to a replica that lagged, or a
restore, does to the state store): the windows, the dump's progress and the checkpoint written
since are gone. The chunks whose windows were lost are read again, not skipped; the dump
completes and the NDJSON stream replays to the source, positions strictly increasing."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs import NdjsonOutput, read_events
from airflow_provider_dblog.state import DumpState, StateStore
from airflow_provider_dblog.tailer import Tailer, TailerSettings
from tests.integration.e2e_support import (
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
AOF = "appendonlydir"


def test_a_dump_under_writes_survives_redis_going_back_to_an_older_aof(
    pg15: PostgresInfo, tmp_path: Path
) -> None:
    dbs = make_databases(pg15, 2000, target=False, seed_value=29)
    try:
        with RedisServer(tmp_path / "redis") as redis_server:
            store = StateStore(redis_server.info.client(), dbs.config.name)
            dbs.source.ensure_setup()
            settings = TailerSettings(reconnect_max_s=1.0, heartbeat_s=0.2)
            tailer = Tailer(dbs.source, store, NdjsonOutput(tmp_path / "events"), settings=settings)
            stop = threading.Event()
            tailing = tailer.start(stop)
            writer = Writer(dbs, tmp_path, seed_value=30)
            store.dumps.create(DumpRequest("d", DumpKind.ALL, dbs.tables, chunk_size=100))
            ended: list[DumpState] = []
            dumping = threading.Thread(
                target=lambda: ended.append(run_dump(store, dbs.source.chunk_source, "d"))
            )
            try:
                dumping.start()
                wait_until(lambda: _chunks(store) >= 5, 120, "five chunks dumped")
                older = tmp_path / "older-aof"
                shutil.copytree(redis_server.data_dir / AOF, older)
                at_copy = _chunks(store)
                wait_until(lambda: _chunks(store) >= at_copy + 10, 120, "ten chunks more")
                redis_server.kill()
                shutil.rmtree(redis_server.data_dir / AOF)
                shutil.copytree(older, redis_server.data_dir / AOF)
                redis_server.start()
                assert _chunks(store) < at_copy + 10, "Redis went back to the older state"
                dumping.join(300)
                assert ended == [DumpState.DONE], store.dumps.status("d")
                writer.stop()
                wait_caught_up(dbs, 120)
            finally:
                writer.kill()
                stop.set()
                tailing.join(60)
                dumping.join(60)
        events = list(read_events(tmp_path / "events"))
        assert backwards(events) == []
        assert state_differences(source_state(dbs.source), materialize(events)) == []
    finally:
        drop_databases(dbs)


def _chunks(store: StateStore) -> int:
    status = store.dumps.status("d")
    return 0 if status is None else status.chunks
