"""The PostgreSQL source on real servers (PostgreSQL 15 and 18): setup and preflight, the log
reader over a replication slot, and the chunk source, which must give the log's JSON."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Event, Op, TableRef
from airflow_provider_dblog.core.log import (
    Change,
    Idle,
    LogItem,
    SchemaDescription,
    TransactionEnd,
    Truncate,
    WatermarkWrite,
    single_changes,
)
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.devservices.postgres import PostgresInfo, PostgresServer
from airflow_provider_dblog.sources.base import (
    NoPrimaryKey,
    SourceError,
    SourceUnavailable,
    UnknownTable,
)
from airflow_provider_dblog.sources.postgres import (
    PostgresChunkSource,
    PostgresLogReader,
    PostgresSourceConfig,
    ensure_setup,
    preflight,
)
from airflow_provider_dblog.sources.postgres.lsn import parse_pg_lsn
from tests.installed import installed
from tests.pg_helpers import ReplicaWalServer, read_until, wait_for

pytestmark = pytest.mark.integration

MakeConfig = Callable[..., PostgresSourceConfig]


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def dsn_of(info: PostgresInfo, user: str | None = None) -> str:
    """The DSN of `info` without its password (which comes from the environment)."""
    return f"host={info.host} port={info.port} user={user or info.user} dbname={info.dbname}"


def execute(info: PostgresInfo, *statements: str, params: tuple[Any, ...] = ()) -> None:
    """Run statements as the `dblog` role, in one transaction."""
    with psycopg.connect(info.dsn) as conn:
        for statement in statements:
            conn.execute(statement, params or None)


def drop_slot(info: PostgresInfo, slot: str) -> None:
    """Drop a slot once its walsender has let go of it."""
    with psycopg.connect(info.admin_dsn, autocommit=True) as conn:

        def released() -> bool:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            return row is None or not row[0]

        wait_for(released, what=f"slot {slot} released")
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name = %s",
            (slot,),
        )


def confirmed_flush(info: PostgresInfo, slot: str) -> int:
    with psycopg.connect(info.admin_dsn) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    assert row is not None and row[0] is not None
    return parse_pg_lsn(row[0])


@pytest.fixture
def make_config(postgres: PostgresInfo, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeConfig]:
    """Configs with their own slot, publication and watermark schema; slots dropped after."""
    env = unique("DBLOG_TEST_PG_PASSWORD").upper()
    monkeypatch.setenv(env, postgres.password)
    dsn = dsn_of(postgres)
    slots: list[str] = []

    def make(tables: tuple[TableRef, ...], **overrides: Any) -> PostgresSourceConfig:
        arguments: dict[str, Any] = {
            "name": "pgtest",
            "dsn": dsn,
            "tables": tables,
            "password_env": env,
            "slot": unique("slot"),
            "publication": unique("pub"),
            "watermark_schema": unique("wm"),
            **overrides,
        }
        config = PostgresSourceConfig(**arguments)
        slots.append(config.slot)
        return config

    yield make
    for slot in slots:
        drop_slot(postgres, slot)


def new_table(info: PostgresInfo, columns: str) -> TableRef:
    name = unique("t")
    execute(info, f"CREATE TABLE public.{name} ({columns})")
    return TableRef("public", name)


def changes(items: list[LogItem]) -> list[Event]:
    return [item.event for item in items if isinstance(item, Change)]


def ends(count: int) -> Callable[[list[LogItem]], bool]:
    return lambda seen: sum(isinstance(i, TransactionEnd) for i in seen) >= count


# --- one converter for both paths ---------------------------------------------------------

ALL_TYPES = """
    id bigint PRIMARY KEY, small int, amount numeric(20, 6), label text, code varchar(20),
    flag bool, at timestamp, at_tz timestamptz, day date, ref uuid, doc jsonb, raw bytea,
    numbers int[], words text[], ratio float8, padded char(5)
