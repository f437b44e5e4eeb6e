"""Outputs on real servers: Redis Streams round trip and trimming; SQL apply into PostgreSQL."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from airflow_provider_dblog.core.encoded_rows import EncodedEvent, encode_rows
from airflow_provider_dblog.core.event import (
    Event,
    Op,
    Origin,
    PlainEvent,
    Row,
    SourceInfo,
    TableRef,
    table_event,
)
from airflow_provider_dblog.core.event_codec import decode
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import ChunkRows, Closed, Reconciler, Window
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.process import free_port
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import (
    OutputError,
    OutputUnavailable,
    RedisStreamOutput,
    SqlApplyOutput,
    TargetTableMissing,
)
from airflow_provider_dblog.targets import open_output

pytestmark = pytest.mark.integration


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def ev(
    table: TableRef,
    op: Op,
    key: Row,
    after: Row | None,
    commit: int,
    seq: int = 0,
    *,
    source: str = "src",
    before: Row | None = None,
    version: int = 1,
) -> Event:
    origin = Origin.DUMP if op is Op.READ else Origin.LOG
    info = SourceInfo(source, "db", table.schema, table.name, Position(commit, seq), origin)
    return PlainEvent(op, key, before, after, info, version)


def table_ev(
    table: TableRef,
    op: Op,
    commit: int,
    seq: int = 0,
    *,
    version: int = 1,
    schema: str = "",
    source: str = "src",
) -> Event:
    """A table-level event; `schema` is "name type [default=...] [null]; ..." for an `s` one."""
    info = SourceInfo(source, "db", table.schema, table.name, Position(commit, seq), Origin.LOG)
    columns = []
    for spec in filter(None, (part.split() for part in schema.split(";"))):
        name, type_, *rest = spec
        default = next((r[len("default=") :] for r in rest if r.startswith("default=")), None)
        columns.append(Column(name, type_, "null" in rest, default))
    table_schema = TableSchema(tuple(columns), ("id",)) if op is Op.SCHEMA else None
    return table_event(op, info, version, table_schema)


# --- Redis Streams ---------------------------------------------------------------------------


@pytest.fixture
def stream_client(redis_server: RedisInfo) -> Iterator[redis.Redis]:
    with redis_server.client() as client:
        yield client


def entries(client: redis.Redis, key: str) -> list[dict[str, str]]:
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in client.xrange(key)]


def test_redis_stream_round_trip(redis_server: RedisInfo, stream_client: redis.Redis) -> None:
    source = unique("s")
    users, orders = TableRef("app", "users"), TableRef("app", "orders")
    events = [
        ev(users, Op.CREATE, {"id": 1}, {"id": 1, "name": "ü"}, 10, 0, source=source),
        ev(orders, Op.DELETE, {"id": 7}, None, 10, 1, source=source, before={"id": 7}),
        ev(users, Op.READ, {"id": 2}, {"id": 2, "name": None}, 11, 0, source=source),
        table_ev(orders, Op.TRUNCATE, 12, source=source),
        table_ev(
            users, Op.SCHEMA, 13, version=2, schema="id integer; name text null", source=source
        ),
    ]
    with RedisStreamOutput(redis_server.client()) as out:
        out.write(events[:1], 1)
        out.write(events[1:], 1)
    got = entries(stream_client, f"dblog:{source}:events")
    assert [decode(e["event"]) for e in got] == events
    assert [(e["table"], e["op"], e["position"]) for e in got] == [
        ("app.users", "c", "[10, 0]"),
        ("app.orders", "d", "[10, 1]"),
        ("app.users", "r", "[11, 0]"),
        ("app.orders", "t", "[12, 0]"),
        ("app.users", "s", "[13, 0]"),
    ]


def test_redis_stream_per_table(redis_server: RedisInfo, stream_client: redis.Redis) -> None:
    source = unique("s")
    users, orders = TableRef("app", "users"), TableRef("app", "orders")
    with RedisStreamOutput(redis_server.client(), per_table=True, prefix="cdc") as out:
        out.write(
            [
                ev(users, Op.CREATE, {"id": 1}, {"id": 1}, 10, 0, source=source),
                ev(orders, Op.CREATE, {"id": 1}, {"id": 1}, 10, 1, source=source),
                ev(users, Op.UPDATE, {"id": 1}, {"id": 1}, 11, 0, source=source),
            ],
            1,
        )
    assert [e["position"] for e in entries(stream_client, f"cdc:{source}:events:app.users")] == [
        "[10, 0]",
        "[11, 0]",
    ]
    assert len(entries(stream_client, f"cdc:{source}:events:app.orders")) == 1


def test_redis_stream_drops_replays_after_restart(
    redis_server: RedisInfo, stream_client: redis.Redis
) -> None:
    source = unique("s")
    table = TableRef("app", "users")
    events = [ev(table, Op.UPDATE, {"id": i}, {"id": i}, 10 + i, source=source) for i in range(5)]
    with RedisStreamOutput(redis_server.client()) as out:
        out.write(events[:3], 1)
    with RedisStreamOutput(redis_server.client()) as out:  # a restarted tailer replays from 1
        out.write(events[1:], 1)
        out.write(events[4:], 1)  # and in one process, too
    got = entries(stream_client, f"dblog:{source}:events")
    assert [decode(e["event"]) for e in got] == events


def test_redis_stream_trims_by_maxlen(redis_server: RedisInfo, stream_client: redis.Redis) -> None:
    source = unique("s")
    table = TableRef("app", "t")
    with RedisStreamOutput(redis_server.client(), maxlen=100) as out:
        for batch in range(10):
            out.write(
                [
                    ev(table, Op.CREATE, {"id": i}, {"id": i}, batch, i, source=source)
                    for i in range(100)
                ],
                1,
            )
    length = stream_client.xlen(f"dblog:{source}:events")
    assert 100 <= length < 1000  # approximate: whole nodes of entries go at once
    last = entries(stream_client, f"dblog:{source}:events")[-1]
    assert last["position"] == "[9, 99]"


def test_redis_stream_trims_by_age(redis_server: RedisInfo, stream_client: redis.Redis) -> None:
    source = unique("s")
    table = TableRef("app", "t")
    key = f"dblog:{source}:events"
    with RedisStreamOutput(redis_server.client(), max_age_s=0.2) as out:
        out.write(
            [ev(table, Op.CREATE, {"id": i}, {"id": i}, 1, i, source=source) for i in range(300)], 1
        )
        assert stream_client.xlen(key) == 300
        time.sleep(0.4)
        out.write([ev(table, Op.CREATE, {"id": 0}, {"id": 0}, 2, 0, source=source)], 1)
    # Approximate trimming removes whole nodes (100 entries by default) of old entries.
    assert stream_client.xlen(key) <= 101
    assert entries(stream_client, key)[-1]["position"] == "[2, 0]"


def test_redis_stream_options_checked() -> None:
    client = redis.Redis()
    with pytest.raises(OutputError, match="not both"):
        RedisStreamOutput(client, maxlen=10, max_age_s=5)
    with pytest.raises(OutputError, match="positive"):
        RedisStreamOutput(client, maxlen=0)


def test_redis_stream_unreachable_is_unavailable() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    table = TableRef("app", "t")
    with RedisStreamOutput(client) as out, pytest.raises(OutputUnavailable, match="went away"):
        out.write([ev(table, Op.CREATE, {"id": 1}, {"id": 1}, 1)], 1)


def test_redis_stream_from_config(
    redis_server: RedisInfo, stream_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_DBLOG_REDIS_URL", redis_server.url)
    source = unique("s")
    config = {"type": "redis_stream", "url_env": "TEST_DBLOG_REDIS_URL", "per_table": True}
    with open_output(config) as out:
        assert isinstance(out, RedisStreamOutput)
        out.write([ev(TableRef("a", "b"), Op.CREATE, {"id": 1}, {"id": 1}, 1, source=source)], 1)
    assert stream_client.xlen(f"dblog:{source}:events:a.b") == 1
    with pytest.raises(OutputError, match="environment variable NOT_SET_ANYWHERE"):
        open_output({"type": "redis_stream", "url_env": "NOT_SET_ANYWHERE"})


# --- SQL apply -------------------------------------------------------------------------------


@pytest.fixture
def target(postgres: PostgresInfo) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the target database for set-up and checks."""
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        yield conn


