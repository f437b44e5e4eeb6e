"""The demo's story, the same on every source database: the whole of DBLog on private servers,
with nothing set up by hand.

It starts the database and Redis in a temp dir, creates three sample tables (accounts: a bigint
key; orders: a composite (text, int) key; items: a uuid key) with rows that exist before capture
starts, runs the tailer into a target, runs a write workload, and while it writes: a full dump
of all tables with several windows in flight, then a repair of 20 keys of accounts (with
`redis_ha`, Redis is a Sentinel group whose primary is killed between the two). At the end
it checks that the target equals the source, row for row. What differs per database (its
server, its tables' types, its writes, its `[source]` section, its target and how the target is
checked) is the database's `DemoBackend`.
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import redis

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.event import Key
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.devservices.redis_sentinel import RedisSentinelGroup
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs.base import Output
from airflow_provider_dblog.sources.base import Source
from airflow_provider_dblog.sources.factory import parse_source_config, source_for
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer, TailerSettings

TABLE_NAMES = ("accounts", "orders", "items")
REGIONS = ("eu", "us", "ap", "sa")
PASSWORD_ENV = "DBLOG_DEMO_PASSWORD"


@dataclass
class DemoSummary:
    rows_seeded: int
    writes: int
    dump_rows: int
    dump_chunks: int
    windows_retried: int
    repaired_keys: int
    events_emitted: int
    seconds: float
    equal: bool
    differences: list[str]


def seed_rows(rows: int, rng: random.Random) -> dict[str, list[tuple[Any, ...]]]:
    """The rows each sample table holds before capture starts, `rows` of each, in the column
    order of the tables' schemas, as Python values (the backend spells them for its driver)."""
    return {
        "accounts": [(i, f"owner-{i}", i * 1.5, i % 3 > 0) for i in range(1, rows + 1)],
        "orders": [
            (REGIONS[i % 4], i // 4 + 1, i / 4, f"note {i}", ["x", str(i)]) for i in range(rows)
        ],
        "items": [
            (uuid.UUID(int=rng.getrandbits(128)), f"item {i}", {"i": i}, bytes([i % 256]) * 4)
            for i in range(rows)
        ],
    }


class RandomWrites(ABC):
    """Random write transactions of 1-4 statements on the demo's three tables, from a
    connection of its own, until stopped. A subclass says how to connect, how to run a
    transaction and a statement, and spells the statements in its SQL (`statements`)."""

    statements: ClassVar[Mapping[str, str]]
    """The SQL of each write, by name: `upsert accounts`, `delete accounts`, `upsert orders`,
    `delete orders`, `insert items`, `update items`, `delete items`, and `random item` (a
    query for the key of a random row of items)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self.writes = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="demo-writes", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self.stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error

    @abstractmethod
    def _connect(self) -> AbstractContextManager[Any]: ...

    @abstractmethod
    def _transaction(self, conn: Any) -> AbstractContextManager[Any]:
        """One transaction on `conn`, committed when the block ends."""

    @abstractmethod
    def _execute(self, conn: Any, statement: str, values: tuple[Any, ...]) -> Any:
        """Run the named statement with `values` (Python values, as `seed_rows` gives them);
        for a query, its first row (None: no row)."""

    def _run(self) -> None:
        try:
            with self._connect() as conn:
                while not self.stop.is_set():
                    statements = self._rng.randint(1, 4)
                    with self._transaction(conn):
                        for _ in range(statements):
                            self._write_one(conn)
                    self.writes += 1
                    self.stop.wait(0.002)
        except BaseException as exc:
            self.error = exc

    def _write_one(self, conn: Any) -> None:
        """One random insert, update or delete on one of the three tables."""
        rng = self._rng
        table = rng.choice(TABLE_NAMES)
        action = rng.choices(("insert", "update", "delete"), (4, 5, 1))[0]
        if table == "accounts":
            key = rng.randint(1, 3000)
            if action == "delete":
                self._execute(conn, "delete accounts", (key,))
            else:
                balance, active = round(rng.uniform(-1e4, 1e4), 2), rng.random() < 0.8
                self._execute(conn, "upsert accounts", (key, f"owner-{key}", balance, active))
        elif table == "orders":
            region, n = rng.choice(REGIONS), rng.randint(1, 800)
            if action == "delete":
                self._execute(conn, "delete orders", (region, n))
            else:
                amount, tags = rng.randint(1, 10**6) / 100, [region, str(n % 7)]
                self._execute(conn, "upsert orders", (region, n, amount, f"note {n}", tags))
        elif action == "insert":
            item = uuid.UUID(int=rng.getrandbits(128))
            attrs = {"size": rng.randint(1, 9), "tags": ["a", "b"]}
            self._execute(conn, "insert items", (item, "item", attrs, rng.randbytes(8)))
        else:
            row = self._execute(conn, "random item", ())
            if row is None:
                return
            if action == "delete":
                self._execute(conn, "delete items", (row[0],))
            else:
                self._execute(conn, "update items", (f"item {rng.random()}", row[0]))


class DemoBackend(ABC):
    """One database's part of the story, on its running server (`started`)."""

    database: ClassVar[str]
    """The database, as the story names it."""
    sample_tables: ClassVar[str]
    """The sample tables and their keys, as the story names them."""
    target: ClassVar[str]
    """The target the story compares with the source, as the summary names it."""
    password: str
    """The demo user's password, which the source reads from `PASSWORD_ENV`."""

    @classmethod
    @abstractmethod
    def started(cls, base: Path, *, replica: bool = False) -> AbstractContextManager[DemoBackend]:
        """The database's server started in a directory under `base`, for the story's
        length; with `replica`, a replica of it too, which the source's chunks are read from
        (`source_section`'s `read_replica`)."""

    @abstractmethod
    def seed(self, rows: int, rng: random.Random) -> int:
        """Create the sample tables (and the target's) with `rows` rows in each; the rows
        seeded."""

    @abstractmethod
    def source_section(self) -> dict[str, Any]:
        """The `[source]` section's keys of this database, `read_replica` with a replica (the
        story adds the name and the password's variable)."""

    @abstractmethod
    def prepare_read_only(self) -> None:
        """What an administrator does before a read-only source can be captured (PostgreSQL:
        the publication, which only the tables' owner can create)."""

    @abstractmethod
    def output(self) -> tuple[Output, str]:
        """The tailer's output into the target, and how the story says the tailer runs."""

    @abstractmethod
    def workload(self, seed: int) -> RandomWrites:
        """Random writes on the source."""

    @abstractmethod
    def keys_to_repair(
        self, rows: int, rng: random.Random, say: Callable[[str], None]
    ) -> list[Key]:
        """20 keys of accounts the repair dumps again (saying why)."""

    @abstractmethod
    def tailer_at_log_end(self, store: StateStore) -> Callable[[], bool]:
        """Whether the tailer has read the source's log up to where it ends now."""

    @abstractmethod
    def differences(
        self, source: Source, keys: list[Key], repaired_rows: int, say: Callable[[str], None]
    ) -> list[str]:
        """How the target differs from the source, once the tailer has stopped; the repair
        of `keys` emitted `repaired_rows` rows."""


def run_demo(
    backend: type[DemoBackend],
    work_dir: Path | None = None,
    *,
    rows: int = 5000,
    chunk_size: int = 500,
    parallelism: int = 2,
    write_seconds: float = 2.0,
    read_only: bool = False,
    replica: bool = False,
    redis_ha: bool = False,
    say: Callable[[str], None] = print,
) -> DemoSummary:
    """The story on `backend`'s database, in `work_dir` (default: a temp dir); with
    `read_only`, a source nothing is written to (its watermarks are log positions); with
    `replica`, the chunks are read from a replica of the source while the tailer follows the
    primary's log; with `redis_ha`, the state store is a Sentinel group whose primary is killed
    after the full dump (the repair and the tailer go on with the promoted replica)."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dblog-demo-") as tmp:
        base = work_dir or Path(tmp)
        store = "a Redis Sentinel group (primary, replica, 3 sentinels)" if redis_ha else "Redis"
        servers = f"{backend.database} (a primary and a replica)" if replica else backend.database
        say(f"starting {servers} and {store} in {base}")
        with (
            backend.started(base, replica=replica) as database,
            _state_store(base, redis_ha) as (client, kill),
        ):
            return _story(
                database,
                client,
                rows,
                chunk_size,
                parallelism,
                write_seconds,
                read_only,
                kill,
                say,
                started,
            )


@contextmanager
def _state_store(
    base: Path, redis_ha: bool
) -> Iterator[tuple[redis.Redis, Callable[[], None] | None]]:
    """A client on the story's Redis, and with `redis_ha` how to fail its primary over."""
    if not redis_ha:
        with RedisServer(base / "redis") as rds:
            yield rds.info.client(), None
        return
    with RedisSentinelGroup(base / "redis-ha") as group:
        yield (
            group.settings().client(password=group.password),
            lambda: group.wait_for_failover(group.kill_primary()),
        )


def _story(
    backend: DemoBackend,
    redis_client: Any,
    rows: int,
    chunk_size: int,
    parallelism: int,
    write_seconds: float,
    read_only: bool,
    fail_redis_over: Callable[[], None] | None,
    say: Callable[[str], None],
    started: float,
) -> DemoSummary:
    rng = random.Random(42)
    seeded = backend.seed(rows, rng)
    say(f"seeded {seeded} rows in {backend.sample_tables}")
    if read_only:
        backend.prepare_read_only()
        say("read-only source: no watermark table, the watermarks are log positions")

    os.environ[PASSWORD_ENV] = backend.password
    section = {**backend.source_section(), "name": "demo", "password_env": PASSWORD_ENV}
    if "read_replica" in section:
        say(f"chunks are read from a replica ({section['read_replica']}), the log from the primary")
    source = source_for(parse_source_config({**section, "read_only": read_only}))
    tables = source.tables
    source.ensure_setup()
    store = StateStore(redis_client, source.name)
    output, tailing = backend.output()
    tailer = Tailer(
        source, store, output, owner="demo-tailer", settings=TailerSettings(window_ttl_s=30)
    )
    stop_tailer = threading.Event()
    tailer_thread = tailer.start(stop_tailer)
    say(f"{tailing}; writes start")

    workload = backend.workload(seed=7)
    workload.start()
    try:
        say(f"full dump of all tables: chunk size {chunk_size}, parallelism {parallelism}")
        full = DumpRequest(
            "full", DumpKind.ALL, tables, chunk_size=chunk_size, parallelism=parallelism
        )
        store.dumps.create(full)
        if (state := run_dump(store, source.chunk_source, "full")) != "done":
            raise RuntimeError(f"demo: the full dump ended {state}")
        if fail_redis_over is not None:
            say("killing the Redis primary (SIGKILL): Sentinel promotes the replica")
            fail_redis_over()
            say(f"the tailer and the repair go on with the new primary, {store.address}")

        keys = backend.keys_to_repair(rows, rng, say)
        repair = DumpRequest("repair", DumpKind.KEYS, (tables[0],), tuple(keys), chunk_size=50)
        store.dumps.create(repair)
        if (state := run_dump(store, source.chunk_source, "repair")) != "done":
            raise RuntimeError(f"demo: the repair ended {state}")
        remaining = max(0.0, write_seconds - (time.monotonic() - started))
        workload.stop.wait(remaining)
    finally:
        workload.join()
    say(f"writes stopped after {workload.writes} transactions; waiting for the tailer")
    wait_until(backend.tailer_at_log_end(store), 60, "the tailer catching up")
    stop_tailer.set()
    tailer_thread.join(30)
    output.close()

    full_status, repair_status = store.dumps.status("full"), store.dumps.status("repair")
    assert full_status is not None and repair_status is not None
    problems = backend.differences(source, keys, repair_status.rows, say)
    return DemoSummary(
        rows_seeded=seeded,
        writes=workload.writes,
        dump_rows=full_status.rows,
        dump_chunks=full_status.chunks,
        windows_retried=full_status.windows_retried + repair_status.windows_retried,
        repaired_keys=len(keys),
        events_emitted=tailer.stats.events + tailer.stats.dump_rows,
        seconds=time.monotonic() - started,
        equal=not problems,
        differences=problems,
    )


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"demo: {what} did not happen within {timeout_s}s")
        time.sleep(0.05)
