"""Two `dblog tail` processes on one NDJSON directory: the leader frozen (SIGSTOP) under a
write workload is replaced within the lease plus a margin, its batch never lands once it wakes,
and each process stopped with SIGTERM ends its log with one line saying why and where."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.outputs.ndjson import FENCE_FILE
from airflow_provider_dblog.state import StateStore
from tests.integration.e2e_support import (
    Databases,
    TailProcess,
    Writer,
    backwards,
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
LEASE_TTL_MS = 3000
MARGIN_S = 20
"""Above the lease: the standby's poll, its session start and first batch on a loaded host."""


@pytest.fixture
def source(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, 0, target=False, seed_value=0)
    yield databases
    drop_databases(databases)


def last_line(log: Path) -> str:
    return log.read_text().rstrip("\n").rsplit("\n", 1)[-1]


def test_a_frozen_leader_is_replaced_within_the_lease_and_each_stop_is_logged(
    source: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    dbs = source
    store = StateStore(redis_server.client(), dbs.config.name)
    events_dir = tmp_path / "events"
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(events_dir)},
        {"lease_ttl_ms": LEASE_TTL_MS, "heartbeat_s": 0.2, "batch_events": 500},
    )
    env = cli_env(dbs, redis_server)
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    first = TailProcess(config, "tailer-a", env, a_log)
    second: TailProcess | None = None
    writer: Writer | None = None
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "tailer-a leading")
        second = TailProcess(config, "tailer-b", env, b_log)
        wait_until(lambda: "is a standby" in b_log.read_text(), 60, "a standby")
        writer = Writer(dbs, tmp_path, seed_value=37, per_s=None)
        writer.wait_for(200, 60)

        first.process.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        leading = re.compile(r"tailer tailer-b holds the lease \(token (\d+)\)")
        wait_until(lambda: leading.search(b_log.read_text()) is not None, 60, "tailer-b leading")
        token = int(cast(re.Match[str], leading.search(b_log.read_text())).group(1))
        fence = events_dir / FENCE_FILE
        wait_until(lambda: fence.read_text() == f"{token}\n", 60, "tailer-b writing the output")
        took = time.monotonic() - frozen
        assert took < LEASE_TTL_MS / 1000 + MARGIN_S, f"tailer-b wrote {took:.1f}s after"
        writer.wait_for(len(writer.transactions()) + 50, 60)

        first.process.send_signal(signal.SIGCONT)
        wait_until(
            lambda: "waiting for the lease again" in a_log.read_text(), 60, "tailer-a standing by"
        )
        writer.stop()
        wait_caught_up(dbs)
        assert first.stop() == 0 and second.stop() == 0
    finally:
        if writer is not None:
            writer.kill()
        first.process.send_signal(signal.SIGCONT)
        for tail in (first, second):
            if tail is not None and tail.alive():
                tail.stop()

    assert last_line(a_log).endswith("tailer tailer-a stopped on SIGTERM as a standby")
    checkpoint = store.tailer.load_checkpoint()
    assert last_line(b_log).endswith(
        f"tailer tailer-b stopped on SIGTERM at acknowledged position {checkpoint}"
    )
    events = list(read_events(events_dir))
    assert backwards(events) == [], "a key went back to an older position"
    positions = [e.position for e in events]
    assert positions == sorted(set(positions)), "positions strictly increase in output order"
    assert state_differences(source_state(dbs.source), materialize(events)) == []