def create(conn: psycopg.Connection[Any], ddl: str) -> TableRef:
    """Creates `ddl` (with `{t}` for the table name) under a unique name in public."""
    name = unique("t")
    conn.execute(ddl.format(t=name))
    return TableRef("public", name)


def rows(conn: psycopg.Connection[Any], table: TableRef, order: str = "1") -> list[tuple[Any, ...]]:
    return conn.execute(f'SELECT * FROM {table.schema}."{table.name}" ORDER BY {order}').fetchall()


def test_sql_upserts_and_deletes(postgres: PostgresInfo, target: psycopg.Connection[Any]) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY, name text, n int)")
    with SqlApplyOutput(postgres.dsn) as out:
        out.write(
            [
                ev(t, Op.READ, {"id": 1}, {"id": 1, "name": "a", "n": 1}, 10, 0),
                ev(t, Op.CREATE, {"id": 2}, {"id": 2, "name": "b", "n": 2}, 11, 0),
                ev(t, Op.CREATE, {"id": 3}, {"id": 3, "name": "c", "n": 3}, 11, 1),
                ev(t, Op.UPDATE, {"id": 2}, {"id": 2, "name": "B", "n": None}, 12, 0),
                ev(t, Op.DELETE, {"id": 3}, None, 13, 0),
                ev(t, Op.UPDATE, {"id": 1}, {"id": 1, "name": "A", "n": 10}, 14, 0),
            ],
            1,
        )
        assert rows(target, t) == [(1, "A", 10), (2, "B", None)]
        out.write(
            [ev(t, Op.DELETE, {"id": 1}, None, 15, 0), ev(t, Op.DELETE, {"id": 9}, None, 15, 1)], 1
        )
    assert rows(target, t) == [(2, "B", None)]


