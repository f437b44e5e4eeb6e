"""Filtered dumps (`dblog dump --table T --where ...`) on PostgreSQL and MariaDB.

Under a write workload, with the tailer SIGKILLed and restarted mid-dump: every row the dump
emitted matched the filter, every row that matches it and that no write touched was emitted,
and no key goes back to an older version. Bad filters are refused by `dblog dump` with a message
naming the problem, and nothing is registered.
"""

from __future__ import annotations

import random
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.event import Origin
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.state import DumpState, StateStore
from tests.integration.e2e_support import (
    SOURCES,
    SourceDatabases,
    TailProcess,
    Writer,
    backwards,
    cli_env,
    drop_databases,
    make_source,
    row_key,
    run_cli,
    source_state,
    versions_back,
    wait_caught_up,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration
ROWS = 600
FILTER = "active AND owner LIKE '%7%'"
"""Seeded accounts are `owner-<id>` and active when id % 3 > 0; the `%` must reach the server."""


def matches(row: dict[str, Any]) -> bool:
    return bool(row["active"]) and "7" in str(row["owner"])


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest) -> Iterator[SourceDatabases]:
    databases = make_source(request, ROWS, random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


def test_a_filtered_dump_emits_the_matching_rows_through_writes_and_a_tailer_kill(
    source: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    dbs = source
    accounts = dbs.table("accounts")
    store = StateStore(redis_server.client(), dbs.config.name)
    events_dir = tmp_path / "events"
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(events_dir)},
        {"heartbeat_s": 0.2, "window_ttl_s": 10, "reconnect_max_s": 2, "lease_ttl_ms": 2000},
    )
    tail = TailProcess(config, "tailer", cli_env(dbs, redis_server), tmp_path / "tail.log")
    writer: Writer | None = None
    try:
        wait_until(lambda: store.tailer.health() is not None, 30, "the tailer's first heartbeat")
        writer = Writer(dbs, tmp_path, seed_value=random.randrange(1000))
        writer.wait_for(20)
        chunks = dbs.source.chunk_source()
        where = chunks.check_filter(accounts, FILTER)
        chunks.close()
        store.dumps.create(
            DumpRequest("filtered", DumpKind.TABLE, (accounts,), chunk_size=40, where=where)
        )
        ended: list[object] = []
        dump = threading.Thread(
            target=lambda: ended.append(
                run_dump(store, dbs.source.chunk_source, "filtered", window_timeout_s=10)
            ),
            daemon=True,
        )
        dump.start()

        def chunks_done(count: int) -> bool:
            status = store.dumps.status("filtered")
            return dump.is_alive() is False or (status is not None and status.chunks >= count)

        wait_until(lambda: chunks_done(4), 120, "the filtered dump at 4 chunks")
        tail.kill()
        tail.start()
        dump.join(180)
        assert not dump.is_alive() and ended == [DumpState.DONE], ended
        transactions = writer.stop()
        wait_caught_up(dbs, store=store)
        assert tail.stop() == 0, (tmp_path / "tail.log").read_text()[-3000:]
    finally:
        if writer is not None:
            writer.kill()
        if tail.alive():
            tail.kill()

    events = list(read_events(events_dir))
    assert backwards(events) == [] and versions_back(events) == []
    dumped = {
        row_key(e.source.table, e.key.values()): e.after
        for e in events
        if e.source.origin is Origin.DUMP
    }
    assert dumped, "the filtered dump emitted no row"
    assert [k for k, row in dumped.items() if row is None or not matches(row)] == []
    assert all(k[0] == "accounts" for k in dumped)
    written = {row_key(table, key) for t in transactions for table, key in t["changes"]}
    untouched = {
        k
        for k, row in source_state(dbs.source, [accounts]).items()
        if k not in written and matches(row)
    }
    assert untouched, "no untouched row matches the filter: the test checks nothing"
    assert sorted(untouched - dumped.keys()) == []


def refusals(kind: str) -> list[tuple[str, str]]:
    """(filter, what the refusal says) for `kind`'s dialect."""
    common = [
        ("owner = = 'x'", "not valid"),
        ("no_such_column = 1", "not valid"),
        ("id = 1; DROP TABLE accounts", "no ';'"),
        ("id IN (SELECT id FROM orders)", "no subquery"),
        ("id = 1) OR (true", "closes a parenthesis"),
    ]
    if kind == "postgres":
        return [
            *common,
            ("pg_sleep(1) IS NOT NULL", "volatile"),
            ("id = nextval('e2e_version_seq')", "volatile"),
            ("id = random()", "volatile"),
            ("EXISTS (TABLE orders)", "reads table"),
        ]
    return [*common, ("SLEEP(1) = 0", "blocks"), ("id = RAND()", "blocks")]


def test_bad_filters_are_refused_by_name_and_nothing_is_registered(
    source: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    dbs = source
    store = StateStore(redis_server.client(), dbs.config.name)
    config = write_config(
        tmp_path / "dblog.toml", dbs, redis_server, {"type": "ndjson", "directory": str(tmp_path)}
    )
    env = cli_env(dbs, redis_server)
    # The watermark table exists, so only the filter can be what is refused.
    dbs.source.ensure_setup()
    table = str(dbs.table("accounts"))
    cases = [
        *[(["--table", table, "--where", text], said) for text, said in refusals(dbs.kind)],
        (["--where", "id > 1"], "exactly one table"),
        (["--table", "nowhere.accounts", "--where", "id > 1"], "not captured"),
        (["--table", table, "--keys", "1", "--where", "id > 1"], "exactly one table and no keys"),
    ]
    for args, said in cases:
        done = run_cli("dump", "-c", str(config), "--dump-id", "bad", *args, env=env)
        assert done.returncode != 0 and said in done.stderr, (args, _said(done))
        assert "Traceback" not in done.stderr, (args, _said(done))
    assert store.dumps.ids() == [], "a refused request was registered"


def test_a_filter_with_a_stable_function_is_taken(
    source: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """A condition on the clock (`now()`; MySQL's `NOW()`) is a filter users write ("since
    Monday"): it is taken, and normalised only by trimming."""
    chunks = source.source.chunk_source()
    try:
        taken = chunks.check_filter(source.table("accounts"), "  updated <= now() AND active ")
    finally:
        chunks.close()
    assert taken == "updated <= now() AND active"


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return (done.stdout + done.stderr)[-2000:]
