"""Direct dumps across an ALTER TABLE: the tailer checks a direct read's columns at hw as it
checks a sequenced chunk's rows, and a chunk retried after the ALTER reaches the lake with the
new column.

The first tests drive the production `Session` with a scripted log (a few items, a catalog that
says what the table has now) on a real Redis; the others run on a real PostgreSQL: a direct dump
into the lake with an ALTER between a chunk's read and its hw, a lake table created from the
catalog after an ALTER the compaction folds later, and rows SQL apply receives after an ALTER.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from airflow_provider_dblog.compaction.run import CompactOptions, compact
from airflow_provider_dblog.core.direct import DirectRecord, DumpMode
from airflow_provider_dblog.core.dump_plan import Chunk, DumpKind, DumpRequest
from airflow_provider_dblog.core.event import Event, Op, TableRef
from airflow_provider_dblog.core.log import LogItem, SchemaDescription, WatermarkWrite
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import Window
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.direct import InProcessDirectReader, StagedChunk
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.lake.catalog import source_lake_schema
from airflow_provider_dblog.lake.direct import LakeDirectTarget
from airflow_provider_dblog.lake.schema import POSITION_COLUMNS, LakeRow
from airflow_provider_dblog.lake.table import LakeTable
from airflow_provider_dblog.outputs import NdjsonOutput, read_events
from airflow_provider_dblog.outputs.base import Output
from airflow_provider_dblog.outputs.sql_apply import SqlApplyOutput, SqlDirectTarget
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.state import DumpState, StateStore, WindowState
from airflow_provider_dblog.tailer.metrics import TailerStats
from airflow_provider_dblog.tailer.session import Leadership, Session
from airflow_provider_dblog.tailer.settings import TailerSettings
from tests.integration.compaction.test_spark_compact import by_key, read_lake
from tests.integration.e2e_support import (
    Databases,
    drop_databases,
    make_databases,
    wait_caught_up,
)
from tests.integration.test_end_to_end import InProcessTailer

pytestmark = pytest.mark.integration

ORDERS = TableRef("public", "orders")
DESCRIBED = Position(10, 0)
LW, HW = Position(20, 0), Position(30, 0)
WAIT_S = 30.0


def schema(*names: str) -> TableSchema:
    return TableSchema(tuple(Column(n, "integer", n != "id", None) for n in names), ("id",))


class HeldOutput(Output):
    """Takes the events once `released`: until then a write waits, as an output slow to make
    its batch durable."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.writing = threading.Event()
        self.released = threading.Event()

    def write(self, events: Sequence[Event], token: int) -> None:
        self.writing.set()
        assert self.released.wait(WAIT_S), "the test never released the output"
        self.events.extend(events)

    def close(self) -> None:
        pass


class ScriptedReader:
    """A `LogReader` of a few items, then `read_all`; `describe` answers with the catalog's
    schema now."""

    def __init__(self, items: list[LogItem], catalog: TableSchema) -> None:
        self._items, self._catalog = items, catalog
        self.described: list[TableRef] = []
        self.read_all = threading.Event()

    def items(self) -> Iterator[LogItem]:
        yield from self._items
        self.read_all.set()  # the session asked for more: it handled every item

    def acknowledge(self, commit: int) -> str | None:
        return None

    def describe(self, table: TableRef) -> TableSchema:
        self.described.append(table)
        return self._catalog

    def close(self) -> None:
        pass


@pytest.fixture
def store(redis_server: RedisInfo) -> Iterator[StateStore]:
    with redis_server.client() as client:
        yield StateStore(client, f"test-{uuid.uuid4().hex[:12]}")


@dataclass(frozen=True)
class Hw:
    window: Window
    events: list[Event]
    described: list[TableRef]
    """The tables whose catalog the session asked about."""
    held: DirectRecord | None
    """The window's record while the output held the batches handed over up to hw."""