def test_sql_composite_and_uuid_keys(
    postgres: PostgresInfo, target: psycopg.Connection[Any]
) -> None:
    t = create(target, "CREATE TABLE {t} (region text, n int, v text, PRIMARY KEY (region, n))")
    u = create(target, "CREATE TABLE {t} (id uuid PRIMARY KEY, v text)")
    ids = [str(uuid.uuid4()) for _ in range(2)]
    with SqlApplyOutput(postgres.dsn) as out:
        out.write(
            [
                ev(t, Op.CREATE, {"region": "eu", "n": 1}, {"region": "eu", "n": 1, "v": "x"}, 1),
                ev(t, Op.CREATE, {"region": "eu", "n": 2}, {"region": "eu", "n": 2, "v": "y"}, 2),
                ev(t, Op.CREATE, {"region": "us", "n": 1}, {"region": "us", "n": 1, "v": "z"}, 3),
                ev(t, Op.UPDATE, {"region": "eu", "n": 2}, {"region": "eu", "n": 2, "v": "Y"}, 4),
                ev(t, Op.DELETE, {"region": "eu", "n": 1}, None, 5),
                ev(u, Op.CREATE, {"id": ids[0]}, {"id": ids[0], "v": "a"}, 6),
                ev(u, Op.CREATE, {"id": ids[1]}, {"id": ids[1], "v": "b"}, 7),
                ev(u, Op.DELETE, {"id": ids[1]}, None, 8),
            ],
            1,
        )
    assert rows(target, t, "1, 2") == [("eu", 2, "Y"), ("us", 1, "z")]
    assert rows(target, u) == [(uuid.UUID(ids[0]), "a")]


def test_sql_value_types(postgres: PostgresInfo, target: psycopg.Connection[Any]) -> None:
    t = create(
        target,
        """CREATE TABLE {t} (
            id bigint PRIMARY KEY, amount numeric(30, 10), doc jsonb, raw json, ints int[],
            grid int[][], nums numeric[], blob bytea, blobs bytea[], at timestamptz, day date,
            code char(3), flag boolean, ratio double precision, label varchar(5), note text)""",
    )
    blob = bytes(range(256))
    after = {
        "id": 2**62,
        "amount": "12345678901234567890.0123456789",
        "doc": {"a": [1, 2, {"b": None}], "s": "ü"},
        "raw": [1, "two"],
        "ints": [1, None, 3],
        "grid": [[1, 2], [3, 4]],
        "nums": ["1.5", "NaN"],
        "blob": base64.b64encode(blob).decode(),
        "blobs": [base64.b64encode(b"\x00\x01").decode(), None],
        "at": "2024-02-29T23:59:59.123456+00:00",
        "day": "2024-02-29",
        "code": "ab",
        "flag": True,
        "ratio": 0.1,
        "label": "ünï",
        "note": None,
    }
    with SqlApplyOutput(postgres.dsn) as out:
        out.write([ev(t, Op.READ, {"id": 2**62}, after, 1)], 1)
    (row,) = target.execute(
        f"SELECT id, amount, doc, raw, ints, grid, nums, blob, blobs, at, day::text, code, flag,"
        f' ratio, label, note, at = %s::timestamptz FROM public."{t.name}"',
        (after["at"],),
    ).fetchall()
    assert row[:6] == (
        2**62,
        Decimal("12345678901234567890.0123456789"),
        after["doc"],
        [1, "two"],
        [1, None, 3],
        [[1, 2], [3, 4]],
    )
    assert [str(n) for n in row[6]] == ["1.5", "NaN"]  # NaN != NaN
    assert row[7:9] == (blob, [b"\x00\x01", None])
    assert row[10:16] == ("2024-02-29", "ab ", True, 0.1, "ünï", None)
    assert row[16] is True


