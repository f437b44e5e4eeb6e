"""The MySQL source's query side on a real MariaDB: setup, keyset chunks over the key types the
server compares itself (composite, case- and accent-insensitive collation, binary(16) UUIDs,
unsigned bigint above 2^63), schema changes between chunks, a lost connection, the watermark,
and preflight's errors (those about the server's binlog on a private MariaDB)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key, Row, TableRef
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo, MariaDBServer
from airflow_provider_dblog.sources.base import (
    InvalidKey,
    NoPrimaryKey,
    NotSetUp,
    SourceError,
    SourceUnavailable,
    UnknownTable,
)
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.sources.mysql.chunks import MysqlChunkSource
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.mysql.setup import binlog_retained, ensure_setup, preflight
from tests.installed import installed
from tests.pg_helpers import wait_for

pytestmark = pytest.mark.integration

PASSWORD_ENV = "DBLOG_TEST_MYSQL_PASSWORD"
MakeConfig = Callable[..., MysqlSourceConfig]


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def execute(info: MariaDBInfo, *statements: str, params: tuple[Any, ...] = ()) -> None:
    """Run statements as the `dblog` user, each committed."""
    with pymysql.connect(**info.connect_kwargs(), autocommit=True) as conn, conn.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement, params or None)


def admin(info: MariaDBInfo, *statements: str, params: tuple[Any, ...] = ()) -> None:
    with (
        pymysql.connect(**info.admin_connect_kwargs(), autocommit=True) as conn,
        conn.cursor() as cursor,
    ):
        for statement in statements:
            cursor.execute(statement, params or None)


@pytest.fixture
def make_config(mariadb: MariaDBInfo, monkeypatch: pytest.MonkeyPatch) -> MakeConfig:
    monkeypatch.setenv(PASSWORD_ENV, mariadb.password)

    def make(*tables: str, **options: Any) -> MysqlSourceConfig:
        fields: dict[str, Any] = {
            "name": "shop",
            "dsn": f"mysql://{mariadb.user}@{mariadb.host}:{mariadb.port}/{mariadb.dbname}",
            "tables": tuple(TableRef(mariadb.dbname, t) for t in tables),
            "password_env": PASSWORD_ENV,
            "watermark_table": unique("watermark"),
            **options,
        }
        return MysqlSourceConfig(**fields)

    return make


@pytest.fixture
def chunks(make_config: MakeConfig) -> Iterator[Callable[..., MysqlChunkSource]]:
    opened: list[MysqlChunkSource] = []

    def open_source(*tables: str) -> MysqlChunkSource:
        config = make_config(*(tables or ("unused",)))
        source = MysqlChunkSource(config)
        opened.append(source)
        return source

    yield open_source
    for source in opened:
        source.close()


def walk(source: MysqlChunkSource, table: TableRef, chunk_size: int) -> list[Row]:
    """Every row of `table`, chunk by chunk as a dump plans them (split keys, then ranges)."""
    upto = source.max_key(table)
    assert upto is not None
    bounds: list[Key | None] = [None, *source.split_keys(table, None, upto, chunk_size, 1000)]
    rows: list[Row] = []
    for seq, (after, bound) in enumerate(zip(bounds, [*bounds[1:], upto], strict=True)):
        rows += source.read_chunk(Chunk(table, seq, after=after, upto=bound)).rows
    return rows


def test_a_composite_key_is_walked_in_key_order(
    mariadb: MariaDBInfo, chunks: Callable[..., MysqlChunkSource]
) -> None:
    name = unique("orders")
    table = TableRef(mariadb.dbname, name)
    values = ", ".join(f"({a}, 'k{b}', {a * 10 + b})" for a in range(5) for b in range(4))
    execute(
        mariadb,
        f"CREATE TABLE {name} (a int, b varchar(8), v int, PRIMARY KEY (a, b))",
        f"INSERT INTO {name} VALUES {values}",
    )
    source = chunks(name)
    assert source.key_columns(table) == ("a", "b")
    assert source.max_key(table) == (4, "k3")
    assert source.split_keys(table, (1, "k2"), (4, "k3"), 3, 10) == [
        (2, "k1"),
        (3, "k0"),
        (3, "k3"),
        (4, "k2"),
    ]
    rows = walk(source, table, 3)
    assert [(r["a"], r["b"]) for r in rows] == [(a, f"k{b}") for a in range(5) for b in range(4)]
    limited = source.read_chunk(Chunk(table, 0, after=(2, "k2"), limit=3)).rows
    assert [(r["a"], r["b"]) for r in limited] == [(2, "k3"), (3, "k0"), (3, "k1")]
    keyed = source.read_chunk(Chunk(table, 0, keys=((4, "k0"), (0, "k1"), (9, "k9")))).rows
    assert keyed == [{"a": 0, "b": "k1", "v": 1}, {"a": 4, "b": "k0", "v": 40}]


def test_varchar_keys_compare_in_the_columns_collation(
    mariadb: MariaDBInfo, chunks: Callable[..., MysqlChunkSource]
) -> None:
    """utf8mb4_unicode_ci: 'a' = 'A' and 'e' = 'é'; the session's utf8mb4_bin must not win."""
    name = unique("people")
    table = TableRef(mariadb.dbname, name)
    execute(
        mariadb,
        f"CREATE TABLE {name} (k varchar(10) COLLATE utf8mb4_unicode_ci PRIMARY KEY, v int)",
        f"INSERT INTO {name} VALUES ('a', 1), ('B', 2), ('c', 3), ('é', 4), ('Z', 5)",
    )
    source = chunks(name)
    assert [r["k"] for r in walk(source, table, 2)] == ["a", "B", "c", "é", "Z"]
    after_a = source.read_chunk(Chunk(table, 0, after=("A",), upto=("D",))).rows
    assert [r["k"] for r in after_a] == ["B", "c"]
    found = source.read_chunk(Chunk(table, 0, keys=(("A",), ("E",)))).rows
    assert [r["k"] for r in found] == ["a", "é"]