"""

ROWS = [
    """(1, 7, 12345678901234.123456, 'héllo "world"', 'v', true, '2024-02-29 23:59:59.5',
        '2024-01-01 12:00:00+02', '2024-02-29', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
        '{"b": [1, 2.5, null], "a": "x"}', '\\x00ff', '{1,NULL,3}', '{"a b",NULL,"q\\"t",""}',
        1.5e-7, 'ab')""",
    "(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    """(3, -1, 'NaN', '', '', false, 'infinity', '-infinity', '0044-03-15 BC', NULL, '[]',
        '\\x', '{}', '{{a,b},{c,d}}', 'NaN', '     ')""",
]


def test_the_dump_and_the_log_give_the_same_json(
    postgres: PostgresInfo, make_config: MakeConfig
) -> None:
    table = new_table(postgres, ALL_TYPES)
    config = make_config((table,))
    ensure_setup(config)
    preflight(config)
    execute(postgres, f"INSERT INTO {table} VALUES {', '.join(ROWS)}")
    reader, chunks = PostgresLogReader(config, idle_after=0.2), PostgresChunkSource(config)
    try:
        logged = changes(read_until(reader.items(), ends(1)))
        dumped = chunks.read_chunk(Chunk(table, 0)).rows
    finally:
        reader.close()
        chunks.close()
    assert [e.op for e in logged] == [Op.CREATE] * 3
    assert [e.after for e in logged] == list(dumped)
    assert [json.dumps(e.after) for e in logged] == [json.dumps(r) for r in dumped]
    first = dumped[0]
    assert first["id"] == 1 and first["small"] == 7 and first["flag"] is True
    assert first["amount"] == "12345678901234.123456"
    assert first["at_tz"] == "2024-01-01 10:00:00+00"
    assert first["doc"] == {"a": "x", "b": [1, 2.5, None]}
    assert first["raw"] == "AP8="
    assert first["numbers"] == [1, None, 3]
    assert first["words"] == ["a b", None, 'q"t', ""]
    assert first["padded"] == "ab   "
    assert set(dumped[1].values()) == {2, None}
    assert dumped[2]["words"] == [["a", "b"], ["c", "d"]]
    assert dumped[2]["ratio"] == "NaN"


@pytest.mark.parametrize("full", [False, True], ids=["default-identity", "identity-full"])
def test_an_unchanged_toast_value_is_never_null(
    postgres: PostgresInfo, make_config: MakeConfig, full: bool
) -> None:
    table = new_table(postgres, "id int PRIMARY KEY, big text, n int")
    execute(postgres, f"ALTER TABLE {table} ALTER COLUMN big SET STORAGE EXTERNAL")
    config = make_config((table,), replica_identity_full=full)
    ensure_setup(config)
    big = "x" * 100_000  # stored out of line, uncompressed: pgoutput does not resend it
    execute(postgres, f"INSERT INTO {table} VALUES (1, %s, 0)", params=(big,))
    execute(postgres, f"UPDATE {table} SET n = 1 WHERE id = 1")
    reader = PostgresLogReader(config, idle_after=0.2)
    try:
        created, updated = changes(read_until(reader.items(), ends(2)))
    finally:
        reader.close()
    assert created.after == {"id": 1, "big": big, "n": 0}
    assert updated.op is Op.UPDATE and updated.after is not None
    assert updated.after["n"] == 1
    if full:
        assert updated.after["big"] == big
        assert updated.before == {"id": 1, "big": big, "n": 0}
    else:
        assert "big" not in updated.after  # left out, never null: consumers keep their value
        assert updated.before is None


# --- the log reader -----------------------------------------------------------------------


def test_row_changes_positions_watermarks_and_transaction_ends(
    postgres: PostgresInfo, make_config: MakeConfig
) -> None:
    table = new_table(postgres, "id int PRIMARY KEY, name text")
    config = make_config((table,))
    ensure_setup(config)
    with psycopg.connect(postgres.dsn) as conn:
        conn.execute(f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
        row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert row is not None
        first_xid = int(row[0]) & 0xFFFF_FFFF
    execute(postgres, f"UPDATE {table} SET name = 'a2' WHERE id = 1")
    execute(postgres, f"UPDATE {table} SET id = 3 WHERE id = 2")  # key change
    execute(postgres, f"DELETE FROM {table} WHERE id = 1")
    chunks = PostgresChunkSource(config)
    chunks.write_watermark("lw-1")
    execute(postgres, f"ALTER TABLE {table} ADD COLUMN extra int")
    execute(postgres, f"INSERT INTO {table} VALUES (4, 'd', 40)")
    chunks.close()
    reader = PostgresLogReader(config, idle_after=0.2)
    try:
        items = read_until(reader.items(), ends(6))
    finally:
        reader.close()
    items = [i for i in items if not isinstance(i, Idle)]
    events = changes(items)
    assert [(e.op, e.key, e.before, e.after) for e in events] == [
        (Op.CREATE, {"id": 1}, None, {"id": 1, "name": "a"}),
        (Op.CREATE, {"id": 2}, None, {"id": 2, "name": "b"}),
        (Op.UPDATE, {"id": 1}, None, {"id": 1, "name": "a2"}),
        (Op.DELETE, {"id": 2}, {"id": 2}, None),
        (Op.CREATE, {"id": 3}, None, {"id": 3, "name": "b"}),
        (Op.DELETE, {"id": 1}, {"id": 1}, None),
        (Op.CREATE, {"id": 4}, None, {"id": 4, "name": "d", "extra": 40}),
    ]
    described = [i for i in items if isinstance(i, SchemaDescription)]
    assert {d.table for d in described} == {table}
    assert described[0].schema == TableSchema(
        (Column("id", "integer", False, None), Column("name", "text", True, None)), ("id",)
    )
    assert described[-1].schema.columns[-1] == Column("extra", "integer", True, None)
    assert described[-1].position < events[-1].position
    assert {e.schema_version for e in events} == {0}, "versions are the tailer's"
    assert events[0].source.txid == events[1].source.txid == first_xid
    assert {(e.source.name, e.source.db, e.source.schema, e.source.table) for e in events} == {
        ("pgtest", postgres.dbname, table.schema, table.name)
    }
    assert all(e.source.origin == "log" and e.source.ts_ms for e in events)
    # Every item sits in its transaction, which ends with the commit LSN of its positions.
    positions = []
    open_commit: int | None = None
    for item in items:
        if isinstance(item, TransactionEnd):
            assert open_commit in (None, item.commit)
            open_commit = None
            continue
        assert isinstance(item, Change | WatermarkWrite | SchemaDescription)
        position = item.event.position if isinstance(item, Change) else item.position
        assert open_commit in (None, position.commit)
        open_commit = position.commit
        positions.append(position)
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert events[0].position.seq == 1 and events[1].position.seq == 3
    watermarks = [i for i in items if isinstance(i, WatermarkWrite)]
    assert [w.value for w in watermarks] == ["lw-1"]
    index = items.index(watermarks[0])
    assert items[index + 1] == TransactionEnd(watermarks[0].position.commit)


def test_the_reader_announces_its_waits_after_yielding_what_it_received(
    postgres: PostgresInfo, make_config: MakeConfig
) -> None:
    """`before_waiting` runs whenever the reader has yielded everything received and is about
    to wait: once the last transaction sent is yielded whole, before the reader blocks for the
    next (the tailer hands its held transactions to the writer then)."""
    table = new_table(postgres, "id int PRIMARY KEY, name text")
    config = make_config((table,))
    ensure_setup(config)
    for i in range(20):
        execute(postgres, f"INSERT INTO {table} VALUES ({i}, 'a'), ({i + 100}, 'b')")
    reader = PostgresLogReader(config, idle_after=0.2)
    seen: list[LogItem] = []
    announced: list[list[LogItem]] = []
    reader.before_waiting(lambda: announced.append(list(seen)))
    try:

        def noted() -> Iterator[LogItem]:
            for item in reader.items():
                seen.append(item)
                yield item

        read_until(noted(), ends(20))
        # Nothing more is written: the reader comes to wait, and says so first. (It yields an
        # Idle at each idle beat, which is when `read_until` looks again.)
        read_until(
            noted(),
            lambda _: any(
                sum(isinstance(i, TransactionEnd) for i in single_changes(b)) == 20
                for b in announced
            ),
        )
    finally:
        reader.close()


def test_truncate_and_the_catalog_describe_tables_as_the_log_does(
    postgres: PostgresInfo, make_config: MakeConfig
) -> None:
    """TRUNCATE is published and captured per captured table; a column added with a default
    is described with its default and nullability, by the log and by `describe` alike."""
    table, other = (new_table(postgres, "id int PRIMARY KEY, name text") for _ in range(2))
    config = make_config((table,))
    ensure_setup(config)
    execute(postgres, f"INSERT INTO {table} VALUES (1, 'a')", f"INSERT INTO {other} VALUES (1)")
    execute(postgres, f"TRUNCATE {table}, {other}")
    execute(postgres, f"ALTER TABLE {table} ADD COLUMN flag int NOT NULL DEFAULT 7")
    execute(postgres, f"INSERT INTO {table} VALUES (2, 'b')")
    reader = PostgresLogReader(config, idle_after=0.2)
    try:
        items = read_until(
            reader.items(),
            lambda seen: (
                isinstance(seen[-1], TransactionEnd)
                and any(e.key == {"id": 2} for e in changes(seen))
            ),
        )
        now = reader.describe(table)
    finally:
        reader.close()
    truncates = [i for i in items if isinstance(i, Truncate)]
    assert [t.table for t in truncates] == [table]
    created = changes(items)
    assert truncates[0].position > created[0].position
    assert created[-1].after == {"id": 2, "name": "b", "flag": 7}
    last = [i for i in items if isinstance(i, SchemaDescription)][-1]
    assert last.schema.columns[-1] == Column("flag", "integer", False, "7")
    assert last.position < created[-1].position
    assert now == last.schema


def test_a_publication_without_truncate_is_refused_and_set_up_again(
    postgres: PostgresInfo, make_config: MakeConfig
) -> None:
    table = new_table(postgres, "id int PRIMARY KEY")
    config = make_config((table,))
    ensure_setup(config)
    execute(postgres, f"ALTER PUBLICATION {config.publication} SET (publish = 'insert, update')")
    with pytest.raises(SourceError, match="does not publish delete, truncate: run ensure_setup"):
        preflight(config)
    ensure_setup(config)
    preflight(config)


def test_acknowledge_moves_the_slot_forward_never_back(
    postgres: PostgresInfo, make_config: MakeConfig
) -> None:
    table = new_table(postgres, "id int PRIMARY KEY")
    config = make_config((table,))
    ensure_setup(config)
    execute(postgres, f"INSERT INTO {table} VALUES (1)")
    execute(postgres, f"INSERT INTO {table} VALUES (2)")
    reader = PostgresLogReader(config, idle_after=0.2)
    try:
        items = reader.items()
        first, second = [i for i in read_until(items, ends(2)) if isinstance(i, TransactionEnd)]
        reader.acknowledge(second.commit)
        wait_for(lambda: confirmed_flush(postgres, config.slot) > second.commit, what="ack")
        acknowledged = confirmed_flush(postgres, config.slot)
        reader.acknowledge(first.commit)  # backwards: ignored
        # An idle slot: WAL moves on (a table outside the publication), Idle says where it
        # ends, and acknowledging that moves the slot on.
        other = new_table(postgres, "id int PRIMARY KEY")
        execute(postgres, f"INSERT INTO {other} SELECT generate_series(1, 1000)")
        idle = read_until(
            items, lambda seen: isinstance(seen[-1], Idle) and seen[-1].log_end > acknowledged
        )[-1]
        assert isinstance(idle, Idle)
        assert confirmed_flush(postgres, config.slot) == acknowledged
        reader.acknowledge(idle.log_end)
        wait_for(lambda: confirmed_flush(postgres, config.slot) >= idle.log_end, what="idle ack")
    finally:
        reader.close()
    # A new reader starts after what was acknowledged: nothing is sent again.
    execute(postgres, f"INSERT INTO {table} VALUES (3)")
    reader = PostgresLogReader(config, idle_after=0.2)
    try:
        again = changes(read_until(reader.items(), ends(1)))
    finally:
        reader.close()
    assert [e.key for e in again] == [{"id": 3}]


def restart(info: PostgresInfo) -> None:
    """Start a killed session server again. A concurrent pytest session may have reset
    /tmp/pytest-of-<user> to 0700 since it first started: let its user reach its data again."""
    server = info.server
    assert isinstance(server, PostgresServer)
    server.run_as.make_reachable(server.base_dir)
    info.start()


def test_a_lost_server_raises_source_unavailable(pg15: PostgresInfo) -> None:
    env = "DBLOG_TEST_PG_LOST_PASSWORD"
    table = TableRef("public", unique("t"))
    execute(pg15, f"CREATE TABLE {table} (id int PRIMARY KEY)")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv(env, pg15.password)
        config = PostgresSourceConfig(
            name="pgtest",
            dsn=dsn_of(pg15),
            tables=(table,),
            password_env=env,
            slot=unique("slot"),
            publication=unique("pub"),
        )
        ensure_setup(config)
        reader = PostgresLogReader(config, idle_after=0.2)
        try:
            items = reader.items()
            read_until(items, lambda seen: isinstance(seen[-1], Idle))
            pg15.kill()
            try:
                with pytest.raises(SourceUnavailable):
                    read_until(items, lambda seen: False)
                with pytest.raises(SourceUnavailable):
                    next(reader.items())  # cannot reconnect while it is down
            finally:
                restart(pg15)
            execute(pg15, f"INSERT INTO {table} VALUES (1)")
            again = changes(read_until(reader.items(), ends(1)))  # reconnects
            assert [e.key for e in again] == [{"id": 1}]
        finally:
            reader.close()
            drop_slot(pg15, config.slot)


def test_chunk_source_calls_on_a_restarted_server_are_unavailable_then_reconnect(
    pg15: PostgresInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast shutdown (what a failover or a minor upgrade does) ends every session with
    AdminShutdown: each chunk-source call meeting it raises `SourceUnavailable`, never a raw
    psycopg error, and the next call connects again. While the server is down, connecting
    is unavailable too."""
    env = unique("DBLOG_TEST_PG_RESTART_PASSWORD").upper()
    monkeypatch.setenv(env, pg15.password)
    table, other = new_table(pg15, "id int PRIMARY KEY"), new_table(pg15, "k int PRIMARY KEY")
    execute(pg15, f"INSERT INTO {table} SELECT generate_series(1, 10)")
    config = PostgresSourceConfig(
        name="pgtest", dsn=dsn_of(pg15), tables=(table, other), password_env=env
    )
    ensure_setup(config)
    calls: dict[str, Callable[[PostgresChunkSource], object]] = {
        "key_columns": lambda s: s.key_columns(other),
        "max_key": lambda s: s.max_key(table),
        "split_keys": lambda s: s.split_keys(table, None, (10,), 3, 2),
        "read_chunk": lambda s: s.read_chunk(Chunk(table, 0)).rows,
        "write_watermark": lambda s: s.write_watermark(unique("lw")),
    }
    sources = {name: PostgresChunkSource(config) for name in calls}
    try:
        for source in sources.values():
            assert source.key_columns(table) == ("id",)  # connected
        pg15.restart()
        for name, call in calls.items():
            with pytest.raises(SourceUnavailable, match="lost the PostgreSQL source"):
                call(sources[name])
        assert sources["max_key"].max_key(table) == (10,)
        assert sources["split_keys"].split_keys(table, None, (10,), 3, 2) == [(3,), (6,)]
        assert len(sources["read_chunk"].read_chunk(Chunk(table, 0)).rows) == 10
        assert sources["key_columns"].key_columns(other) == ("k",)
        sources["write_watermark"].write_watermark(unique("lw"))
        pg15.stop()
        with pytest.raises(SourceUnavailable, match="lost the PostgreSQL source"):
            sources["max_key"].max_key(table)
        with pytest.raises(SourceUnavailable, match="cannot connect"):
            sources["max_key"].max_key(table)
    finally:
        pg15.start()
        for source in sources.values():
            source.close()