def test_sql_oversized_value_is_refused_not_truncated(
    postgres: PostgresInfo, target: psycopg.Connection[Any]
) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY, label varchar(3))")
    with SqlApplyOutput(postgres.dsn) as out, pytest.raises(OutputError, match="too long"):
        out.write([ev(t, Op.CREATE, {"id": 1}, {"id": 1, "label": "abcd"}, 1)], 1)
    assert rows(target, t) == []


def test_sql_absent_column_is_kept(postgres: PostgresInfo, target: psycopg.Connection[Any]) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY, big text, n int)")
    with SqlApplyOutput(postgres.dsn) as out:
        out.write([ev(t, Op.CREATE, {"id": 1}, {"id": 1, "big": "x" * 10_000, "n": 1}, 1)], 1)
        # An update that did not touch the TOASTed column: the source could not send it.
        out.write([ev(t, Op.UPDATE, {"id": 1}, {"id": 1, "n": 2}, 2)], 1)
    assert rows(target, t) == [(1, "x" * 10_000, 2)]


def test_sql_update_that_changes_the_key(
    postgres: PostgresInfo, target: psycopg.Connection[Any]
) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    with SqlApplyOutput(postgres.dsn, monotonic=True) as out:
        out.write([ev(t, Op.CREATE, {"id": 1}, {"id": 1, "v": "a"}, 1)], 1)
        out.write([ev(t, Op.UPDATE, {"id": 2}, {"id": 2, "v": "a"}, 2, before={"id": 1})], 1)
        assert rows(target, t) == [(2, "a")]
        out.write(
            [ev(t, Op.READ, {"id": 1}, {"id": 1, "v": "old"}, 1, 5)], 1
        )  # older than the move
    assert rows(target, t) == [(2, "a")]


def test_sql_replayed_batch_is_idempotent(
    postgres: PostgresInfo, target: psycopg.Connection[Any]
) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY, v int)")
    batch = [
        ev(t, Op.CREATE, {"id": 1}, {"id": 1, "v": 1}, 1),
        ev(t, Op.CREATE, {"id": 2}, {"id": 2, "v": 1}, 1, 1),
        ev(t, Op.UPDATE, {"id": 1}, {"id": 1, "v": 2}, 2),
        ev(t, Op.DELETE, {"id": 2}, None, 3),
    ]
    for monotonic in (False, True):
        target.execute(f'TRUNCATE public."{t.name}"')
        with SqlApplyOutput(postgres.dsn, monotonic=monotonic) as out:
            out.write(batch, 1)
            out.write(batch, 1)
        with SqlApplyOutput(postgres.dsn, monotonic=monotonic) as out:  # after a restart
            out.write(batch[1:], 1)
        assert rows(target, t) == [(1, 2)]