def test_enum_keys_walk_in_member_order(
    mariadb: MariaDBInfo, chunks: Callable[..., MysqlChunkSource]
) -> None:
    """The server orders an enum by member number; bounds compared as text would skip 'a'."""
    name = unique("statuses")
    table = TableRef(mariadb.dbname, name)
    execute(
        mariadb,
        f"CREATE TABLE {name} (e enum('b','a','c'), k int, PRIMARY KEY (e, k))",
        f"INSERT INTO {name} VALUES ('a', 1), ('b', 1), ('c', 1), ('b', 2)",
    )
    source = chunks(name)
    assert [(r["e"], r["k"]) for r in walk(source, table, 1)] == [
        ("b", 1),
        ("b", 2),
        ("a", 1),
        ("c", 1),
    ]
    keyed = source.read_chunk(Chunk(table, 0, keys=(("a", 1), ("c", 1)))).rows
    assert keyed == [{"e": "a", "k": 1}, {"e": "c", "k": 1}]


def test_float_keys_bound_at_their_stored_value(
    mariadb: MariaDBInfo, chunks: Callable[..., MysqlChunkSource]
) -> None:
    name = unique("floats")
    table = TableRef(mariadb.dbname, name)
    execute(
        mariadb,
        f"CREATE TABLE {name} (f float PRIMARY KEY)",
        f"INSERT INTO {name} VALUES (0.1), (1.1), (2.2)",
    )
    source = chunks(name)
    assert [r["f"] for r in walk(source, table, 1)] == [0.1, 1.1, 2.2]
    assert source.read_chunk(Chunk(table, 0, keys=((1.1,),))).rows == [{"f": 1.1}]


def test_binary_uuid_keys_walk_in_byte_order(
    mariadb: MariaDBInfo, chunks: Callable[..., MysqlChunkSource]
) -> None:
    name = unique("devices")
    table = TableRef(mariadb.dbname, name)
    ids = sorted([uuid.uuid4().bytes for _ in range(20)] + [b"\x01" + b"\0" * 15])
    execute(mariadb, f"CREATE TABLE {name} (id binary(16) PRIMARY KEY, n int)")
    with (
        pymysql.connect(**mariadb.connect_kwargs(), autocommit=True) as conn,
        conn.cursor() as cursor,
    ):
        cursor.executemany(
            f"INSERT INTO {name} VALUES (%s, %s)", [(i, n) for n, i in enumerate(ids)]
        )
    source = chunks(name)
    rows = walk(source, table, 6)
    assert [r["n"] for r in rows] == list(range(len(ids)))
    # the key with trailing zero bytes comes back whole, and finds its row
    zero_tail = rows[ids.index(b"\x01" + b"\0" * 15)]
    assert zero_tail["id"] == "AQAAAAAAAAAAAAAAAAAAAA=="
    other = next(r for r in rows[5:] if r is not zero_tail)
    keyed = source.read_chunk(Chunk(table, 0, keys=((zero_tail["id"],), (other["id"],))))
    assert [r["n"] for r in keyed.rows] == sorted([zero_tail["n"], other["n"]])


