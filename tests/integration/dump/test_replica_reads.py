"""Chunk reads from a replica (`[source] read_replica`): the tailer follows the primary's log,
each chunk is read on the replica once it has applied what its window needs.

On PostgreSQL (a hot standby) and MariaDB (a GTID replica), with written watermarks and
read-only, under concurrent writes: the replica's replay is paused mid-dump, the dump pauses
and says why in its status (the replica's lag), for longer than its patience for a source
away (a replica behind is not an outage), and once replay resumes it completes; the NDJSON
replay equals the primary with no time travel.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.devservices.mariadb_replica import MariaDBReplicaInfo
from airflow_provider_dblog.devservices.pg_replica import PostgresReplicaInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import StateStore
from tests.integration.dump.read_only_support import (
    RO_PASSWORD_ENV,
    read_only_role,
    write_config,
)
from tests.integration.e2e_support import (
    REDIS_PASSWORD_ENV,
    SOURCES,
    MysqlDatabases,
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
REPLICA_WAIT_S = 2
PATIENCE_S = 1.0


def replica_fixture(kind: str) -> str:
    return "mariadb_replica" if kind == "mariadb" else "pg15_replica"


@pytest.fixture(params=SOURCES)
def dbs(request: pytest.FixtureRequest) -> Iterator[SourceDatabases]:
    # The replica first: a MariaDB replica seeded later would miss the source's grants.
    request.getfixturevalue(replica_fixture(request.param))
    databases = make_source(request, 200, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


Replica = PostgresReplicaInfo | MariaDBReplicaInfo


def replica_dsn(dbs: SourceDatabases, replica: Replica, user: str) -> str:
    if isinstance(dbs, MysqlDatabases):
        return f"mysql://{user}@{replica.host}:{replica.port}/{dbs.source_db}"
    return f"host={replica.host} port={replica.port} dbname={dbs.source_db} user={user}"


@pytest.mark.parametrize("read_only", [False, True], ids=["watermarks", "read-only"])
def test_chunks_read_on_a_paused_replica_wait_for_it_and_converge(
    dbs: SourceDatabases,
    read_only: bool,
    request: pytest.FixtureRequest,
    redis_server: RedisInfo,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kind = "mariadb" if isinstance(dbs, MysqlDatabases) else "postgres"
    replica: Replica = request.getfixturevalue(replica_fixture(kind))
    replica.wait_caught_up()  # the source's database and grants are there too
    if read_only:
        role = read_only_role(dbs)
        user, toml, password_env, password = role.user, role.toml, RO_PASSWORD_ENV, role.password
        base = role.config
    else:
        user = dbs.info.user if isinstance(dbs, MysqlDatabases) else dbs.pg.user
        toml, password_env, password = dbs.toml_source(), dbs.password_env, dbs.password
        base = dbs.config
    dsn = replica_dsn(dbs, replica, user)
    toml = [*toml, f'read_replica = "{dsn}"', f"replica_wait_s = {REPLICA_WAIT_S}"]
    config = write_config(tmp_path / "replica.toml", dbs, toml, password_env, redis_server)
    env = dict(os.environ, **{password_env: password, REDIS_PASSWORD_ENV: redis_server.password})
    source = source_for(
        dataclasses.replace(base, read_replica=dsn, replica_wait_s=REPLICA_WAIT_S)  # type: ignore[type-var]
    )
    store = StateStore(redis_server.client(), dbs.config.name)
    tailer = TailProcess(config, "replica-reads", env, tmp_path / "tail.log")
    writer: Writer | None = None
    paused = False
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the tailer leading")
        writer = Writer(dbs, tmp_path, seed_value=random.randrange(1 << 30))
        writer.wait_for(10)
        store.dumps.create(DumpRequest("r", DumpKind.ALL, dbs.tables, chunk_size=20, parallelism=2))
        ended: list[str] = []
        # A patience for a source away far below the pause: the pause must not spend it.
        dump = threading.Thread(
            target=lambda: ended.append(
                run_dump(store, source.chunk_source, "r", source_patience_s=PATIENCE_S)
            )
        )
        dump.start()

        def status_reason() -> str:
            status = store.dumps.status("r")
            return "" if status is None else status.reason

        wait_until(lambda: chunks(store) >= 2, 120, "two chunks dumped")
        replica.pause_replay()
        paused = True
        caplog.set_level(logging.WARNING, logger="airflow_provider_dblog.dump.runner")
        wait_until(
            lambda: status_reason().startswith("paused until the read replica catches up: "),
            120,
            "the dump saying it waits for the replica",
        )
        wait_until(
            lambda: sum(" paused: " in r.getMessage() for r in caplog.records) >= 3,
            120,
            f"three pauses of {REPLICA_WAIT_S}s each: longer than the patience",
        )
        assert not ended, "the dump cannot end while the replica is paused"
        replica.resume_replay()
        paused = False
        dump.join(300)
        assert ended == ["done"], f"dump ended {ended}; see {tmp_path}"
        assert writer.stop(), "the writer committed transactions"
        writer = None
        wait_caught_up(dbs, store=store)
    finally:
        if paused:
            replica.resume_replay()
        if writer is not None:
            writer.stop()
        tailer.stop()
    events = list(read_events(tmp_path / "events"))
    assert backwards(events) == []
    assert state_differences(source_state(dbs.source), materialize(events)) == []


def chunks(store: StateStore) -> int:
    status = store.dumps.status("r")
    return 0 if status is None else status.chunks