def test_sql_monotonic_refuses_older_accepts_newer(
    postgres: PostgresInfo, target: psycopg.Connection[Any]
) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    with SqlApplyOutput(postgres.dsn, monotonic=True) as out:
        out.write([ev(t, Op.UPDATE, {"id": 1}, {"id": 1, "v": "at 10"}, 10, 3)], 1)
        out.write([ev(t, Op.READ, {"id": 1}, {"id": 1, "v": "at 10/2"}, 10, 2)], 1)
        out.write([ev(t, Op.UPDATE, {"id": 1}, {"id": 1, "v": "at 9"}, 9, 7)], 1)
        assert rows(target, t) == [(1, "at 10")]
        out.write([ev(t, Op.UPDATE, {"id": 1}, {"id": 1, "v": "at 10/4"}, 10, 4)], 1)
        assert rows(target, t) == [(1, "at 10/4")]
        out.write([ev(t, Op.DELETE, {"id": 1}, None, 12)], 1)
        out.write([ev(t, Op.READ, {"id": 1}, {"id": 1, "v": "stale dump row"}, 11)], 1)
        assert rows(target, t) == []
        out.write([ev(t, Op.CREATE, {"id": 1}, {"id": 1, "v": "again"}, 13)], 1)
        # The same key of another source is tracked on its own.
        out.write([ev(t, Op.UPDATE, {"id": 1}, {"id": 1, "v": "other"}, 1, source="other")], 1)
    assert rows(target, t) == [(1, "other")]
    stored = target.execute(
        "SELECT source, key, commit, seq FROM dblog_positions WHERE tbl = %s ORDER BY source",
        (t.name,),
    ).fetchall()
    assert stored == [("other", {"id": 1}, 1, 0), ("src", {"id": 1}, 13, 0)]


@pytest.mark.parametrize("monotonic", [False, True], ids=["plain", "monotonic"])
def test_sql_truncate_empties_the_target_and_sets_a_floor(
    postgres: PostgresInfo, target: psycopg.Connection[Any], monotonic: bool
) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    with SqlApplyOutput(postgres.dsn, monotonic=monotonic) as out:
        out.write(
            [
                ev(t, Op.CREATE, {"id": 1}, {"id": 1, "v": "a"}, 10),
                ev(t, Op.CREATE, {"id": 2}, {"id": 2, "v": "b"}, 11),
                table_ev(t, Op.TRUNCATE, 12),
                ev(t, Op.CREATE, {"id": 3}, {"id": 3, "v": "after"}, 13),
            ],
            1,
        )
        assert rows(target, t) == [(3, "after")]
        if not monotonic:
            return
        # Replays and stale dump rows from before the truncate never come back, and a
        # replayed truncate does not empty the table again.
        out.write(
            [
                ev(t, Op.CREATE, {"id": 1}, {"id": 1, "v": "a"}, 10),
                ev(t, Op.READ, {"id": 2}, {"id": 2, "v": "stale"}, 11, 5),
                table_ev(t, Op.TRUNCATE, 12),
            ],
            1,
        )
        assert rows(target, t) == [(3, "after")]
        out.write([ev(t, Op.READ, {"id": 4}, {"id": 4, "v": "new"}, 14, 1)], 1)
    assert rows(target, t) == [(3, "after"), (4, "new")]
    floor = target.execute(
        "SELECT commit, seq FROM dblog_positions WHERE tbl = %s AND key = 'null'::jsonb",
        (t.name,),
    ).fetchall()
    assert floor == [(12, 0)]


@pytest.mark.parametrize("monotonic", [False, True], ids=["plain", "monotonic"])
def test_sql_schema_events_add_and_drop_columns_as_the_source_did(
    postgres: PostgresInfo, target: psycopg.Connection[Any], monotonic: bool
) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY, v text, mine text DEFAULT 'x')")
    v1 = table_ev(t, Op.SCHEMA, 10, version=1, schema="id integer; v text null")
    v2 = table_ev(
        t,
        Op.SCHEMA,
        12,
        version=2,
        schema="id integer; v text null; flag integer default=7; note text null",
    )
    v3 = table_ev(t, Op.SCHEMA, 14, version=3, schema="id integer; flag integer default=7")
    with SqlApplyOutput(postgres.dsn, monotonic=monotonic) as out:
        out.write([v1, ev(t, Op.CREATE, {"id": 1}, {"id": 1, "v": "a"}, 11)], 1)
        out.write([v2, ev(t, Op.CREATE, {"id": 2}, {"id": 2, "v": "b", "flag": 8}, 13)], 1)
        assert rows(target, t) == [(1, "a", "x", 7, None), (2, "b", "x", 8, None)]
        out.write([v3, ev(t, Op.UPDATE, {"id": 1}, {"id": 1, "flag": 9}, 15)], 1)
        # A replay of older schemas changes nothing, and the rows of before the drop come
        # without the dropped columns (a restarted tailer re-sends them).
        replay = [
            v1,
            ev(t, Op.CREATE, {"id": 1}, {"id": 1, "v": "a"}, 11),
            v2,
            ev(t, Op.CREATE, {"id": 2}, {"id": 2, "v": "b", "flag": 8, "note": "n"}, 13),
        ]
        out.write(replay, 1)
        # A row of the schema applied that has a column the target lacks is still named.
        with pytest.raises(TargetTableMissing, match="no column v "):
            out.write([ev(t, Op.UPDATE, {"id": 1}, {"id": 1, "v": "c"}, 16, version=3)], 1)
    assert rows(target, t) == [(1, "x", 9), (2, "x", 8)], "the target's own column stays"
    flag = target.execute(
        "SELECT attnotnull, pg_get_expr(adbin, adrelid) FROM pg_attribute"
        " JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum"
        " WHERE attrelid = %s::regclass AND attname = 'flag'",
        (f'public."{t.name}"',),
    ).fetchone()
    assert flag == (True, "7")


