"""`dblog verify --repair auto` after the tailer was killed, on each source: the target is
corrupted behind the tailer's back while a writer writes, the tailer is killed (SIGKILL) and a
new one takes over from the checkpoint, replaying what the old one had not acknowledged (past
the corrupted rows: a row applied again undoes its corruption). The report still names exactly
the corrupted keys, and once repaired and caught up the target equals the source: row for row
on PostgreSQL, by a second verify that finds nothing on MariaDB (its target holds the rows in
PostgreSQL's types)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.verify import Difference
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import VerifyState
from tests.integration.e2e_support import (
    Databases,
    MysqlDatabases,
    SourceDatabases,
    drop_databases,
    make_databases,
    run_cli,
    wait_caught_up,
    wait_until,
)
from tests.integration.verify import test_verify_cli as on_postgres
from tests.integration.verify import test_verify_mariadb as on_mariadb
from tests.integration.verify.deployment import Deployment, running_deployment
from tests.integration.verify.test_verify_mariadb import (  # noqa: F401 (fixtures)
    Target,
    dbs,
    target,
)
from tests.integration.verify.test_verify_repair import rows_of

pytestmark = pytest.mark.integration
Corrupted = list[tuple[TableRef, Difference, tuple[object, ...]]]


@pytest.fixture
def pg_dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, on_postgres.ROWS, target=True, seed_value=43)
    yield databases
    drop_databases(databases)


def kill_the_tailer(deployment: Deployment) -> None:
    """SIGKILL, then a new tailer of another owner, which leads once the lease runs out."""
    deployment.tail.kill()
    deployment.tail.owner = "verify-tailer-after-kill"
    deployment.tail.start()

    def new_leader() -> bool:
        health = deployment.store.tailer.health()
        return health is not None and health.owner == deployment.tail.owner

    wait_until(new_leader, 60, "the new tailer leading")


def verify_repair_and_check(
    source: SourceDatabases,
    deployment: Deployment,
    corrupted: Corrupted,
    equal: Callable[[], None],
) -> None:
    """Kill the tailer, verify and repair while the writer writes; then, caught up, `equal`
    and a second verify that finds nothing."""
    config, env, store, writer = deployment
    # The corruptions stay only once the rows they corrupt are acknowledged: a new tailer
    # replays what was not, and applying a row again undoes its corruption.
    wait_caught_up(source, store=store)
    kill_the_tailer(deployment)
    written = len(writer.transactions())

    done = run_cli(
        *("verify", "-c", str(config), "--verify-id", "k1", "--chunk-size", "120"),
        *("--repair", "auto"),
        env=env,
    )

    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert len(writer.transactions()) > written, "the writer wrote while verify ran"
    found = [(d.table, d.kind, d.key) for d in store.verifies.differences("k1")]
    assert sorted(found, key=repr) == corrupted
    status = store.verifies.status("k1")
    assert status is not None and status.state is VerifyState.DONE
    assert status.removed == 1 and status.repair_dumps, status

    writer.stop()
    wait_caught_up(source, store=store)
    equal()
    again = run_cli("verify", "-c", str(config), "--verify-id", "k2", env=env)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]


def test_a_postgres_target_is_repaired_to_equal_after_a_tailer_kill(
    pg_dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    with running_deployment(pg_dbs, redis_server, tmp_path, pg_dbs.target_dsn) as deployment:
        on_postgres.corrupt_target(pg_dbs)

        def equal() -> None:
            assert rows_of(pg_dbs.source_dsn) == rows_of(pg_dbs.target_dsn)

        verify_repair_and_check(pg_dbs, deployment, on_postgres.CORRUPTED, equal)


def test_a_mariadb_source_s_target_is_repaired_to_equal_after_a_tailer_kill(
    dbs: MysqlDatabases,  # noqa: F811 (the fixture imported above)
    target: Target,  # noqa: F811 (the fixture imported above)
    redis_server: RedisInfo,
    tmp_path: Path,
) -> None:
    with running_deployment(dbs, redis_server, tmp_path, target.dsn) as deployment:
        corrupted = on_mariadb.corrupt_target(dbs, target)
        verify_repair_and_check(dbs, deployment, corrupted, lambda: None)
