"""A Redis that answers but refuses writes (full under `maxmemory` with `noeviction`, a replica
that answers READONLY as a demoted primary does, or MISCONF after a failed save) is told apart
from one that is away, named with the fix, and waited out: the tailer and a dump back off and go
on once it takes writes again, losing nothing."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs import NdjsonOutput, read_events
from airflow_provider_dblog.state import DumpState, StateStore, StateStoreRefusesWrites
from airflow_provider_dblog.tailer import Tailer, TailerSettings
from tests.integration.e2e_support import (
    drop_databases,
    make_databases,
    materialize,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
)

pytestmark = pytest.mark.integration
Refusal = Callable[[redis.Redis, Path], Callable[[], None]]
"""Makes the Redis refuse writes; returns what makes it take them again."""


def full(client: redis.Redis, _: Path) -> Callable[[], None]:
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")
    return lambda: client.config_set("maxmemory", "0")


def replica(client: redis.Redis, _: Path) -> Callable[[], None]:
    """A replica of a primary that is not there: it keeps its data and refuses writes."""
    client.replicaof("127.0.0.1", "1")
    return lambda: client.replicaof("NO", "ONE")


def unsaved(client: redis.Redis, _: Path) -> Callable[[], None]:
    """A background save that cannot rename its file into place (a directory holds the name)
    fails; with save points set, Redis then refuses writes until a save succeeds."""
    blocker = Path(client.config_get("dir")["dir"]) / client.config_get("dbfilename")["dbfilename"]
    (blocker / "in-the-way").mkdir(parents=True)
    client.config_set("save", "3600 1")
    client.bgsave()
    wait_until(lambda: _last_save(client) == "err", 30, "the background save failing")

    def fixed() -> None:
        shutil.rmtree(blocker)
        client.bgsave()
        wait_until(lambda: _last_save(client) == "ok", 30, "a background save succeeding")

    return fixed


def _last_save(client: redis.Redis) -> str:
    info = client.info("persistence")
    return "busy" if info["rdb_bgsave_in_progress"] else str(info["rdb_last_bgsave_status"])


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[redis.Redis]:
    with RedisServer(tmp_path / "redis") as server:
        yield server.info.client()


@pytest.mark.parametrize(
    ("refuse", "named"),
    [
        (full, "it is full .*raise maxmemory"),
        (replica, "it is a read-only replica .*point \\[redis\\] at the primary"),
        (unsaved, "it cannot save to disk .*MISCONF"),
    ],
    ids=["oom", "readonly", "misconf"],
)
def test_each_refusal_is_named_reads_go_on_and_writes_resume(
    private_redis: redis.Redis, tmp_path: Path, refuse: Refusal, named: str
) -> None:
    store = StateStore(private_redis, "refusals")
    store.dumps.create(_request("before"))
    take_writes = refuse(private_redis, tmp_path)
    with pytest.raises(StateStoreRefusesWrites, match=f"refuses writes: {named}"):
        store.dumps.create(_request("during"))
    assert store.dumps.get("before") is not None, "reads go on"
    assert store.dumps.get("during") is None, "the refused write made nothing"
    take_writes()
    store.dumps.create(_request("after"))
    assert store.dumps.get("after") is not None


def test_the_tailer_and_a_dump_wait_for_a_full_redis_and_lose_nothing(
    private_redis: redis.Redis,
    pg15: PostgresInfo,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Mid-dump, under writes, Redis fills up: the tailer says why it stopped (`dblog status`
    reads its state), both wait, and once Redis has room the dump completes and the NDJSON
    replays to the source."""
    caplog.set_level(logging.WARNING)
    dbs = make_databases(pg15, 3000, target=False, seed_value=28)
    dbs.source.ensure_setup()
    store = StateStore(private_redis, dbs.config.name)
    settings = TailerSettings(reconnect_max_s=1.0, heartbeat_s=0.2)
    tailer = Tailer(dbs.source, store, NdjsonOutput(tmp_path / "events"), settings=settings)
    stop = threading.Event()
    tailing = threading.Thread(target=tailer.run, args=(stop,))
    request = DumpRequest("d", DumpKind.ALL, dbs.tables, chunk_size=100)
    store.dumps.create(request)
    outcome: list[DumpState] = []
    dumping = threading.Thread(
        target=lambda: outcome.append(run_dump(store, dbs.source.chunk_source, "d"))
    )
    try:
        tailing.start()
        wait_until(lambda: store.tailer.health() is not None, 60, "the tailer leading")
        dumping.start()
        wait_until(lambda: _chunks_done(store) >= 3, 60, "the dump under way")
        take_writes = full(private_redis, tmp_path)
        with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
            for i in range(20):
                conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s", (i + 1,))
        wait_until(lambda: "refuses writes" in tailer.stats.state, 60, "the tailer waiting")
        wait_until(
            lambda: any("refuses writes" in r.getMessage() for r in _dump_records(caplog)),
            60,
            "the dump waiting",
        )
        take_writes()
        dumping.join(240)
        assert outcome == [DumpState.DONE]
        wait_caught_up(dbs, 120)
    finally:
        stop.set()
        tailing.join(60)
        dumping.join(60)
        try:
            events = list(read_events(tmp_path / "events"))
            assert state_differences(source_state(dbs.source), materialize(events)) == []
        finally:
            drop_databases(dbs)
    refusals = [r for r in caplog.records if "refuses writes" in r.getMessage()]
    assert all("\n" not in r.getMessage() for r in refusals), "one line each"


def _request(dump_id: str) -> DumpRequest:
    return DumpRequest(dump_id, DumpKind.TABLE, (TableRef("public", "t"),))


def _chunks_done(store: StateStore) -> int:
    status = store.dumps.status("d")
    return 0 if status is None else status.chunks


def _dump_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("airflow_provider_dblog.dump")]
