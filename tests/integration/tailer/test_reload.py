"""Tables added to and removed from capture while `dblog tail` runs, on PostgreSQL and MariaDB:
the TOML edited and SIGHUP sent, under a write workload. A table added is followed from the
reload on and, with `--dump-added`, dumped by the tailer's process, so the NDJSON rebuilds it,
through a SIGKILL of the tailer;
a table removed has no event committed after the reload; both reloads are recorded for
`dblog status`. A reload that changes anything else is refused and changes nothing."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_dblog.core.event import Op, Origin, TableRef
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.state import DumpState, StateStore
from tests.integration.e2e_support import (
    SOURCES,
    SourceDatabases,
    TailProcess,
    Writer,
    backwards,
    capturing,
    cli_env,
    drop_databases,
    make_source,
    materialize,
    run_cli,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest) -> Iterator[SourceDatabases]:
    databases = make_source(request, 300, random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


def test_tables_added_and_removed_by_a_reload_under_writes(
    source: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    dbs = source
    accounts, orders = dbs.table("accounts"), dbs.table("orders")
    store = StateStore(redis_server.client(), dbs.config.name)
    events_dir = tmp_path / "events"
    output = {"type": "ndjson", "directory": str(events_dir)}
    path = tmp_path / "dblog.toml"
    tailer = {"heartbeat_s": 0.2}
    write_config(path, capturing(dbs, "accounts"), redis_server, output, tailer)
    env = cli_env(dbs, redis_server)
    tail = TailProcess(path, "tailer", env, tmp_path / "tail.log", extra=("--dump-added",))
    writer: Writer | None = None
    try:
        wait_until(lambda: store.tailer.health() is not None, 30, "the tailer's first heartbeat")
        writer = Writer(dbs, tmp_path, seed_value=random.randrange(1000))
        writer.wait_for(20)

        write_config(path, capturing(dbs, "accounts", "orders"), redis_server, output, tailer)
        tail.reload()
        wait_until(lambda: recorded(store, added=[orders]), 60, "the reload adding orders")
        wait_until(lambda: dump_of(store, orders) is DumpState.DONE, 180, "orders dumped")
        leads = (tmp_path / "tail.log").read_text().count("holds the lease")
        tail.kill()  # a restarted tailer reads the edited TOML: it follows orders from the start
        tail.start()
        wait_until(
            lambda: (tmp_path / "tail.log").read_text().count("holds the lease") > leads,
            60,
            "the restarted tailer leading (its SIGHUP handler in place)",
        )

        write_config(path, capturing(dbs, "orders"), redis_server, output, tailer)
        tail.reload()
        wait_until(lambda: recorded(store, removed=[accounts]), 60, "the reload of accounts")
        removed_at_ms = store.tailer.tables_changes()[0].at_ms
        writer.wait_for(len(writer.transactions()) + 20)

        refused = dict(output, directory=str(tmp_path / "elsewhere"))
        write_config(path, capturing(dbs, "orders"), redis_server, refused, tailer)
        tail.reload()
        wait_until(
            lambda: "reload refused" in (tmp_path / "tail.log").read_text(), 60, "the refusal"
        )
        writer.stop()
        wait_caught_up(dbs, store=store)
        status = run_cli("status", "-c", str(path), "--json", env=env)
        table = run_cli("status", "-c", str(path), env=env).stdout
        assert tail.stop() == 0, (tmp_path / "tail.log").read_text()[-3000:]
    finally:
        if writer is not None:
            writer.kill()
        if tail.alive():
            tail.kill()

    log = (tmp_path / "tail.log").read_text()
    assert "[output] changed: restart dblog tail" in log, log[-3000:]
    assert len(store.tailer.tables_changes()) == 2, "the refused reload was recorded"
    changes = json.loads(status.stdout)["tables"]
    assert [(c["added"], c["removed"]) for c in changes] == [
        ([], [str(accounts)]),
        ([str(orders)], []),
    ]
    assert f"tables: -{accounts} (reloaded" in table and f"tables: +{orders} (" in table, table
    events = list(read_events(events_dir))
    assert backwards(events) == []
    of_orders = [e for e in events if e.source.table == orders.name]
    assert {e.source.origin for e in of_orders if e.op is not Op.SCHEMA} == {
        Origin.LOG,
        Origin.DUMP,
    }
    assert state_differences(source_state(dbs.source, [orders]), materialize(of_orders)) == []
    late = [
        e
        for e in events
        if e.source.table == accounts.name
        and e.source.origin is Origin.LOG
        and e.source.ts_ms is not None
        and e.source.ts_ms > removed_at_ms + 100
    ]
    assert late == [], f"{len(late)} events of accounts committed after its removal"


def recorded(
    store: StateStore, *, added: list[TableRef] | None = None, removed: list[TableRef] | None = None
) -> bool:
    changes = store.tailer.tables_changes()
    if not changes:
        return False
    newest = changes[0]
    return list(newest.added) == (added or []) and list(newest.removed) == (removed or [])


def dump_of(store: StateStore, table: TableRef) -> DumpState | None:
    for dump_id in store.dumps.ids():
        if dump_id.startswith(f"added.{table}."):
            status = store.dumps.status(dump_id)
            return None if status is None else status.state
    return None