# --- setup and preflight ------------------------------------------------------------------


def test_ensure_setup_is_idempotent_and_adds_missing_tables(
    postgres: PostgresInfo, make_config: MakeConfig
) -> None:
    first, second = (
        new_table(postgres, "id int PRIMARY KEY"),
        new_table(postgres, "k text PRIMARY KEY"),
    )
    config = make_config((first,))
    ensure_setup(config)
    ensure_setup(config)
    wider = make_config(
        (first, second),
        slot=config.slot,
        publication=config.publication,
        watermark_schema=config.watermark_schema,
    )
    with pytest.raises(SourceError, match=f"lacks {second}"):
        preflight(wider)
    ensure_setup(wider)
    preflight(wider)
    with psycopg.connect(postgres.dsn) as conn:
        watermark = sql.Identifier(config.watermark_schema, config.watermark_table)
        rows = conn.execute(sql.SQL("SELECT id, value FROM {}").format(watermark)).fetchall()
    assert rows == [(1, None)]


def test_tailers_starting_at_once_set_the_source_up_once(
    postgres: PostgresInfo, make_config: MakeConfig
) -> None:
    """Two `ensure_setup` at the same moment on a fresh source (two tailers started together):
    both succeed, where concurrent CREATE ... IF NOT EXISTS of the watermark schema and table
    (or of the publication, or the slot) can fail the second one."""
    config = make_config((new_table(postgres, "id int PRIMARY KEY"),))
    start = threading.Barrier(3)
    failures: list[BaseException] = []

    def set_up() -> None:
        start.wait()
        try:
            ensure_setup(config)
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=set_up) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
    preflight(config)


