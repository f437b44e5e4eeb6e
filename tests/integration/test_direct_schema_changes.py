"""Direct dumps across an ALTER TABLE: the tailer checks a direct read's columns at hw as it
checks a sequenced chunk's rows, and a chunk retried after the ALTER reaches the lake with the
new column.

The first tests drive the production `Session` with a scripted log (a few items, a catalog that
says what the table has now) on a real Redis; the last runs a direct dump into the lake on a real
PostgreSQL, with an ALTER between a chunk's read and its hw.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence

import pytest

from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.event import Event, Op, TableRef
from airflow_provider_dblog.core.log import LogItem, SchemaDescription, WatermarkWrite
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import Window
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs.base import Output
from airflow_provider_dblog.state import StateStore, WindowState
from airflow_provider_dblog.tailer.session import Leadership, Session, TailerStats
from airflow_provider_dblog.tailer.settings import TailerSettings

pytestmark = pytest.mark.integration

ORDERS = TableRef("public", "orders")
DESCRIBED = Position(10, 0)
LW, HW = Position(20, 0), Position(30, 0)


def schema(*names: str) -> TableSchema:
    return TableSchema(tuple(Column(n, "integer", n != "id", None) for n in names), ("id",))


class ListOutput(Output):
    def __init__(self) -> None:
        self.events: list[Event] = []

    def write(self, events: Sequence[Event], token: int) -> None:
        self.events.extend(events)

    def close(self) -> None:
        pass


class ScriptedReader:
    """A `LogReader` of a few items; `describe` answers with the catalog's schema now."""

    def __init__(self, items: list[LogItem], catalog: TableSchema) -> None:
        self._items, self._catalog = items, catalog
        self.described: list[TableRef] = []

    def items(self) -> Iterator[LogItem]:
        yield from self._items

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


def direct_hw(
    store: StateStore, parts: list[tuple[str, ...]], catalog: TableSchema
) -> tuple[Window, ListOutput, ScriptedReader]:
    """A session that knows `orders` as (id, note) meets lw and hw of a direct window whose
    reads stored `parts` (one column list a part) and no row."""
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
    output = ListOutput()
    Session(
        source_name="test",
        db="db",
        reader=reader,
        store=store,
        output=output,
        leadership=Leadership("test", token),
        settings=TailerSettings(),
        stats=TailerStats(),
    ).run(threading.Event())
    return window, output, reader


def test_a_direct_read_the_catalog_agrees_with_is_recorded_after_its_schema_event(
    store: StateStore,
) -> None:
    """The read had a column the log has not shown yet (no write since the ALTER): the catalog
    agrees with it, so the schema is emitted at hw, before the dump's rows (positioned after
    hw), and the window is recorded."""
    read_with = ("id", "note", "flag")
    window, output, reader = direct_hw(store, [read_with], schema(*read_with))
    status = store.windows.state(window.window_id)
    assert status is not None and status.state is WindowState.CLOSED, status
    record = store.directs.record_of(window.window_id)
    assert record is not None and record.hw_position == HW
    schemas = [e for e in output.events if e.op is Op.SCHEMA]
    assert [(e.position, e.schema_version) for e in schemas] == [(DESCRIBED, 1), (HW, 2)]
    assert schemas[-1].table_schema == schema("id", "note", "flag")
    assert record.rows_position > schemas[-1].position
    assert reader.described == [ORDERS]


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
    window, output, _ = direct_hw(store, parts, catalog)
    status = store.windows.state(window.window_id)
    assert status is not None
    if why is None:
        assert status.state is WindowState.CLOSED, status
        assert store.directs.record_of(window.window_id) is not None
        return
    assert status.state is WindowState.FAILED, status
    assert status.reason.startswith("schema_changed") and why in status.reason, status.reason
    assert store.directs.record_of(window.window_id) is None
    assert [e.position for e in output.events if e.op is Op.SCHEMA] == [DESCRIBED]
