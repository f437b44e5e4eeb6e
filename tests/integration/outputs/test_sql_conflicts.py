"""A transaction of SQL apply that a deadlock rolls back is tried again, not reported as a
target gone away: here the direct dump's prune of tombstones, deadlocked on `dblog_positions`
with another transaction as it can be with the tailer's batch."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from airflow_provider_dblog.core.event import Op, Origin, PlainEvent, SourceInfo, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.outputs.sql_apply import SqlApplyOutput, SqlDirectTarget
from airflow_provider_dblog.outputs.sql_apply.statements import POSITIONS_TABLE
from tests.integration.e2e_support import wait_until

pytestmark = pytest.mark.integration


def _deadlocks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def database(pg15: PostgresInfo) -> Iterator[tuple[str, str]]:
    """A database of its own (its dsn, and the superuser's): the server's default one may hold
    a `dblog` schema, first on the search path of the user of that name but not the
    superuser's, so the two would name different tables unqualified."""
    name = f"conflicts_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg15.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} OWNER {pg15.user}")
    yield make_conninfo(pg15.dsn, dbname=name), make_conninfo(pg15.admin_dsn, dbname=name)
    with psycopg.connect(pg15.admin_dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_a_prune_rolled_back_by_a_deadlock_is_tried_again(database: tuple[str, str]) -> None:
    dsn, admin_dsn = database
    source, name = f"src_{uuid.uuid4().hex[:8]}", f"t_{uuid.uuid4().hex[:8]}"
    table = TableRef("public", name)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE TABLE public.{name} (id int PRIMARY KEY)")
        events = []
        for key in (1, 2):
            row = {"id": key}
            for op, before, after, commit in (
                (Op.CREATE, None, row, 10),
                (Op.DELETE, row, None, 20),
            ):
                info = SourceInfo(source, "db", "public", name, Position(commit, key), Origin.LOG)
                events.append(PlainEvent(op, row, before, after, info, 0))
        with SqlApplyOutput(dsn, monotonic=True) as output:
            output.write(events, 1)
        deadlocks_before = _deadlocks(admin)

    # As the superuser, who may set deadlock_timeout: the prune's session detects the deadlock
    # (2 s after it starts to wait), the blocker's would only after a minute, so the prune is
    # the transaction rolled back.
    target = SqlDirectTarget(make_conninfo(admin_dsn, options="-c deadlock_timeout=2s"), source)
    where = "source = %s AND tbl = %s AND key = %s::jsonb"
    pruned: list[int | BaseException] = []
    with (
        psycopg.connect(admin_dsn) as blocker,
        psycopg.connect(admin_dsn, autocommit=True) as watcher,
    ):
        blocker.execute("SET deadlock_timeout = '1min'")
        blocker.execute(
            f"SELECT 1 FROM {POSITIONS_TABLE} WHERE {where} FOR UPDATE", (source, name, '{"id": 2}')
        )

        def prune() -> None:
            try:
                pruned.append(target.prune_tombstones(table, Position(30, 0)))
            except BaseException as exc:  # reported by the assertion below
                pruned.append(exc)

        thread = threading.Thread(target=prune)
        thread.start()
        try:
            waiting = (
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                f"AND wait_event_type = 'Lock' AND query LIKE 'DELETE FROM %%{POSITIONS_TABLE}%%'"
            )
            wait_until(
                lambda: watcher.execute(waiting).fetchone() == (1,),
                60,
                "the prune waiting for the blocker's row",
            )
            # The prune holds key 1 and waits for key 2; asking for key 1 closes the cycle.
            blocker.execute(
                f"SELECT 1 FROM {POSITIONS_TABLE} WHERE {where} FOR UPDATE",
                (source, name, '{"id": 1}'),
            )
            blocker.commit()
        finally:
            thread.join(60)
            target.close()

    assert pruned == [2], pruned
    with psycopg.connect(dsn, autocommit=True) as admin:
        # A backend reports its deadlock to the statistics when it flushes them (at the
        # latest as it exits: the output closed that connection), not at once.
        wait_until(lambda: _deadlocks(admin) > deadlocks_before, 60, "the deadlock counted")
        assert _deadlocks(admin) == deadlocks_before + 1
        left = admin.execute(f"SELECT count(*) FROM {POSITIONS_TABLE} WHERE source = %s", (source,))
        assert left.fetchone() == (0,)
