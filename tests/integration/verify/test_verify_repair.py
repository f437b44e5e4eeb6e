"""`dblog verify --repair auto` on real servers: a PostgreSQL source, its tailer applying into a
PostgreSQL SQL target, a writer writing all along. The target is corrupted behind the tailer's
back (a row changed, one deleted, one added, a composite-keyed row changed); the run ends with
the extra key removed and a key dump a table of exactly the other corrupted keys, after which
the target equals the source, row for row."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.verify import Difference
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import DumpState, StateStore, VerifyState
from tests.integration.e2e_support import (
    Databases,
    Writer,
    run_cli,
    wait_caught_up,
)
from tests.integration.verify.deployment import Deployment, running_deployment
from tests.integration.verify.test_verify_cli import (
    CORRUPTED,
    corrupt_target,
    dbs,  # noqa: F401 (the fixture)
)

pytestmark = pytest.mark.integration
TABLES = {"accounts": "id", "orders": "region, n", "items": "id"}
"""The captured tables and their keys, to read both sides in one order."""


@pytest.fixture
def deployment(
    dbs: Databases,  # noqa: F811 (the fixture imported above)
    redis_server: RedisInfo,
    tmp_path: Path,
) -> Iterator[Deployment]:
    with running_deployment(dbs, redis_server, tmp_path, dbs.target_dsn, seed_value=7) as d:
        yield d


def rows_of(dsn: str) -> dict[str, list[str]]:
    """Every row of every captured table, as text, in key order."""
    with psycopg.connect(dsn) as conn:
        found = {}
        for table, key in TABLES.items():
            query = f"SELECT t::text FROM {table} t ORDER BY {key}"
            found[table] = [str(row[0]) for row in conn.execute(query)]
        return found


def test_a_repair_removes_the_extra_keys_and_resends_exactly_the_other_differing_ones(
    dbs: Databases,  # noqa: F811 (the fixture imported above)
    deployment: tuple[Path, dict[str, str], StateStore, Writer],
) -> None:
    config, env, store, writer = deployment
    corrupt_target(dbs)
    written = len(writer.transactions())

    done = run_cli(
        *("verify", "-c", str(config), "--verify-id", "r1", "--chunk-size", "120"),
        *("--repair", "auto"),
        env=env,
    )

    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert len(writer.transactions()) > written, "the writer wrote while verify repaired"
    found = [(d.table, d.kind, d.key) for d in store.verifies.differences("r1")]
    assert sorted(found, key=repr) == CORRUPTED
    status = store.verifies.status("r1")
    assert status is not None and status.state is VerifyState.DONE
    assert status.removed == 1, "the extra key, removed inside its window"
    assert status.repair_dumps is not None and len(status.repair_dumps) == 2
    resent: dict[TableRef, list[object]] = {}
    for dump_id in status.repair_dumps:
        stored, dumped = store.dumps.get(dump_id), store.dumps.status(dump_id)
        assert stored is not None and dumped is not None
        assert dumped.state is DumpState.DONE, (dump_id, dumped)
        (table,) = stored.request.tables
        resent[table] = sorted(stored.request.keys, key=repr)
        assert dumped.rows == len(stored.request.keys), "each key's row, and no other"
    wanted: dict[TableRef, list[object]] = {}
    for table, kind, key in CORRUPTED:
        if kind is not Difference.EXTRA:
            wanted.setdefault(table, []).append(key)
    assert resent == {t: sorted(k, key=repr) for t, k in wanted.items()}
    assert f"repair: 1 extra keys removed from the target; key dumps {status.repair_dumps[0]}" in (
        done.stdout
    ), done.stdout

    shown = run_cli("status", "-c", str(config), env=env)
    assert ",".join(["removed:1", *status.repair_dumps]) in shown.stdout, shown.stdout

    writer.stop()
    wait_caught_up(dbs)
    source, target = rows_of(dbs.source_dsn), rows_of(dbs.target_dsn)
    for table in TABLES:
        assert source[table] == target[table], table
    again = run_cli("verify", "-c", str(config), "--verify-id", "r2", env=env)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