def test_unsigned_bigint_keys_above_2_to_the_63(
    mariadb: MariaDBInfo, chunks: Callable[..., MysqlChunkSource]
) -> None:
    name = unique("counters")
    table = TableRef(mariadb.dbname, name)
    keys = [1, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1]
    execute(
        mariadb,
        f"CREATE TABLE {name} (id bigint unsigned PRIMARY KEY)",
        f"INSERT INTO {name} VALUES {', '.join(f'({k})' for k in keys)}",
    )
    source = chunks(name)
    assert source.max_key(table) == (2**64 - 1,)
    assert source.split_keys(table, None, (2**64 - 1,), 2, 10) == [(2**63 - 1,), (2**63 + 1,)]
    upper = source.read_chunk(Chunk(table, 0, after=(2**63 - 1,), upto=(2**64 - 2,))).rows
    assert upper == [{"id": 2**63}, {"id": 2**63 + 1}]


def test_a_schema_change_between_chunks_is_read_with_the_new_columns(
    mariadb: MariaDBInfo, chunks: Callable[..., MysqlChunkSource]
) -> None:
    name = unique("items")
    table = TableRef(mariadb.dbname, name)
    execute(
        mariadb,
        f"CREATE TABLE {name} (id int PRIMARY KEY, a int, f float)",
        f"INSERT INTO {name} VALUES (1, 10, 1.1), (2, 20, 2.2)",
    )
    source = chunks(name)
    assert source.read_chunk(Chunk(table, 0, upto=(1,))).rows == [{"id": 1, "a": 10, "f": 1.1}]
    execute(mariadb, f"ALTER TABLE {name} ADD COLUMN b varchar(5) DEFAULT 'x'")
    assert source.read_chunk(Chunk(table, 1, after=(1,))).rows == [
        {"id": 2, "a": 20, "f": 2.2, "b": "x"}
    ]
    execute(mariadb, f"ALTER TABLE {name} DROP COLUMN f")
    assert source.read_chunk(Chunk(table, 2, after=(1,))).rows == [{"id": 2, "a": 20, "b": "x"}]
    execute(mariadb, f"ALTER TABLE {name} DROP PRIMARY KEY, ADD PRIMARY KEY (a)")
    with pytest.raises(SourceError, match=rf"primary key of .*{name} changed .*dump .* again"):
        source.read_chunk(Chunk(table, 3, after=(1,)))


def test_a_killed_connection_is_source_unavailable_then_reconnects(
    mariadb: MariaDBInfo, chunks: Callable[..., MysqlChunkSource]
) -> None:
    name = unique("lost")
    table = TableRef(mariadb.dbname, name)
    execute(mariadb, f"CREATE TABLE {name} (id int PRIMARY KEY)", f"INSERT INTO {name} VALUES (7)")
    source = chunks(name)
    assert source.max_key(table) == (7,)
    with (
        pymysql.connect(**mariadb.admin_connect_kwargs(), autocommit=True) as conn,
        conn.cursor() as cursor,
    ):
        cursor.execute(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s AND DB = %s"
            " AND COMMAND = 'Sleep'",
            (mariadb.user, mariadb.dbname),
        )
        for (connection_id,) in cursor.fetchall():
            cursor.execute(f"KILL CONNECTION {int(connection_id)}")
    with pytest.raises(SourceUnavailable, match="lost the MySQL source shop"):
        source.read_chunk(Chunk(table, 0))
    assert source.read_chunk(Chunk(table, 0)).rows == [{"id": 7}]


def test_a_restarted_server_is_source_unavailable_then_reconnects(
    mariadb: MariaDBInfo, chunks: Callable[..., MysqlChunkSource]
) -> None:
    name = unique("restarted")
    table = TableRef(mariadb.dbname, name)
    execute(mariadb, f"CREATE TABLE {name} (id int PRIMARY KEY)", f"INSERT INTO {name} VALUES (3)")
    source = chunks(name)
    assert source.read_chunk(Chunk(table, 0)).rows == [{"id": 3}]
    mariadb.restart()
    with pytest.raises(SourceUnavailable, match="lost the MySQL source shop"):
        source.write_watermark("after-restart")
    assert source.read_chunk(Chunk(table, 0)).rows == [{"id": 3}]


