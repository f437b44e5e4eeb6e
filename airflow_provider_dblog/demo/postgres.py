"""The demo on PostgreSQL (`story.py` tells it): the target is a second database of the same
server, written by the SQL-apply output in monotonic mode, and the repair's keys are rows of
accounts corrupted in the target on purpose. The sample tables, their seed and the writes serve
the tests and the Docker setup too."""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, ClassVar

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from airflow_provider_dblog.core.event import Key, TableRef
from airflow_provider_dblog.demo.story import DemoBackend, RandomWrites, seed_rows
from airflow_provider_dblog.devservices.pg_replica import PostgresReplica
from airflow_provider_dblog.devservices.postgres import PostgresInfo, PostgresServer
from airflow_provider_dblog.outputs.base import Output
from airflow_provider_dblog.outputs.sql_apply import SqlApplyOutput
from airflow_provider_dblog.sources.base import Source
from airflow_provider_dblog.sources.postgres.lsn import parse_pg_lsn
from airflow_provider_dblog.state import StateStore

SCHEMA = """
CREATE TABLE public.accounts (id bigint PRIMARY KEY, owner text NOT NULL, balance numeric(12,2),
                              active boolean, updated timestamptz DEFAULT now());
CREATE TABLE public.orders (region text, n int, amount numeric, note varchar(200), tags text[],
                            PRIMARY KEY (region, n));
CREATE TABLE public.items (id uuid PRIMARY KEY, name text, attrs jsonb, blob bytea);
"""
TABLES = (TableRef("public", "accounts"), TableRef("public", "orders"), TableRef("public", "items"))
ORDER_KEYS = {"accounts": "id", "orders": "region, n", "items": "id"}


INSERTS = {
    "accounts": "INSERT INTO accounts (id, owner, balance, active) VALUES (%s, %s, %s, %s)",
    "orders": "INSERT INTO orders VALUES (%s, %s, %s, %s, %s)",
    "items": "INSERT INTO items VALUES (%s, %s, %s, %s)",
}


def _values(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """Python values as psycopg writes them into the sample tables (a dict as jsonb)."""
    return tuple(Jsonb(v) if isinstance(v, dict) else v for v in values)


class Workload(RandomWrites):
    """`RandomWrites` on PostgreSQL, at `dsn`."""

    statements: ClassVar[Mapping[str, str]] = {
        "upsert accounts": "INSERT INTO accounts (id, owner, balance, active) "
        "VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, "
        "active = excluded.active, updated = now()",
        "delete accounts": "DELETE FROM accounts WHERE id = %s",
        "upsert orders": "INSERT INTO orders VALUES (%s, %s, %s, %s, %s) ON CONFLICT (region, n) "
        "DO UPDATE SET amount = excluded.amount, tags = excluded.tags",
        "delete orders": "DELETE FROM orders WHERE region = %s AND n = %s",
        "insert items": INSERTS["items"],
        "update items": "UPDATE items SET name = %s WHERE id = %s",
        "delete items": "DELETE FROM items WHERE id = %s",
        "random item": "SELECT id FROM items ORDER BY random() LIMIT 1",
    }

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(seed)
        self._dsn = dsn

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self._dsn, autocommit=True)

    def _transaction(self, conn: psycopg.Connection[Any]) -> AbstractContextManager[Any]:
        return conn.transaction()

    def _execute(
        self, conn: psycopg.Connection[Any], statement: str, values: tuple[Any, ...]
    ) -> Any:
        cursor = conn.execute(self.statements[statement], _values(values))
        return cursor.fetchone() if cursor.description else None


def seed(conn: psycopg.Connection[Any], rows: int, rng: random.Random) -> int:
    """Create the sample tables in the connection's database with `rows` rows in each."""
    conn.execute(SCHEMA)
    with conn.cursor() as cur:
        for table, values in seed_rows(rows, rng).items():
            cur.executemany(INSERTS[table], [_values(v) for v in values])
    return rows * 3


def snapshot(dsn: str) -> dict[str, list[str]]:
    """Every table as sorted JSON rows, printed by PostgreSQL itself."""
    with psycopg.connect(dsn) as conn:
        return {
            table: [
                r[0]
                for r in conn.execute(
                    f"SELECT row_to_json(t)::text FROM {table} t ORDER BY {order}"
                )
            ]
            for table, order in ORDER_KEYS.items()
        }