def direct_hw(store: StateStore, parts: list[tuple[str, ...]], catalog: TableSchema) -> Hw:
    """A session that knows `orders` as (id, note) meets lw and hw of a direct window whose
    reads stored `parts` (one column list a part) and no row; its output holds every write
    until the session has handled hw."""
    window = Window(uuid.uuid4().hex, "dump", ORDERS, DumpMode.DIRECT)
    store.windows.register(window, "lw-" + window.window_id, "hw-" + window.window_id, {}, 60)
    for part, columns in enumerate(parts):
        store.windows.append_rows(window.window_id, part, [], ("id",), frozenset(), columns)
    token = store.tailer.acquire_lease("test", 60_000)
    assert token is not None
    reader = ScriptedReader(
        [
            SchemaDescription(ORDERS, schema("id", "note"), DESCRIBED),
            WatermarkWrite("lw-" + window.window_id, LW),
            WatermarkWrite("hw-" + window.window_id, HW),
        ],
        catalog,
    )
    output = HeldOutput()
    session = Session(
        source_name="test",
        db="db",
        reader=reader,
        store=store,
        output=output,
        leadership=Leadership("test", token),
        settings=TailerSettings(),
        stats=TailerStats(),
    )
    failures: list[BaseException] = []

    def run() -> None:
        try:
            session.run(threading.Event())
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert reader.read_all.wait(WAIT_S) and output.writing.wait(WAIT_S)
    held = store.directs.record_of(window.window_id)
    output.released.set()
    thread.join(WAIT_S)
    assert not thread.is_alive() and not failures, failures
    return Hw(window, output.events, reader.described, held)


def test_a_direct_read_the_catalog_agrees_with_is_recorded_after_its_schema_event(
    store: StateStore,
) -> None:
    """The read had a column the log has not shown yet (no write since the ALTER): the catalog
    agrees with it, so the schema is emitted at hw, before the dump's rows (positioned after
    hw), and the window is recorded once the schema event is durable (the output, or the lake
    that takes the dump's rows, has the column before they come)."""
    read_with = ("id", "note", "flag")
    hw = direct_hw(store, [read_with], schema(*read_with))
    status = store.windows.state(hw.window.window_id)
    assert status is not None and status.state is WindowState.CLOSED, status
    record = store.directs.record_of(hw.window.window_id)
    assert record is not None and record.hw_position == HW
    assert hw.held is None, "recorded only once the schema event at hw was durable"
    schemas = [e for e in hw.events if e.op is Op.SCHEMA]
    assert [(e.position, e.schema_version) for e in schemas] == [(DESCRIBED, 1), (HW, 2)]
    assert schemas[-1].table_schema == schema(*read_with)
    assert record.rows_position > schemas[-1].position
    assert hw.described == [ORDERS]


@pytest.mark.parametrize(
    ("parts", "catalog", "why"),
    [
        ([("id", "note", "flag")], schema("id", "note"), "read with columns"),
        ([("id", "note")], schema("id", "note", "flag"), None),
        ([("id", "note"), ("id", "note", "flag")], schema("id", "note", "flag"), "different"),
    ],
    ids=["dropped-before-hw", "added-after-read", "parts-across-an-alter"],
)
def test_a_direct_read_with_other_columns_than_the_table_at_hw_fails(
    store: StateStore, parts: list[tuple[str, ...]], catalog: TableSchema, why: str | None
) -> None:
    """A read whose columns the table no longer has at hw, or parts read on both sides of an
    ALTER, fail the window (the dump retries the chunk) and nothing is recorded. A read with the
    columns the log last showed passes: an ALTER after it that the log has not shown yet comes
    out at the table's next change, after hw, as it does for a sequenced chunk."""
    hw = direct_hw(store, parts, catalog)
    status = store.windows.state(hw.window.window_id)
    assert status is not None
    if why is None:
        assert status.state is WindowState.CLOSED, status
        assert store.directs.record_of(hw.window.window_id) is not None
        return
    assert status.state is WindowState.FAILED, status
    assert status.reason.startswith("schema_changed") and why in status.reason, status.reason
    assert store.directs.record_of(hw.window.window_id) is None
    assert [e.position for e in hw.events if e.op is Op.SCHEMA] == [DESCRIBED]


ACCOUNTS = TableRef("public", "accounts")
ROWS = 40


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, ROWS, target=False, seed_value=31)
    yield databases
    drop_databases(databases)


