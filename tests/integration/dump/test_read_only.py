"""Read-only sources (`[source] read_only = true`): the dump's watermarks are log positions, so
a role that may read the captured tables and the log, and write nothing at all, dumps them.

On PostgreSQL and MariaDB, under concurrent writes from another role, every table is dumped
while the tailer (`dblog tail`, a process of its own) is SIGKILLed and replaced: the windows it
armed fail and are read again, and the NDJSON replay equals the source with no time travel.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import StateStore
from tests.integration.dump.read_only_support import (
    RO_PASSWORD_ENV,
    read_only_role,
    refuses_writes,
    write_config,
)
from tests.integration.e2e_support import (
    REDIS_PASSWORD_ENV,
    SOURCES,
    SourceDatabases,
    TailProcess,
    Writer,
    backwards,
    drop_databases,
    make_source,
    materialize,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture(params=SOURCES)
def dbs(request: pytest.FixtureRequest) -> Iterator[SourceDatabases]:
    databases = make_source(request, 300, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


def test_a_read_only_role_dumps_under_writes_through_a_tailer_kill(
    dbs: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    role = read_only_role(dbs)
    assert refuses_writes(dbs, role), "the role must have no write grant"
    config = write_config(tmp_path / "ro.toml", dbs, role.toml, RO_PASSWORD_ENV, redis_server)
    env = dict(
        os.environ, **{RO_PASSWORD_ENV: role.password, REDIS_PASSWORD_ENV: redis_server.password}
    )
    store = StateStore(redis_server.client(), dbs.config.name)
    tailers = [TailProcess(config, "ro-1", env, tmp_path / "tail-1.log")]
    writer: Writer | None = None
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the read-only tailer leading")
        writer = Writer(dbs, tmp_path, seed_value=random.randrange(1 << 30))
        writer.wait_for(10)
        store.dumps.create(
            DumpRequest("ro", DumpKind.ALL, dbs.tables, chunk_size=30, parallelism=2)
        )
        source = source_for(role.config)
        ended: list[str] = []
        dump = threading.Thread(
            target=lambda: ended.append(run_dump(store, source.chunk_source, "ro"))
        )
        dump.start()

        def chunks_done() -> int:
            status = store.dumps.status("ro")
            return 0 if status is None else status.chunks

        wait_until(lambda: chunks_done() >= 3, 120, "three chunks dumped")
        tailers[0].kill()
        tailers.append(TailProcess(config, "ro-2", env, tmp_path / "tail-2.log"))
        dump.join(300)
        assert ended == ["done"], f"dump ended {ended}; see {tmp_path}"
        assert writer.stop(), "the writer committed transactions"
        writer = None
        wait_caught_up(dbs, store=store)
    finally:
        if writer is not None:
            writer.stop()
        for tailer in tailers:
            tailer.stop()
    events = list(read_events(tmp_path / "events"))
    assert backwards(events) == []
    assert state_differences(source_state(dbs.source), materialize(events)) == []
    status = store.dumps.status("ro")
    assert status is not None and status.rows >= 900