def compare(source_dsn: str, target_dsn: str) -> list[str]:
    source, target = snapshot(source_dsn), snapshot(target_dsn)
    problems = []
    for table in ORDER_KEYS:
        missing = set(source[table]) - set(target[table])
        extra = set(target[table]) - set(source[table])
        if missing or extra:
            problems.append(f"{table}: {len(missing)} rows differ or missing, {len(extra)} extra")
    return problems


def _dsn(pg: PostgresInfo) -> str:
    """The demo source's DSN on `pg`, without the password (the source reads it from the
    environment)."""
    return f"host={pg.host} port={pg.port} dbname={pg.dbname} user={pg.user}"


class PostgresDemo(DemoBackend):
    """The story's PostgreSQL: the source database and, on the same server, the target."""

    database = "PostgreSQL"
    sample_tables = "accounts (bigint key), orders ((text, int) key), items (uuid)"
    target = "the SQL target"

    def __init__(self, pg: PostgresInfo, replica: PostgresInfo | None = None) -> None:
        self.pg, self.replica = pg, replica
        self.password = pg.password
        self.target_dsn = pg.dsn.rsplit("/", 1)[0] + "/dblog_target"
        self.slot = f"demo_{secrets.token_hex(3)}"

    @classmethod
    @contextmanager
    def started(cls, base: Path, *, replica: bool = False) -> Iterator[PostgresDemo]:
        with PostgresServer(base / "pg") as pg:
            if not replica:
                yield cls(pg.info)
                return
            with PostgresReplica(pg, base / "pg-replica") as standby:
                yield cls(pg.info, standby.info)

    def seed(self, rows: int, rng: random.Random) -> int:
        pg = self.pg
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            seeded = seed(conn, rows, rng)
        with psycopg.connect(pg.admin_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE dblog_target OWNER {pg.user}")
        with psycopg.connect(self.target_dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
        return seeded

    def source_section(self) -> dict[str, Any]:
        section = {
            "type": "postgres",
            "dsn": _dsn(self.pg),
            "tables": [str(t) for t in TABLES],
            "slot": self.slot,
        }
        if self.replica is not None:
            section["read_replica"] = _dsn(self.replica)
        return section

    def prepare_read_only(self) -> None:
        """The publication, as the tables' owner (it publishes every operation by default)."""
        tables = sql.SQL(", ").join(sql.Identifier(t.schema, t.name) for t in TABLES)
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE PUBLICATION dblog FOR TABLE {}").format(tables))

    def output(self) -> tuple[Output, str]:
        return SqlApplyOutput(self.target_dsn, monotonic=True), "tailer running"

    def workload(self, seed: int) -> RandomWrites:
        return Workload(self.pg.dsn, seed)

    def keys_to_repair(
        self, rows: int, rng: random.Random, say: Callable[[str], None]
    ) -> list[Key]:
        with psycopg.connect(self.target_dsn, autocommit=True) as conn:
            ids = [r[0] for r in conn.execute("SELECT id FROM accounts ORDER BY id LIMIT 2000")]
            chosen = sorted(rng.sample(ids, min(20, len(ids))))
            conn.execute("UPDATE accounts SET owner = 'CORRUPTED' WHERE id = ANY(%s)", (chosen,))
        say(f"corrupted {len(chosen)} rows of accounts in the target; repairing those keys")
        return [(k,) for k in chosen]

    def tailer_at_log_end(self, store: StateStore) -> Callable[[], bool]:
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        end = parse_pg_lsn(row[0])
        return lambda: self._slot_confirmed() >= end

    def _slot_confirmed(self) -> int:
        """The LSN the tailer confirmed on the slot (0 before its first)."""
        with psycopg.connect(self.pg.dsn) as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                (self.slot,),
            ).fetchone()
        return 0 if row is None or row[0] is None else parse_pg_lsn(row[0])

    def differences(
        self, source: Source, keys: list[Key], repaired_rows: int, say: Callable[[str], None]
    ) -> list[str]:
        return compare(self.pg.dsn, self.target_dsn)
