"""The demo on MariaDB (`story.py` tells it): the three sample tables in MySQL types (a
`binary(16)` uuid key), the binlog tailer into NDJSON files. The SQL-apply output writes
PostgreSQL, so the target here is the NDJSON stream: at the end it is replayed by the
consumer rules and must equal the source row for row (as the dump's converters read it), and
the repair, of 20 keys of accounts, must have emitted exactly the keys asked for.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pymysql

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Event, Key, Op, Row
from airflow_provider_dblog.demo.story import TABLE_NAMES, DemoBackend, RandomWrites, seed_rows
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo, MariaDBServer
from airflow_provider_dblog.devservices.mariadb_replica import MariaDBReplica
from airflow_provider_dblog.outputs.base import Output
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput, read_events
from airflow_provider_dblog.sources.base import Source
from airflow_provider_dblog.sources.mysql.coordinates import binlog_file_number, mysql_commit
from airflow_provider_dblog.state import StateStore

SCHEMA = (
    "CREATE TABLE accounts (id bigint PRIMARY KEY, owner varchar(100) NOT NULL, "
    "balance decimal(12,2), active boolean, updated datetime(6) DEFAULT CURRENT_TIMESTAMP(6))",
    "CREATE TABLE orders (region varchar(8), n int, amount decimal(14,2), note varchar(200), "
    "tags json, PRIMARY KEY (region, n))",
    "CREATE TABLE items (id binary(16) PRIMARY KEY, name varchar(100), attrs json, "
    "data varbinary(64))",
)
"""The demo's tables on MySQL: a `binary(16)` uuid key (its JSON is base64), `json` for
PostgreSQL's `text[]` and `jsonb`."""
RowKey = tuple[str, str]
"""(table name, JSON list of the key values in primary-key order)."""


INSERTS = {
    "accounts": "INSERT INTO accounts (id, owner, balance, active) VALUES (%s, %s, %s, %s)",
    "orders": "INSERT INTO orders (region, n, amount, note, tags) VALUES (%s, %s, %s, %s, %s)",
    "items": "INSERT INTO items (id, name, attrs, data) VALUES (%s, %s, %s, %s)",
}