def test_sql_type_changes_apply_when_safe_and_stop_otherwise(
    postgres: PostgresInfo, target: psycopg.Connection[Any]
) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY, n integer, s text)")
    with SqlApplyOutput(postgres.dsn) as out:
        out.write(
            [table_ev(t, Op.SCHEMA, 10, version=1, schema="id integer; n integer; s text")], 1
        )
        out.write([table_ev(t, Op.SCHEMA, 11, version=2, schema="id integer; n bigint; s text")], 1)
        assert target.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attname = 'n'",
            (f'public."{t.name}"',),
        ).fetchone() == ("bigint",)
        with pytest.raises(OutputError, match=r"column s changed type from text to integer.*USING"):
            out.write(
                [table_ev(t, Op.SCHEMA, 12, version=3, schema="id integer; n bigint; s integer")],
                1,
            )


def test_sql_table_map(postgres: PostgresInfo, target: psycopg.Connection[Any]) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    source = TableRef("app", "users")
    table_map = {"app.users": f"public.{t.name}"}
    with SqlApplyOutput(postgres.dsn, table_map=table_map) as out:
        assert out.target_of(source) == t
        out.write([ev(source, Op.CREATE, {"id": 1}, {"id": 1, "v": "a"}, 1)], 1)
    assert rows(target, t) == [(1, "a")]


def test_sql_missing_target_table_is_named(postgres: PostgresInfo) -> None:
    table = TableRef("public", unique("absent"))
    with (
        SqlApplyOutput(postgres.dsn) as out,
        pytest.raises(TargetTableMissing, match=f"target table {table} .*does not exist"),
    ):
        out.write([ev(table, Op.CREATE, {"id": 1}, {"id": 1}, 1)], 1)


def test_sql_target_that_differs_is_named(
    postgres: PostgresInfo, target: psycopg.Connection[Any]
) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    nokey = create(target, "CREATE TABLE {t} (id int, v text)")
    with SqlApplyOutput(postgres.dsn) as out:
        with pytest.raises(TargetTableMissing, match=f"{t} has no column extra"):
            out.write([ev(t, Op.CREATE, {"id": 1}, {"id": 1, "extra": 1}, 1)], 1)
        with pytest.raises(TargetTableMissing, match=rf"{t} has primary key \(id\) but"):
            out.write([ev(t, Op.CREATE, {"v": "a"}, {"id": 1, "v": "a"}, 1)], 1)
        with pytest.raises(TargetTableMissing, match=f"{nokey} has no primary key"):
            out.write([ev(nokey, Op.CREATE, {"id": 1}, {"id": 1}, 1)], 1)
        # A column added to the target later is picked up.
        target.execute(f'ALTER TABLE public."{t.name}" ADD COLUMN extra int')
        out.write([ev(t, Op.CREATE, {"id": 1}, {"id": 1, "v": "a", "extra": 5}, 2)], 1)
    assert rows(target, t) == [(1, "a", 5)]


def test_sql_target_table_dropped_under_the_output(
    postgres: PostgresInfo, target: psycopg.Connection[Any]
) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY)")
    with SqlApplyOutput(postgres.dsn) as out:
        out.write([ev(t, Op.CREATE, {"id": 1}, {"id": 1}, 1)], 1)
        target.execute(f'DROP TABLE public."{t.name}"')
        with pytest.raises(TargetTableMissing, match=t.name):
            out.write([ev(t, Op.CREATE, {"id": 2}, {"id": 2}, 2)], 1)
        with pytest.raises(TargetTableMissing, match=f"target table {t} .*does not exist"):
            out.write([ev(t, Op.CREATE, {"id": 2}, {"id": 2}, 2)], 1)