def test_preflight_names_unknown_tables_and_tables_without_primary_key(
    postgres: PostgresInfo, make_config: MakeConfig
) -> None:
    keyless = new_table(postgres, "id int")
    with pytest.raises(UnknownTable, match="does not exist"):
        preflight(make_config((TableRef("public", unique("missing")),)))
    with pytest.raises(NoPrimaryKey, match="no primary key"):
        preflight(make_config((keyless,)))
    with pytest.raises(NoPrimaryKey):
        ensure_setup(make_config((keyless,)))
    table = new_table(postgres, "id int PRIMARY KEY")
    with pytest.raises(SourceError, match="does not exist: run ensure_setup"):
        preflight(make_config((table,)))


def test_preflight_refuses_a_role_without_replication(
    postgres: PostgresInfo, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    role, password = unique("norepl"), uuid.uuid4().hex
    with psycopg.connect(postgres.admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(password)
            )
        )
    try:
        monkeypatch.setenv("DBLOG_TEST_NOREPL_PASSWORD", password)
        config = make_config(
            (new_table(postgres, "id int PRIMARY KEY"),),
            dsn=dsn_of(postgres, role),
            password_env="DBLOG_TEST_NOREPL_PASSWORD",
        )
        with pytest.raises(SourceError, match=f"ALTER ROLE {role} REPLICATION"):
            preflight(config)
    finally:
        with psycopg.connect(postgres.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def server_dir() -> Iterator[Path]:
    """A directory for a throwaway server. Not under tmp_path: a concurrent pytest session
    resets /tmp/pytest-of-<user> to 0700, which the server's own user then cannot reach."""
    path = Path(tempfile.mkdtemp(prefix="dblog-pg-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_preflight_refuses_a_server_without_logical_decoding(
    server_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = installed(lambda: ReplicaWalServer(server_dir))
    with server:
        info = server.info
        monkeypatch.setenv("DBLOG_TEST_REPLICA_PASSWORD", info.password)
        config = PostgresSourceConfig(
            name="pgtest",
            dsn=dsn_of(info),
            tables=(TableRef("public", "t"),),
            password_env="DBLOG_TEST_REPLICA_PASSWORD",
        )
        with pytest.raises(SourceError, match="wal_level is 'replica'"):
            preflight(config)
        with pytest.raises(SourceError, match="wal_level = logical"):
            ensure_setup(config)


def test_a_wrong_password_is_refused_not_unavailable_and_not_echoed(
    postgres: PostgresInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong password is the server's answer, not an outage: no retry changes it, so it is
    a `SourceError` naming the login and where the password came from, without it."""
    monkeypatch.setenv("DBLOG_TEST_WRONG_PASSWORD", "not-the-password-42")
    config = PostgresSourceConfig(
        name="pgtest",
        dsn=dsn_of(postgres),
        tables=(TableRef("public", "t"),),
        password_env="DBLOG_TEST_WRONG_PASSWORD",
    )
    with pytest.raises(SourceError) as raised:
        preflight(config)
    assert not isinstance(raised.value, SourceUnavailable)
    said = str(raised.value)
    assert "refuses the login" in said and "password authentication failed" in said, said
    assert "DBLOG_TEST_WRONG_PASSWORD" in said and "not-the-password-42" not in said, said


# --- the chunk source ---------------------------------------------------------------------

KEY_KINDS = {
    "bigint": (
        "id bigint PRIMARY KEY, v int",
        "SELECT g * 1000000000000, g FROM generate_series(1, 20) g",
    ),
    "text-int": (
        "name text, n int, v int, PRIMARY KEY (name, n)",
        "SELECT chr(97 + g % 4) || 'é', g, g FROM generate_series(1, 20) g",
    ),
    "uuid": (
        "id uuid PRIMARY KEY, v int",
        "SELECT md5(g::text)::uuid, g FROM generate_series(1, 20) g",
    ),
}


@pytest.mark.parametrize("kind", list(KEY_KINDS))
def test_chunks_walk_the_key_space(
    postgres: PostgresInfo, make_config: MakeConfig, kind: str
) -> None:
    columns, fill = KEY_KINDS[kind]
    table = new_table(postgres, columns)
    execute(postgres, f"INSERT INTO {table} {fill}")
    source = PostgresChunkSource(make_config((table,)))
    try:
        key_columns = source.key_columns(table)
        everything = source.read_chunk(Chunk(table, 0)).rows
        keys = [tuple(row[c] for c in key_columns) for row in everything]
        assert len(keys) == 20 and len(set(keys)) == 20
        assert source.max_key(table) == keys[-1]
        assert source.split_keys(table, None, keys[-1], 3, 4) == [
            keys[2],
            keys[5],
            keys[8],
            keys[11],
        ]
        assert source.split_keys(table, keys[11], keys[-1], 3, 10) == [keys[14], keys[17]]
        assert source.split_keys(table, keys[1], keys[6], 5, 3) == [keys[6]]
        chunk = source.read_chunk(Chunk(table, 1, after=keys[3], upto=keys[15], limit=5))
        assert chunk.rows == everything[4:9]
        assert source.read_chunk(Chunk(table, 2, after=keys[15])).rows == everything[16:]
        assert source.read_chunk(Chunk(table, 3, upto=keys[2])).rows == everything[:3]
        wanted = (keys[7], keys[0], keys[19])
        assert source.read_chunk(Chunk(table, 4, keys=wanted)).rows == [
            everything[0],
            everything[7],
            everything[19],
        ]
    finally:
        source.close()


def test_key_columns_and_max_key_of_odd_tables(
    postgres: PostgresInfo, make_config: MakeConfig
) -> None:
    composite = new_table(postgres, "b int, a text, v int, PRIMARY KEY (a, b)")
    empty = new_table(postgres, "id int PRIMARY KEY")
    keyless = new_table(postgres, "id int")
    source = PostgresChunkSource(make_config((composite,)))
    try:
        assert source.key_columns(composite) == ("a", "b")
        assert source.max_key(empty) is None
        assert source.split_keys(empty, None, (1,), 10, 3) == []
        with pytest.raises(NoPrimaryKey):
            source.key_columns(keyless)
        with pytest.raises(UnknownTable):
            source.key_columns(TableRef("public", unique("missing")))
    finally:
        source.close()


def test_read_chunk_names_the_transactions_its_snapshot_missed(
    postgres: PostgresInfo, make_config: MakeConfig
) -> None:
    """A running transaction is named too: only the reconciler can tell (from the log) whether
    it committed before lw. A commit in the log but not yet visible: dump/test_stale_read.py."""
    table = new_table(postgres, "id int PRIMARY KEY")
    execute(postgres, f"INSERT INTO {table} VALUES (1)")
    source = PostgresChunkSource(make_config((table,)))
    try:
        with psycopg.connect(postgres.dsn) as open_transaction:
            open_transaction.execute(f"INSERT INTO {table} VALUES (2)")  # in progress
            row = open_transaction.execute("SELECT pg_current_xact_id()::text").fetchone()
            assert row is not None
            # A later transaction completes, so the snapshot's xmax passes the open one's xid.
            execute(postgres, f"INSERT INTO {table} VALUES (3)")
            read = source.read_chunk(Chunk(table, 0))
        assert [r["id"] for r in read.rows] == [1, 3]
        assert int(row[0]) & 0xFFFF_FFFF in read.invisible_txids
    finally:
        source.close()


def test_a_dump_neither_waits_for_writers_nor_holds_their_tables_locked(
    postgres: PostgresInfo, make_config: MakeConfig
) -> None:
    """The paper's requirement (e), no locks: with a writer's transaction open on the table (an
    uncommitted update and insert), every call a dump makes returns at once, and between calls
    the dump holds no lock on the table. A lock that blocks writes would conflict with the
    writer's and wait."""
    table = new_table(postgres, "id int PRIMARY KEY, v text")
    execute(postgres, f"INSERT INTO {table} SELECT g, 'a' FROM generate_series(1, 10) g")
    config = make_config((table,))
    ensure_setup(config)
    source = PostgresChunkSource(config)
    seen: dict[str, Any] = {}

    def dump_calls() -> None:
        source.write_watermark("lw-no-lock")
        seen["max_key"] = source.max_key(table)
        seen["rows"] = source.read_chunk(Chunk(table, 0)).rows
        source.write_watermark("hw-no-lock")

    try:
        with psycopg.connect(postgres.dsn) as writer:
            writer.execute(f"UPDATE {table} SET v = 'b' WHERE id = 5")
            writer.execute(f"INSERT INTO {table} VALUES (11, 'c')")
            dump = threading.Thread(target=dump_calls, daemon=True)
            dump.start()
            dump.join(60)
            assert not dump.is_alive(), "a dump call is waiting for the writer's locks"
            held = writer.execute(
                "SELECT mode FROM pg_locks WHERE relation = %s::regclass "
                "AND pid <> pg_backend_pid()",
                (str(table),),
            ).fetchall()
            assert held == []
        assert seen["max_key"] == (10,)
        assert [(r["id"], r["v"]) for r in seen["rows"]][4] == (5, "a")
        assert len(seen["rows"]) == 10
    finally:
        source.close()


def test_write_watermark_needs_its_row(postgres: PostgresInfo, make_config: MakeConfig) -> None:
    table = new_table(postgres, "id int PRIMARY KEY")
    config = make_config((table,))
    ensure_setup(config)
    watermark = sql.Identifier(config.watermark_schema, config.watermark_table)
    source = PostgresChunkSource(config)
    try:
        source.write_watermark("hw-1")
        with psycopg.connect(postgres.dsn) as conn:
            assert conn.execute(sql.SQL("SELECT value FROM {}").format(watermark)).fetchall() == [
                ("hw-1",)
            ]
            conn.execute(sql.SQL("DELETE FROM {}").format(watermark))
        with pytest.raises(SourceError, match="run ensure_setup"):
            source.write_watermark("hw-2")
    finally:
        source.close()
