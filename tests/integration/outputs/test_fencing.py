"""Outputs on real servers when leaders change and servers restart: a stale lease token is
refused and writes nothing; a lost connection is `OutputUnavailable` and the same output object
carries on once the server is back, with nothing lost or doubled."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast

import psycopg
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from airflow_provider_dblog.core.event import Event, Op, Origin, PlainEvent, SourceInfo, TableRef
from airflow_provider_dblog.core.event_codec import decode
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import (
    OutputFenced,
    OutputUnavailable,
    RedisStreamOutput,
    SqlApplyOutput,
)
from airflow_provider_dblog.outputs.sql_apply.batch import FENCE_TABLE
from tests.deadlines import deadline_s

pytestmark = pytest.mark.integration


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def upsert(table: TableRef, key: int, commit: int, *, source: str, value: str = "v") -> Event:
    info = SourceInfo(source, "db", table.schema, table.name, Position(commit, 0), Origin.LOG)
    return PlainEvent(Op.UPDATE, {"id": key}, None, {"id": key, "v": f"{value}{commit}"}, info, 1)


def history(table: TableRef, source: str, commits: range) -> list[Event]:
    """One update per commit, over a few keys, so later images overwrite earlier ones."""
    return [upsert(table, commit % 7, commit, source=source) for commit in commits]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s(timeout)
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class InThread:
    """Runs `write` in a thread, to act on the servers while it is in the middle of a batch."""

    def __init__(self, write: Callable[[], None]) -> None:
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(write,), daemon=True)
        self._thread.start()

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as exc:
            self.error = exc

    def join(self) -> BaseException | None:
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the write hangs"
        return self.error


# --- Redis Streams ---------------------------------------------------------------------------


def stream(client: redis.Redis, key: str) -> list[Event]:
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], client.xrange(key))
    return [decode(fields[b"event"]) for _, fields in entries]


def fast_client(info: RedisInfo) -> redis.Redis:
    """Fails at once while the server is down (the default client retries for seconds)."""
    return info.client(socket_connect_timeout=2, socket_timeout=5, retry=Retry(NoBackoff(), 0))


def test_redis_stream_refuses_a_stale_leader(redis_server: RedisInfo) -> None:
    source = unique("s")
    events = history(TableRef("app", "t"), source, range(1, 9))
    stale = upsert(TableRef("app", "t"), 1, 5, source=source, value="stale")
    key = f"dblog:{source}:events"
    with (
        redis_server.client() as check,
        RedisStreamOutput(redis_server.client()) as old,
        RedisStreamOutput(redis_server.client()) as new,
    ):
        assert new.fence(source) is None
        old.write(events[:3], 5)
        assert new.fence(source) == 5
        new.write(events[1:4], 7)  # the new leader replays from its last acknowledged position
        with pytest.raises(OutputFenced, match=r"token 7 has written here; .* token 5 is stale"):
            old.write([stale], 5)
        with pytest.raises(OutputFenced):
            old.write(events[3:6], 5)
        assert stream(check, key) == events[:4]
        new.write(events[4:], 7)
        assert stream(check, key) == events
        assert check.get(new.fence_key(source)) == b"7"
        assert old.fence(source) == 7
    positions = [e.position for e in events]
    assert positions == sorted(set(positions))


def test_redis_stream_leaders_alternating_read_the_tails_again(redis_server: RedisInfo) -> None:
    """A writer that led before sees its cached tail moved by the leader after it: it reads the
    tail again and drops what that leader already wrote, per stream."""
    source = unique("s")
    users, orders = TableRef("app", "users"), TableRef("app", "orders")
    events = [
        upsert(users if c % 2 else orders, c, c, source=source) for c in range(1, 13)
    ]  # fmt: skip
    with (
        redis_server.client() as check,
        RedisStreamOutput(redis_server.client(), per_table=True) as a,
        RedisStreamOutput(redis_server.client(), per_table=True) as b,
    ):
        a.write(events[:4], 1)
        b.write(events[2:8], 2)
        a.write(events[5:12], 3)  # a leads again, with a new token
    for table in (users, orders):
        got = stream(check, f"dblog:{source}:events:{table}")
        assert got == [e for e in events if e.table == table]


def test_redis_stream_rides_through_a_restart(redis_server: RedisInfo) -> None:
    source = unique("s")
    events = history(TableRef("app", "t"), source, range(1, 3001))
    with redis_server.client() as check, RedisStreamOutput(fast_client(redis_server)) as out:
        out.write(events[:1000], 3)
        redis_server.stop()
        try:
            with pytest.raises(OutputUnavailable, match="the Redis output went away"):
                out.write(events[1000:2000], 3)
        finally:
            redis_server.start()
        out.write(events[500:2000], 3)  # the tailer hands the unacknowledged events again
        out.write(events[2000:], 3)
        assert stream(check, f"dblog:{source}:events") == events


def test_redis_stream_restarted_with_the_default_client(redis_server: RedisInfo) -> None:
    """redis-py reconnects and retries by itself: a restart between batches is not even seen."""
    source = unique("s")
    events = history(TableRef("app", "t"), source, range(1, 101))
    with redis_server.client() as check, RedisStreamOutput(redis_server.client()) as out:
        out.write(events[:50], 3)
        redis_server.restart()
        out.write(events[40:], 3)
        assert stream(check, f"dblog:{source}:events") == events


# --- SQL apply -------------------------------------------------------------------------------


def create_table(dsn: str) -> TableRef:
    name = unique("t")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE public."{name}" (id int PRIMARY KEY, v text)')
    return TableRef("public", name)


def table_rows(dsn: str, table: TableRef) -> dict[int, str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f'SELECT id, v FROM public."{table.name}"').fetchall()
    return dict(rows)


def final_state(events: list[Event]) -> dict[int, str]:
    state: dict[int, str] = {}
    for event in events:
        assert event.after is not None
        state[int(event.key["id"])] = str(event.after["v"])
    return state


def stored_positions(dsn: str, table: TableRef) -> dict[int, Position]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT key, commit, seq FROM dblog_positions WHERE tbl = %s", (table.name,)
        ).fetchall()
    return {int(key["id"]): Position(int(commit), seq) for key, commit, seq in rows}


def test_sql_apply_refuses_a_stale_leader(postgres: PostgresInfo) -> None:
    source = unique("s")
    t = create_table(postgres.dsn)
    events = history(t, source, range(1, 21))
    stale = [upsert(t, k, 100 + k, source=source, value="stale") for k in range(7)]
    with (
        SqlApplyOutput(postgres.dsn, monotonic=True) as old,
        SqlApplyOutput(postgres.dsn, monotonic=True) as new,
    ):
        assert new.fence(source) is None
        old.write(events[:8], 5)
        assert new.fence(source) == 5
        new.write(events[5:12], 7)
        assert old.fence(source) == 7
        with pytest.raises(OutputFenced, match=r"token 7 has written here; .* token 5 is stale"):
            old.write(stale, 5)
        assert table_rows(postgres.dsn, t) == final_state(events[:12])
        new.write(events[12:], 7)
        with pytest.raises(OutputFenced):
            old.write(stale, 5)
    assert table_rows(postgres.dsn, t) == final_state(events)
    last = {int(e.key["id"]): e.position for e in events}
    assert stored_positions(postgres.dsn, t) == last
    with psycopg.connect(postgres.dsn) as conn:
        fence = conn.execute(
            f"SELECT token FROM {FENCE_TABLE} WHERE source = %s", (source,)
        ).fetchall()
    assert fence == [(7,)]


def test_sql_apply_stale_batch_waits_for_the_new_leaders_then_is_refused(
    postgres: PostgresInfo,
) -> None:
    """Two leaders' batches at once: the fence row's lock orders them, and the stale one, once
    the new one committed, commits nothing."""
    source = unique("s")
    app = unique("old")
    t = create_table(postgres.dsn)
    events = history(t, source, range(1, 8))
    with SqlApplyOutput(f"{postgres.dsn}?application_name={app}") as old:
        old.write(events[:2], 5)
        with psycopg.connect(postgres.dsn) as new_leader:  # its batch's transaction, in flight
            new_leader.execute(f"UPDATE {FENCE_TABLE} SET token = 7 WHERE source = %s", (source,))
            stale = InThread(lambda: old.write(events[2:], 5))
            wait_for(lambda: waits_on_a_lock(postgres, app), "the stale batch to wait")
            new_leader.commit()
        assert isinstance(stale.join(), OutputFenced)
    assert table_rows(postgres.dsn, t) == final_state(events[:2])


def waits_on_a_lock(postgres: PostgresInfo, application_name: str) -> bool:
    with psycopg.connect(postgres.admin_dsn, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = %s AND wait_event_type = 'Lock'",
            (application_name,),
        ).fetchone()
    return row is not None and row[0] == 1


@pytest.fixture
def restartable(pg15: PostgresInfo) -> Iterator[PostgresInfo]:
    """pg15, brought back up whatever the test did to it."""
    try:
        yield pg15
    finally:
        pg15.start()


def test_sql_apply_target_restarted_between_batches(restartable: PostgresInfo) -> None:
    pg = restartable
    source = unique("s")
    t = create_table(pg.dsn)
    events = history(t, source, range(1, 301))
    with SqlApplyOutput(pg.dsn, monotonic=True, connect_timeout=2) as out:
        out.write(events[:100], 3)
        pg.stop()  # a fast shutdown: open sessions are ended
        with pytest.raises(OutputUnavailable, match="went away"):
            out.write(events[100:200], 3)
        with pytest.raises(OutputUnavailable, match="cannot connect"):
            out.write(events[100:200], 3)
        pg.start()
        out.write(events[50:200], 3)
        out.write(events[200:], 3)
    assert table_rows(pg.dsn, t) == final_state(events)
    assert stored_positions(pg.dsn, t) == {int(e.key["id"]): e.position for e in events}


def test_sql_apply_target_restarted_during_a_large_batch(restartable: PostgresInfo) -> None:
    """The target shuts down while a batch is in its transaction and the client is still
    sending it (the table is locked, so the server stops reading): the write ends with
    `OutputUnavailable` instead of hanging, nothing of it commits, and the batch sent again
    after the restart lands once."""
    pg = restartable
    source = unique("s")
    app = unique("out")
    t = create_table(pg.dsn)
    big = [upsert(t, k, k, source=source) for k in range(1, 50_001)]
    later = [upsert(t, k, 100_000 + k, source=source) for k in range(0, 50_001, 1000)]
    with SqlApplyOutput(f"{pg.dsn}?application_name={app}", monotonic=True) as out:
        out.write(big[:10], 3)
        locker = psycopg.connect(pg.admin_dsn)  # ended by the shutdown, with its lock
        locker.execute(f'LOCK TABLE public."{t.name}" IN ACCESS EXCLUSIVE MODE')
        batch = InThread(lambda: out.write(big, 3))
        wait_for(lambda: waits_on_a_lock(pg, app), "the batch to be in its transaction")
        pg.stop()
        locker.close()
        error = batch.join()
        assert isinstance(error, OutputUnavailable), repr(error)
        pg.start()
        assert table_rows(pg.dsn, t) == final_state(big[:10])
        out.write(big, 3)
        out.write(later, 3)
    assert table_rows(pg.dsn, t) == final_state(big + later)


def test_sql_apply_reads_the_target_again_after_a_reconnect(restartable: PostgresInfo) -> None:
    """A column added while the output was away is used at once: the column cache does not
    outlive the connection."""
    pg = restartable
    source = unique("s")
    t = create_table(pg.dsn)
    with SqlApplyOutput(pg.dsn) as out:
        out.write([upsert(t, 1, 1, source=source)], 3)
        pg.restart()
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute(f'ALTER TABLE public."{t.name}" ALTER COLUMN v TYPE int USING 0')
        with pytest.raises(OutputUnavailable):
            out.write([upsert(t, 2, 2, source=source)], 3)
        info = SourceInfo(source, "db", "public", t.name, Position(3, 0), Origin.LOG)
        out.write([PlainEvent(Op.UPDATE, {"id": 2}, None, {"id": 2, "v": "42"}, info, 1)], 3)
    with psycopg.connect(pg.dsn) as conn:
        rows: list[Any] = conn.execute(
            f'SELECT id, v FROM public."{t.name}" ORDER BY id'
        ).fetchall()
    assert rows == [(1, 0), (2, 42)]