def test_sql_target_server_going_away(
    postgres: PostgresInfo, target: psycopg.Connection[Any]
) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY)")
    app = unique("out")
    with SqlApplyOutput(f"{postgres.dsn}?application_name={app}") as out:
        out.write([ev(t, Op.CREATE, {"id": 1}, {"id": 1}, 1)], 1)
        with psycopg.connect(postgres.admin_dsn, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (app,),
            ).fetchall()
        assert killed == [(True,)]
        with pytest.raises(OutputUnavailable, match="went away"):
            out.write([ev(t, Op.CREATE, {"id": 2}, {"id": 2}, 2)], 1)
        out.write(
            [ev(t, Op.CREATE, {"id": 2}, {"id": 2}, 2)], 1
        )  # reconnects; the batch is retried
    assert rows(target, t) == [(1,), (2,)]


def test_sql_unreachable_target_is_unavailable() -> None:
    dsn = f"postgresql://u:secret-pw@127.0.0.1:{free_port()}/x"
    with pytest.raises(OutputUnavailable, match="cannot connect") as raised:
        SqlApplyOutput(dsn, connect_timeout=2)
    assert "secret-pw" not in str(raised.value)


def test_sql_apply_from_config(
    postgres: PostgresInfo, target: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY, doc jsonb)")
    monkeypatch.setenv("TEST_DBLOG_TARGET_DSN", postgres.dsn)
    config = {"type": "sql_apply", "dsn_env": "TEST_DBLOG_TARGET_DSN", "monotonic": True}
    with open_output(config) as out:
        assert isinstance(out, SqlApplyOutput) and out.monotonic
        out.write([ev(t, Op.CREATE, {"id": 1}, {"id": 1, "doc": json.loads('{"a": 1}')}, 1)], 1)
    assert rows(target, t) == [(1, {"a": 1})]
    with pytest.raises(OutputError, match=r"'dsn_env' .* is required"):
        open_output({"type": "sql_apply"})
    with pytest.raises(OutputError, match="unknown option 'dsn'"):
        open_output({"type": "sql_apply", "dsn": postgres.dsn})


# --- chunk rows encoded by their reader --------------------------------------------------------


def encoded_chunk(
    table: TableRef, rows: list[Row], commit: int, source: str = "src"
) -> list[Event]:
    """A closed window's rows as the tailer emits them: `EncodedEvent`s of their reader's JSON."""
    window = Window("w-1", "d-1", table)
    closed = Closed(window, Position(commit - 1, 0), Position(commit, 0), frozenset())
    chunk = ChunkRows("w-1", ("id",), encode_rows(rows, ("id",)), 1)
    events = Reconciler(source, "db").chunk_events(closed, chunk)
    assert isinstance(events, list) and all(isinstance(e, EncodedEvent) for e in events)
    return events


def test_redis_stream_takes_encoded_chunk_rows(
    redis_server: RedisInfo, stream_client: redis.Redis
) -> None:
    source = unique("s")
    users = TableRef("app", "users")
    chunk = encoded_chunk(users, [{"id": i, "name": f"ü{i}"} for i in range(3)], 20, source)
    events = [ev(users, Op.CREATE, {"id": 9}, {"id": 9, "name": "x"}, 19, source=source), *chunk]
    with RedisStreamOutput(redis_server.client(), per_table=True) as out:
        out.write(events, 1)
        out.write(chunk[1:], 1)  # replayed
    got = entries(stream_client, f"dblog:{source}:events:app.users")
    assert [decode(e["event"]) for e in got] == events
    assert [e["event"].encode() + b"\n" for e in got[1:]] == [
        e.line for e in chunk if isinstance(e, EncodedEvent)
    ]
    assert [(e["op"], e["position"]) for e in got[1:]] == [("r", f"[20, {i}]") for i in (1, 2, 3)]


def test_sql_applies_encoded_chunk_rows(
    postgres: PostgresInfo, target: psycopg.Connection[Any]
) -> None:
    t = create(target, "CREATE TABLE {t} (id int PRIMARY KEY, name text)")
    chunk = encoded_chunk(t, [{"id": 1, "name": "a"}, {"id": 2, "name": "ü"}], 10)
    with SqlApplyOutput(postgres.dsn, monotonic=True) as out:
        out.write([*chunk, ev(t, Op.UPDATE, {"id": 2}, {"id": 2, "name": "b"}, 11)], 1)
    assert rows(target, t) == [(1, "a"), (2, "b")]