class AlterAtRead:
    """The in-process direct reader, but at the `at`-th read (counting retries) `statements`
    run in the source once, in one transaction: `before` the read (after its lw) or after it
    (before its hw)."""

    def __init__(
        self, target: LakeDirectTarget, dsn: str, at: int, when: str, statements: Sequence[str]
    ) -> None:
        self._inner = InProcessDirectReader(target)
        self._dsn, self._at, self._when, self._statements = dsn, at, when, statements
        self.windows: list[str] = []

    def read(
        self,
        store: StateStore,
        source: ChunkSource,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> StagedChunk | None:
        self.windows.append(window_id)
        now = len(self.windows) == self._at
        if now and self._when == "before":
            self._alter()
        staged = self._inner.read(store, source, window_id, chunk, key_columns)
        if now and self._when == "after":
            self._alter()
        return staged

    def _alter(self) -> None:
        with psycopg.connect(self._dsn) as conn:  # one transaction, committed on exit
            for statement in self._statements:
                conn.execute(statement)

    def prune_tombstones(self, table: TableRef, before: Position) -> int:
        return self._inner.prune_tombstones(table, before)


ADD_FLAG = "ALTER TABLE accounts ADD COLUMN flag int DEFAULT 7"


@pytest.mark.parametrize(
    ("when", "statements"),
    [
        ("after", [ADD_FLAG, f"UPDATE accounts SET flag = 9 WHERE id = {ROWS}"]),
        ("before", [ADD_FLAG]),
    ],
    ids=["alter-and-write-before-hw", "alter-the-log-has-not-shown"],
)
def test_a_direct_chunk_read_across_an_add_column_reaches_the_lake_with_it(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path, when: str, statements: list[str]
) -> None:
    """A direct dump of `accounts` in two chunks into the lake; the first is committed before
    the ALTER ADD COLUMN flag DEFAULT 7, which comes with the second chunk's read:
    - after the read, with a write the log shows before hw: the window fails (schema changed)
      and the retry, read with `flag`, commits it;
    - after lw, before the read, with no write: the log has not shown it at hw, the catalog
      agrees with the read, so its schema event is emitted at hw and the chunk is committed.
    Either way the lake table gains `flag` with the chunk's values at once, and once the
    compaction folded the log (the schema event among it), every row holds the source's
    value, the first chunk's rows the default (as DuckDB reads the table)."""
    store = StateStore(redis_server.client(), dbs.config.name)
    events, lake = tmp_path / "events", tmp_path / "lake"
    describe = lambda t: source_lake_schema(dbs.config, t)  # noqa: E731
    reader = AlterAtRead(LakeDirectTarget(lake, describe), dbs.source_dsn, 2, when, statements)
    tailer = InProcessTailer(dbs, store, NdjsonOutput(events))
    try:
        with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE accounts SET owner = owner WHERE id = (SELECT min(id) FROM accounts)"
            )
        wait_caught_up(dbs)  # the log has described accounts: the tailer knows its columns
        request = DumpRequest(
            "alter", DumpKind.TABLE, (ACCOUNTS,), chunk_size=ROWS // 2, mode=DumpMode.DIRECT
        )
        store.dumps.create(request)
        done = run_dump(store, dbs.source.chunk_source, "alter", direct=reader, window_timeout_s=10)
        assert done is DumpState.DONE
        wait_caught_up(dbs)
    finally:
        tailer.stop()

    states = [store.windows.state(w) for w in reader.windows]
    reasons = [(s.state, s.reason.split(":")[0]) for s in states if s is not None]
    closed = (WindowState.CLOSED, "")
    if when == "after":
        assert reasons[:3] == [closed, (WindowState.FAILED, "schema_changed"), closed], reasons
    else:
        assert reasons[:2] == [closed, closed], reasons
        record = store.directs.record_of(reader.windows[1])
        assert record is not None
        schemas = [e for e in read_events(events) if e.op is Op.SCHEMA and e.table == ACCOUNTS]
        assert schemas[-1].position == record.hw_position, "the catalog's schema, at hw"
    with psycopg.connect(dbs.source_dsn) as conn:
        source = dict(conn.execute("SELECT id, flag FROM accounts").fetchall())
    assert len(source) == ROWS and set(source.values()) <= {7, 9}

    dumped = LakeTable.open(lake, ACCOUNTS).rows().to_pylist()
    assert "flag" in dumped[0], "the commit added the column the read had"
    flags = {r["id"]: r["flag"] for r in dumped}
    second = sorted(flags)[ROWS // 2 :]
    assert [flags[i] for i in second] == [source[i] for i in second], "the second chunk's values"

    compact(None, events, lake, CompactOptions(describe=describe))
    folded = read_lake(lake, str(ACCOUNTS)).to_pylist()
    assert {r["id"]: r["flag"] for r in folded} == source


@pytest.mark.parametrize("created_by", ["a-direct-dump", "the-compaction"])
def test_a_lake_table_created_after_an_add_column_holds_its_default_in_older_rows(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path, created_by: str
) -> None:
    """The lake has no table of `accounts` yet: the log shows a write of the first row, then
    ALTER ADD COLUMN flag DEFAULT 7 with a write of the last row (one transaction). The table
    is then created from the catalog, with `flag`, before the compaction folds the ALTER: by a
    direct dump of one key, or by the compaction itself. The first row, folded from a log event
    before the ALTER, holds the default in the source, and in the lake too (as DuckDB reads
    it): the compaction takes `flag` for added by the ALTER's schema event, not before."""
    store = StateStore(redis_server.client(), dbs.config.name)
    events, lake = tmp_path / "events", tmp_path / "lake"
    describe = lambda t: source_lake_schema(dbs.config, t)  # noqa: E731
    with psycopg.connect(dbs.source_dsn) as conn:
        ids = [i for (i,) in conn.execute("SELECT id FROM accounts ORDER BY id")]
    captured = [ids[0], ids[-1]]
    tailer = InProcessTailer(dbs, store, NdjsonOutput(events))
    try:
        with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
            conn.execute("UPDATE accounts SET owner = owner WHERE id = %s", (ids[0],))
        with psycopg.connect(dbs.source_dsn) as conn:  # one transaction, committed on exit
            conn.execute(ADD_FLAG)
            conn.execute("UPDATE accounts SET flag = 9 WHERE id = %s", (ids[-1],))
        if created_by == "a-direct-dump":
            captured.append(ids[1])
            keys = ((ids[1],),)
            request = DumpRequest("one", DumpKind.KEYS, (ACCOUNTS,), keys, mode=DumpMode.DIRECT)
            store.dumps.create(request)
            reader = InProcessDirectReader(LakeDirectTarget(lake, describe))
            done = run_dump(store, dbs.source.chunk_source, "one", direct=reader)
            assert done is DumpState.DONE
            assert "flag" in LakeTable.open(lake, ACCOUNTS).arrow_schema.names
        wait_caught_up(dbs)
    finally:
        tailer.stop()

    compact(None, events, lake, CompactOptions(describe=describe))
    schema = describe(ACCOUNTS)
    source = dbs.source.chunk_source()
    try:
        rows = [r for r in source.read_chunk(Chunk(ACCOUNTS, 0)).rows if r["id"] in captured]
    finally:
        source.close()
    flags = {r["id"]: r["flag"] for r in rows}
    assert flags == {ids[0]: 7, ids[-1]: 9} | {i: 7 for i in captured[2:]}
    wanted = schema.to_arrow([LakeRow(r, 1, 0, "r") for r in rows])
    read = read_lake(lake, str(ACCOUNTS))
    assert read.num_rows == len(captured)
    assert by_key(read.drop_columns(list(POSITION_COLUMNS)), schema.key) == by_key(
        wanted.drop_columns(list(POSITION_COLUMNS)), schema.key
    )


@pytest.fixture
def with_target(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, ROWS, target=True, seed_value=32)
    yield databases
    drop_databases(databases)


def test_rows_read_with_a_column_sql_apply_adds_reach_it_after_the_column(
    with_target: Databases, redis_server: RedisInfo
) -> None:
    """After an ALTER with a volatile default and no write (the consumer rules say: dump the table),
    a direct dump into SQL apply: the first chunk's read shows the column, the tailer emits the
    catalog's schema at hw and records the window only once SQL apply added the column (with
    random values of its own; the order itself is shown by the scripted session above), so
    the dump's rows bring the source's values over them."""
    dbs = with_target
    store = StateStore(redis_server.client(), dbs.config.name)
    target = SqlDirectTarget(dbs.target_dsn, dbs.config.name)
    tailer = InProcessTailer(dbs, store, SqlApplyOutput(dbs.target_dsn, monotonic=True))
    try:
        with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
            conn.execute("UPDATE accounts SET owner = owner WHERE id = 1")
            wait_caught_up(dbs)  # the tailer knows accounts' columns, and so does the target
            conn.execute("ALTER TABLE accounts ADD COLUMN flag int DEFAULT (random() * 1e6)::int")
        request = DumpRequest(
            "sql", DumpKind.TABLE, (ACCOUNTS,), chunk_size=ROWS // 2, mode=DumpMode.DIRECT
        )
        store.dumps.create(request)
        reader = InProcessDirectReader(target)
        done = run_dump(store, dbs.source.chunk_source, "sql", direct=reader, window_timeout_s=10)
        assert done is DumpState.DONE
        wait_caught_up(dbs)
    finally:
        tailer.stop()
        target.close()
    flags = []
    for dsn in (dbs.source_dsn, dbs.target_dsn):
        with psycopg.connect(dsn) as conn:
            flags.append(dict(conn.execute("SELECT id, flag FROM accounts").fetchall()))
    assert len(flags[0]) == ROWS and flags[1] == flags[0]