def _values(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """Python values as PyMySQL writes them into the sample tables: lists and dicts as JSON
    text, a uuid as its 16 bytes."""
    return tuple(
        json.dumps(v) if isinstance(v, list | dict) else v.bytes if isinstance(v, uuid.UUID) else v
        for v in values
    )


def seed(cursor: pymysql.cursors.Cursor, rows: int, rng: random.Random) -> int:
    """Create the tables in the cursor's database and write `rows` rows into each."""
    for statement in SCHEMA:
        cursor.execute(statement)
    for table, values in seed_rows(rows, rng).items():
        cursor.executemany(INSERTS[table], [_values(v) for v in values])
    return rows * 3


class Workload(RandomWrites):
    """`RandomWrites` on MariaDB, logged in as `info` says."""

    statements: ClassVar[Mapping[str, str]] = {
        "upsert accounts": f"{INSERTS['accounts']} ON DUPLICATE KEY UPDATE "
        "balance = VALUES(balance), active = VALUES(active), updated = CURRENT_TIMESTAMP(6)",
        "delete accounts": "DELETE FROM accounts WHERE id = %s",
        "upsert orders": f"{INSERTS['orders']} ON DUPLICATE KEY UPDATE "
        "amount = VALUES(amount), tags = VALUES(tags)",
        "delete orders": "DELETE FROM orders WHERE region = %s AND n = %s",
        "insert items": INSERTS["items"],
        "update items": "UPDATE items SET name = %s WHERE id = %s",
        "delete items": "DELETE FROM items WHERE id = %s",
        "random item": "SELECT id FROM items ORDER BY RAND() LIMIT 1",
    }

    def __init__(self, info: MariaDBInfo, seed: int) -> None:
        super().__init__(seed)
        self._info = info

    def _connect(self) -> pymysql.connections.Connection[Any]:
        return pymysql.connect(**self._info.connect_kwargs())

    @contextmanager
    def _transaction(self, conn: pymysql.connections.Connection[Any]) -> Iterator[None]:
        conn.begin()
        yield
        conn.commit()

    def _execute(
        self, conn: pymysql.connections.Connection[Any], statement: str, values: tuple[Any, ...]
    ) -> Any:
        with conn.cursor() as cursor:
            cursor.execute(self.statements[statement], _values(values))
            return cursor.fetchone()


def row_key(table: str, values: Iterable[Any]) -> RowKey:
    return table, json.dumps(list(values))


def replay(events: Iterable[Event]) -> dict[RowKey, Row]:
    """The tables as the stream says they are (the consumer rules of docs/operations.md for the
    row events and truncates; the demo's tables change no columns)."""
    state: dict[RowKey, Row] = {}
    for event in events:
        table = event.source.table
        if event.op is Op.TRUNCATE:
            state = {k: v for k, v in state.items() if k[0] != table}
        elif event.op is Op.DELETE:
            state.pop(row_key(table, event.key.values()), None)
        elif event.after is not None:
            state[row_key(table, event.key.values())] = event.after
    return state


def source_rows(source: Source) -> dict[RowKey, Row]:
    """Every row of the captured tables, as the dump's converters give it."""
    chunks = source.chunk_source()
    try:
        state: dict[RowKey, Row] = {}
        for table in source.tables:
            columns = chunks.key_columns(table)
            for row in chunks.read_chunk(Chunk(table, 0)).rows:
                state[row_key(table.name, (row[c] for c in columns))] = row
        return state
    finally:
        chunks.close()


def differences(expected: dict[RowKey, Row], actual: dict[RowKey, Row]) -> list[str]:
    """Per table: how many rows are missing from `actual`, extra in it, or differ."""
    problems = []
    for table in TABLE_NAMES:
        want = {k: v for k, v in expected.items() if k[0] == table}
        have = {k: v for k, v in actual.items() if k[0] == table}
        missing = sum(1 for k, v in want.items() if have.get(k) != v)
        extra = len(set(have) - set(want))
        if missing or extra:
            problems.append(f"{table}: {missing} rows differ or missing, {extra} extra")
    return problems


def binlog_end(info: MariaDBInfo) -> int:
    """The binlog's end now, as the reader's positions spell it."""
    with pymysql.connect(**info.connect_kwargs()) as conn, conn.cursor() as cursor:
        cursor.execute("SHOW MASTER STATUS")
        row = cursor.fetchone()
    if row is None:
        raise RuntimeError("demo: the MariaDB binlog is off")
    return mysql_commit(binlog_file_number(str(row[0])), int(row[1]))


def _dsn(info: MariaDBInfo) -> str:
    """The demo source's DSN on `info`, without the password (read from the environment)."""
    return f"mysql://{info.user}@{info.host}:{info.port}/{info.dbname}"


class MariaDBDemo(DemoBackend):
    """The story's MariaDB, its target the tailer's NDJSON files in `events_dir`."""

    database = "MariaDB"
    sample_tables = "accounts (bigint key), orders ((varchar, int) key), items (binary(16) uuid)"
    target = "the NDJSON replayed"

    def __init__(
        self, info: MariaDBInfo, events_dir: Path, replica: MariaDBInfo | None = None
    ) -> None:
        self.info, self.events_dir, self.replica = info, events_dir, replica
        self.password = info.password

    @classmethod
    @contextmanager
    def started(cls, base: Path, *, replica: bool = False) -> Iterator[MariaDBDemo]:
        with MariaDBServer(base / "mariadb") as db:
            if not replica:
                yield cls(db.info, base / "events")
                return
            with MariaDBReplica(db, base / "mariadb-replica") as copy:
                yield cls(db.info, base / "events", copy.info)

    def seed(self, rows: int, rng: random.Random) -> int:
        with pymysql.connect(**self.info.connect_kwargs()) as conn, conn.cursor() as cursor:
            seeded = seed(cursor, rows, rng)
            conn.commit()
        return seeded

    def source_section(self) -> dict[str, Any]:
        section = {
            "type": "mysql",
            "dsn": _dsn(self.info),
            "tables": list(TABLE_NAMES),
            "watermark_database": self.info.dbname,
        }
        if self.replica is not None:
            section["read_replica"] = _dsn(self.replica)
        return section

    def prepare_read_only(self) -> None:
        """Nothing: the binlog and the snapshot's position are there for any reader."""

    def output(self) -> tuple[Output, str]:
        running = f"binlog tailer running into NDJSON in {self.events_dir}"
        return NdjsonOutput(self.events_dir), running

    def workload(self, seed: int) -> RandomWrites:
        return Workload(self.info, seed)

    def keys_to_repair(
        self, rows: int, rng: random.Random, say: Callable[[str], None]
    ) -> list[Key]:
        keys: list[Key] = [(k,) for k in sorted(rng.sample(range(1, rows + 1), min(20, rows)))]
        say(f"repairing {len(keys)} keys of accounts")
        return keys

    def tailer_at_log_end(self, store: StateStore) -> Callable[[], bool]:
        end = binlog_end(self.info)
        return lambda: (store.tailer.load_checkpoint() or 0) >= end - 1

    def differences(
        self, source: Source, keys: list[Key], repaired_rows: int, say: Callable[[str], None]
    ) -> list[str]:
        events = list(read_events(self.events_dir))
        problems = differences(source_rows(source), replay(events))
        if repaired_rows != len(keys):
            problems.append(f"the repair emitted {repaired_rows} rows, not {len(keys)}")
        say(f"replayed {len(events)} NDJSON events against the source")
        return problems