def test_setup_then_watermarks_each_new_value_once(
    mariadb: MariaDBInfo, make_config: MakeConfig
) -> None:
    name = unique("paid")
    execute(mariadb, f"CREATE TABLE {name} (id int PRIMARY KEY)")
    config = make_config(name)
    with pytest.raises(SourceError, match=r"watermark table .* does not exist: run ensure_setup"):
        preflight(config)
    source = source_for(config)
    source.ensure_setup()
    source.ensure_setup()  # safe to run again
    source.preflight()
    assert source.database() == mariadb.dbname
    chunk_source = source.chunk_source()
    try:
        chunk_source.write_watermark("lw-1")
        chunk_source.write_watermark("hw-1")
        with pytest.raises(SourceError, match=r"already holds 'hw-1'.*must be new"):
            chunk_source.write_watermark("hw-1")
    finally:
        chunk_source.close()
    with pymysql.connect(**mariadb.connect_kwargs()) as conn, conn.cursor() as cursor:
        cursor.execute(f"SELECT id, value FROM {config.watermark_table}")
        assert cursor.fetchall() == ((1, "hw-1"),)


def test_preflight_names_unknown_tables_missing_keys_and_grants(
    mariadb: MariaDBInfo, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyless, view = unique("keyless"), unique("view")
    execute(
        mariadb,
        f"CREATE TABLE {keyless} (a int)",
        f"CREATE VIEW {view} AS SELECT 1 AS a",
    )
    with pytest.raises(UnknownTable, match=r"dblog\.nope does not exist"):
        preflight(make_config("nope"))
    with pytest.raises(UnknownTable, match="is a view, not a table"):
        preflight(make_config(view))
    with pytest.raises(NoPrimaryKey, match=rf"{keyless} has no primary key.*ADD PRIMARY KEY"):
        preflight(make_config(keyless))

    user, password = unique("plain"), uuid.uuid4().hex
    admin(
        mariadb,
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
        f"GRANT ALL ON `{mariadb.dbname}`.* TO '{user}'@'%'",
        f"GRANT REPLICATION SLAVE ON *.* TO '{user}'@'%'",
    )
    monkeypatch.setenv("DBLOG_TEST_PLAIN_PASSWORD", password)
    dsn = f"mysql://{user}@{mariadb.host}:{mariadb.port}/{mariadb.dbname}"
    plain = make_config("nope", dsn=dsn, password_env="DBLOG_TEST_PLAIN_PASSWORD")
    with pytest.raises(SourceError, match=rf"'{user}'@'%' may not read the binlog: GRANT REPL"):
        preflight(plain)
    admin(mariadb, f"REVOKE REPLICATION SLAVE ON *.* FROM '{user}'@'%'")
    with pytest.raises(SourceError, match="GRANT REPLICATION SLAVE, REPLICATION CLIENT ON"):
        preflight(plain)


class ConfigurableMariaDB(MariaDBServer):
    """A private MariaDB whose binary log can be switched off (a restart)."""

    log_bin = True

    def _command(self) -> list[str]:
        command = super()._command()
        if self.log_bin:
            return command
        return [a for a in command if not a.startswith(("--log-bin", "--binlog-"))]


def test_preflight_names_each_unusable_binlog_and_a_purged_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with installed(lambda: ConfigurableMariaDB(tmp_path)) as server:
        info = server.info
        monkeypatch.setenv(PASSWORD_ENV, info.password)
        config = MysqlSourceConfig(
            name="private",
            dsn=f"mysql://{info.user}@{info.host}:{info.port}/{info.dbname}",
            tables=(TableRef(info.dbname, "paid"),),
            password_env=PASSWORD_ENV,
        )
        execute(info, "CREATE TABLE paid (id int PRIMARY KEY)")
        ensure_setup(config)
        preflight(config)

        for setting, value, good, message in [
            ("binlog_format", "STATEMENT", "ROW", "binlog_format is STATEMENT: DBLog reads row"),
            ("binlog_format", "MIXED", "ROW", "binlog_format is MIXED"),
            ("binlog_row_image", "MINIMAL", "FULL", "binlog_row_image is MINIMAL"),
        ]:
            admin(info, f"SET GLOBAL {setting} = '{value}'")
            with pytest.raises(SourceError, match=message):
                preflight(config)
            admin(info, f"SET GLOBAL {setting} = '{good}'")

        admin(info, "SET GLOBAL binlog_row_metadata = 'MINIMAL'")
        with caplog.at_level(logging.WARNING):
            preflight(config)
        assert "binlog_row_metadata is MINIMAL" in caplog.text
        admin(info, "SET GLOBAL binlog_row_metadata = 'FULL'")

        with pymysql.connect(**info.admin_connect_kwargs()) as conn, conn.cursor() as cursor:
            cursor.execute("SHOW BINARY LOGS")
            first = cursor.fetchall()[0][0]
            cursor.execute("FLUSH BINARY LOGS")
            cursor.execute("SHOW BINARY LOGS")
            last = cursor.fetchall()[-1][0]

            def purged() -> bool:
                """MariaDB keeps a file until its binlog checkpoint is written, so PURGE may
                leave it the first times."""
                cursor.execute(f"PURGE BINARY LOGS TO '{last}'")
                cursor.execute("SHOW BINARY LOGS")
                return [row[0] for row in cursor.fetchall()] == [last]

            wait_for(purged, what=f"binlogs before {last} purged")
        binlog_retained(config, last)
        with pytest.raises(SourceError, match=rf"{first} of the checkpoint is gone.*{last}"):
            binlog_retained(config, first)

        server.stop()
        server.log_bin = False
        server.start()
        with pytest.raises(SourceError, match="the binary log is off"):
            preflight(config)


def test_check_keys_lets_the_server_judge_and_normalise_key_values(
    mariadb: MariaDBInfo, chunks: Callable[..., MysqlChunkSource]
) -> None:
    ints, mixed = unique("ints"), unique("mixed")
    execute(
        mariadb,
        f"CREATE TABLE {ints} (id int PRIMARY KEY)",
        f"CREATE TABLE {mixed} (region varchar(8), day date, id binary(4), flag bool,"
        " amount decimal(6,2), PRIMARY KEY (region, day, id, flag, amount))",
    )
    source = chunks(ints, mixed)
    ints_ref, mixed_ref = TableRef(mariadb.dbname, ints), TableRef(mariadb.dbname, mixed)
    assert source.check_keys(ints_ref, [("7",), (7,), ("007",), ("8",)]) == ((7,), (8,))
    assert source.check_keys(
        mixed_ref,
        [("eu", "2024-1-2", "AQIAAA==", True, "1.5"), ("EU", "2024-01-02", "AQIAAA==", 1, 1.5)],
    ) == (("eu", "2024-01-02", "AQIAAA==", 1, "1.50"), ("EU", "2024-01-02", "AQIAAA==", 1, "1.50"))
    assert source.check_keys(ints_ref, []) == ()
    for table, key, named in [
        (ints_ref, ("abc",), "'abc' is not a valid int(11) for column id"),
        (ints_ref, ("99999999999",), "'99999999999' is not a valid int(11)"),
        (ints_ref, (1.5,), "1.5 is not a valid int(11)"),
        (mixed_ref, ("eu", "2024-13-01", "AQIAAA==", 1, 1), "'2024-13-01' is not a valid date"),
        (mixed_ref, ("eu", "2024-01-01", "***", 1, 1), "'***' is not a valid binary(4)"),
        (
            mixed_ref,
            ("eu", "2024-01-01", "AQIAAA==", "maybe", 1),
            "'maybe' is not a valid tinyint(1)",
        ),
        (
            mixed_ref,
            ("toolong-region", "2024-01-01", "AQIAAA==", 1, 1),
            "varchar(8) for column region",
        ),
    ]:
        with pytest.raises(InvalidKey, match=r"^key value ") as refused:
            source.check_keys(table, [key])
        assert named in str(refused.value)
        assert f"of {table}: " in str(refused.value)
    with pytest.raises(InvalidKey, match="has 1 value"):
        source.check_keys(mixed_ref, [("eu",)])
    with pytest.raises(UnknownTable):
        source.check_keys(TableRef(mariadb.dbname, "nope"), [("1",)])


def test_check_ready_says_what_to_run(mariadb: MariaDBInfo, make_config: MakeConfig) -> None:
    """A writing source needs its watermark table; a read-only dump of it (MariaDB gives each
    snapshot's binlog position) does not, and its chunk source refuses a watermark write."""
    config = make_config("unused")
    read_only = MysqlChunkSource(config, read_only=True)
    try:
        assert read_only.read_only and not config.read_only
        read_only.check_ready()
        with pytest.raises(SourceError, match=r"^a read-only dump of source \S+ writes no"):
            read_only.write_watermark("lw")
    finally:
        read_only.close()
    source = MysqlChunkSource(config)
    try:
        with pytest.raises(NotSetUp, match=r"does not exist.*dblog tail"):
            source.check_ready()
        execute(
            mariadb,
            f"CREATE TABLE {config.watermark_table} (id int PRIMARY KEY, value varchar(255))",
        )
        with pytest.raises(NotSetUp, match="holds 0 rows"):
            source.check_ready()
        with pytest.raises(NotSetUp, match="has no row: run ensure_setup"):
            source.write_watermark("lw")
        execute(mariadb, f"INSERT INTO {config.watermark_table} VALUES (1, NULL)")
        source.check_ready()
    finally:
        source.close()
