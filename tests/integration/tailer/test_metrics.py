"""The tailer's Prometheus endpoint on real PostgreSQL and Redis: `dblog tail` processes with
`[tailer] metrics_port` in their TOML (a leader and a standby), scraped over plain HTTP before,
during and after a dump under writes from another process."""

from __future__ import annotations

import random
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest, TableProgress
from airflow_provider_dblog.demo.postgres import TABLES
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.process import free_port
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.state import StateStore
from tests.integration.e2e_support import (
    Databases,
    TailProcess,
    Writer,
    cli_env,
    drop_databases,
    make_databases,
    wait_caught_up,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
"""{(sample name, its labels): value}"""


def scrape(port: int) -> Samples:
    """GET /metrics and parse it as Prometheus does."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def in_state(port: int, state: str) -> bool:
    try:
        samples = scrape(port)
    except (urllib.error.URLError, ConnectionError):
        return False  # not serving yet
    return total(samples, "dblog_tailer_state", state=state) == 1


@pytest.fixture
def dbs(postgres: PostgresInfo) -> Iterator[Databases]:
    """A private source, 300 rows per table before capture starts, on PostgreSQL 15 and 18."""
    databases = make_databases(postgres, 300, target=False, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


def test_the_metrics_move_during_a_dump_and_the_lag_returns_to_zero(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """A leader and a standby, each with its own endpoint; the leader's counters move while a
    dump runs and end equal to the dump's own counts, and its lag returns to zero."""
    store = StateStore(redis_server.client(), dbs.config.name)
    port, standby_port = free_port(), free_port()

    def tail(owner: str, metrics_port: int) -> TailProcess:
        config = write_config(
            tmp_path / f"{owner}.toml",
            dbs,
            redis_server,
            {"type": "ndjson", "directory": str(tmp_path / "events")},
            {"heartbeat_s": 0.2, "metrics_port": metrics_port},
        )
        return TailProcess(config, owner, cli_env(dbs, redis_server), tmp_path / f"{owner}.log")

    tailer = tail("leader", port)
    standby: TailProcess | None = None
    writer: Writer | None = None
    during: list[Samples] = []

    def scrape_once(dump_id: str, progress: TableProgress) -> None:
        if not during:
            during.append(scrape(port))

    try:
        wait_until(lambda: in_state(port, "leading"), 60, "the tailer leading, as scraped")
        before = scrape(port)
        standby = tail("standby", standby_port)
        wait_until(lambda: in_state(standby_port, "standby"), 60, "the standby, as scraped")
        waiting = scrape(standby_port)
        writer = Writer(dbs, tmp_path, seed_value=random.randrange(1 << 30))
        writer.wait_for(10)
        store.dumps.create(DumpRequest("m", DumpKind.ALL, TABLES, chunk_size=50, parallelism=2))
        assert run_dump(store, dbs.source.chunk_source, "m", on_progress=scrape_once) == "done"
        transactions = writer.stop()
        wait_caught_up(dbs)

        def caught_up() -> bool:
            samples = scrape(port)
            lag = total(samples, "dblog_tailer_lag_seconds")
            return lag == 0 and total(samples, "dblog_tailer_log_behind_bytes") == 0

        wait_until(caught_up, 60, "the lag in bytes and seconds back to zero")
        after = scrape(port)
    finally:
        if writer is not None:
            writer.kill()
        if standby is not None:
            assert standby.stop() == 0, (tmp_path / "standby.log").read_text()
        assert tailer.stop() == 0, (tmp_path / "leader.log").read_text()

    assert total(before, "dblog_tailer_lease_token") > 0
    assert total(waiting, "dblog_tailer_lease_token") == 0
    assert not any(name == "dblog_tailer_log_behind_bytes" for name, _ in waiting), "standby"
    assert total(before, "dblog_tailer_windows_closed_total") == 0
    assert total(before, "dblog_tailer_chunk_rows_emitted_total") == 0

    # During the dump: a window has closed and its rows were emitted before its progress moved.
    assert during, "the dump reported progress"
    assert total(during[0], "dblog_tailer_windows_closed_total") >= 1
    assert total(during[0], "dblog_tailer_chunk_rows_emitted_total") > 0

    status = store.dumps.status("m")
    assert status is not None
    closed = total(after, "dblog_tailer_windows_closed_total")
    assert closed == status.chunks > total(during[0], "dblog_tailer_windows_closed_total")
    assert total(after, "dblog_tailer_windows_opened_total") >= closed
    emitted = total(after, "dblog_tailer_chunk_rows_emitted_total")
    dropped = total(after, "dblog_tailer_chunk_rows_dropped_total")
    assert emitted + dropped == status.rows
    assert total(after, "dblog_tailer_events_total", op="r") == emitted
    for table in TABLES:
        labels = {"schema": table.schema, "table": table.name}
        assert total(after, "dblog_tailer_events_total", op="r", **labels) > 0, table
        assert total(after, "dblog_tailer_chunk_rows_emitted_total", **labels) > 0, table
    changes = sum(len(t["changes"]) for t in transactions)
    log_events = sum(total(after, "dblog_tailer_events_total", op=op) for op in "cud")
    assert log_events >= changes > 0, "every committed change was counted"
    assert total(after, "dblog_tailer_windows_open") == 0
    assert total(after, "dblog_tailer_output_batch_seconds_count") > 0
    assert total(after, "dblog_tailer_log_retained_bytes") >= 0
    assert total(after, "dblog_tailer_lease_token") == total(before, "dblog_tailer_lease_token")


def test_windows_met_again_after_a_restart_are_not_counted_as_failed(
    pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """A tailer SIGKILLed mid-dump, before any checkpoint (`checkpoint_s` an hour), and
    started again: it re-reads the log from the slot's start and meets the watermarks of the
    windows closed before the kill. It counts them as replayed, not failed, and the dump ends."""
    dbs = make_databases(pg15, 200, target=False, seed_value=random.randrange(1 << 30))
    store = StateStore(redis_server.client(), dbs.config.name)
    port = free_port()
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(tmp_path / "events")},
        {"heartbeat_s": 0.2, "checkpoint_s": 3600, "metrics_port": port},
    )
    tailer = TailProcess(config, "tailer", cli_env(dbs, redis_server), tmp_path / "tail.log")
    closed_before_kill: list[float] = []

    def restart_after_three_chunks(dump_id: str, progress: TableProgress) -> None:
        if progress.chunks_done == 3 and not closed_before_kill:
            closed_before_kill.append(total(scrape(port), "dblog_tailer_windows_closed_total"))
            tailer.kill()
            tailer.start()

    try:
        wait_until(lambda: in_state(port, "leading"), 60, "the tailer leading, as scraped")
        orders = dbs.table("orders")
        store.dumps.create(DumpRequest("r", DumpKind.TABLE, (orders,), chunk_size=20))
        state = run_dump(
            store, dbs.source.chunk_source, "r", on_progress=restart_after_three_chunks
        )
        assert state == "done", store.dumps.status("r")
        # No checkpoint moves the slot: caught up is the lag back to 0 as scraped.
        wait_until(lambda: total(scrape(port), "dblog_tailer_lag_seconds") == 0, 60, "caught up")
        after = scrape(port)
    finally:
        if tailer.alive():
            assert tailer.stop() == 0, (tmp_path / "tail.log").read_text()[-3000:]
        drop_databases(dbs)

    assert closed_before_kill == [3], "the kill came after three windows closed"
    assert total(after, "dblog_tailer_windows_replayed_total") >= 3, "replayed before the kill"
    assert total(after, "dblog_tailer_windows_failed_total") == 0
    health = store.tailer.health()
    assert health is not None and health.metrics["windows_failed"] == 0, health
