"""The meaning of pgoutput messages (`changes.ChangeMapper`), on bytes built as a server sends
them: positions, row changes, TOAST, key changes, watermarks, schema descriptions, truncates and
refusals."""

from __future__ import annotations

import pytest

from airflow_provider_dblog.core.event import Event, Op, Origin, TableRef
from airflow_provider_dblog.core.log import (
    Change,
    LogItem,
    SchemaDescription,
    TransactionEnd,
    Truncate,
    WatermarkWrite,
)
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.sources.base import SourceError
from airflow_provider_dblog.sources.postgres.changes import ChangeMapper
from airflow_provider_dblog.sources.postgres.converters import convert
from airflow_provider_dblog.sources.postgres.pgoutput import PG_EPOCH_MICROS, Relation, decode
from tests.unit.pgoutput_bytes import (
    PG_TS,
    TOAST,
    begin,
    commit,
    delete,
    insert,
    origin,
    relation,
    truncate,
    type_message,
    update,
)

pytestmark = pytest.mark.unit

INT8, TEXT = 20, 25
ORDERS, AUDIT, WATERMARK = 16385, 16390, 16400
ORDERS_TABLE = TableRef("app", "orders")
WATERMARK_TABLE = TableRef("dblog", "watermark")

ORDERS_COLUMNS = [("id", INT8, True), ("note", TEXT, False), ("doc", TEXT, False)]
ORDERS_RELATION = relation(ORDERS, "app", "orders", ORDERS_COLUMNS)
ORDERS_FULL = relation(ORDERS, "app", "orders", [(n, t, True) for n, t, _ in ORDERS_COLUMNS], "f")
AUDIT_RELATION = relation(AUDIT, "app", "audit", [("id", INT8, True)])
WATERMARK_RELATION = relation(
    WATERMARK, "dblog", "watermark", [("id", INT8, True), ("value", TEXT, False)]
)


def orders_key(order_id: str) -> list[str | None]:
    """An old key-only tuple ('K') of orders: pgoutput sends every column, nulls but the key."""
    return [order_id, None, None]


TYPE_NAMES = {INT8: "bigint", TEXT: "text"}


class Catalog:
    """The primary keys and defaults the mapper may ask for, and the relations it asked about."""

    def __init__(
        self, keys: dict[int, tuple[str, ...]], defaults: dict[str, str] | None = None
    ) -> None:
        self.keys = keys
        self.defaults = defaults or {}
        self.asked: list[int] = []

    def describe(self, relation: Relation) -> TableSchema:
        self.asked.append(relation.relation_id)
        key = self.keys.get(relation.relation_id, ())
        columns = tuple(
            Column(c.name, TYPE_NAMES[c.type_oid], c.name not in key, self.defaults.get(c.name))
            for c in relation.columns
        )
        return TableSchema(columns, key)


def new_mapper(catalog: Catalog | None = None) -> ChangeMapper:
    catalog = catalog or Catalog({ORDERS: ("id",)})
    return ChangeMapper(
        source="pg-main",
        db="shop",
        captured=[ORDERS_TABLE],
        watermark=WATERMARK_TABLE,
        describe=catalog.describe,
    )


def feed(mapper: ChangeMapper, *messages: bytes) -> list[LogItem]:
    return [item for message in messages for item in mapper.map(decode(message))]


def events(items: list[LogItem]) -> list[Event]:
    return [item.event for item in items if isinstance(item, Change)]


def changes(*messages: bytes) -> list[Event]:
    """The events of `messages` in one transaction of orders."""
    return events(
        feed(
            new_mapper(),
            begin(0x500, 9),
            ORDERS_RELATION,
            *messages,
            commit(0x500, 0x530),
        )
    )


def test_positions_count_inside_each_transaction_and_commits_end_them() -> None:
    items = feed(
        new_mapper(),
        begin(0x1_0000_0100, 741),
        ORDERS_RELATION,
        insert(ORDERS, ["1", "a", "x"]),
        type_message(99999, "app", "mood"),
        origin(0x1_0000_0100, "upstream"),
        insert(ORDERS, ["2", "b", "y"]),
        delete(ORDERS, orders_key("1")),
        commit(0x1_0000_0100, 0x1_0000_0140),
        begin(0x1_0000_0200, 742),
        insert(ORDERS, ["3", "c", "z"]),
        commit(0x1_0000_0200, 0x1_0000_0240),
    )
    shape = [
        item.event.position
        if isinstance(item, Change)
        else (item.position if isinstance(item, SchemaDescription) else item)
        for item in items
    ]
    assert shape == [
        Position(0x1_0000_0100, 0),
        Position(0x1_0000_0100, 1),
        Position(0x1_0000_0100, 3),
        Position(0x1_0000_0100, 5),
        TransactionEnd(0x1_0000_0100),
        Position(0x1_0000_0200, 1),
        TransactionEnd(0x1_0000_0200),
    ]
    source = events(items)[0].source
    assert (source.name, source.db, source.schema, source.table) == (
        "pg-main",
        "shop",
        "app",
        "orders",
    )
    assert source.origin is Origin.LOG
    assert (source.txid, source.ts_ms) == (741, (PG_TS + PG_EPOCH_MICROS) // 1000)
    assert events(items)[-1].source.txid == 742


def test_insert_update_and_delete_carry_key_before_and_after() -> None:
    created, updated, deleted = changes(
        insert(ORDERS, ["1", "a", None]),
        update(ORDERS, ["1", "b", "x"]),
        delete(ORDERS, orders_key("1")),
    )
    assert (created.op, created.key, created.before, created.after) == (
        Op.CREATE,
        {"id": 1},
        None,
        {"id": 1, "note": "a", "doc": None},
    )
    assert (updated.op, updated.key, updated.before, updated.after) == (
        Op.UPDATE,
        {"id": 1},
        None,
        {"id": 1, "note": "b", "doc": "x"},
    )
    assert (deleted.op, deleted.key, deleted.before, deleted.after) == (
        Op.DELETE,
        {"id": 1},
        {"id": 1},
        None,
    )


def test_full_identity_gives_the_whole_old_row() -> None:
    mapper = new_mapper()
    items = feed(
        mapper,
        begin(0x500, 9),
        ORDERS_FULL,
        update(ORDERS, ["1", "b", "x"], old=["1", "a", "x"], old_is_key_only=False),
        delete(ORDERS, ["1", "b", "x"], old_is_key_only=False),
        commit(0x500, 0x530),
    )
    updated, deleted = events(items)
    assert updated.before == {"id": 1, "note": "a", "doc": "x"}
    assert deleted.before == {"id": 1, "note": "b", "doc": "x"}
    assert deleted.key == {"id": 1}


def test_unchanged_toast_comes_from_a_full_old_row() -> None:
    mapper = new_mapper()
    items = feed(
        mapper,
        begin(0x500, 9),
        ORDERS_FULL,
        update(ORDERS, ["1", "b", TOAST], old=["1", "a", "big"], old_is_key_only=False),
        commit(0x500, 0x530),
    )
    (updated,) = events(items)
    assert updated.after == {"id": 1, "note": "b", "doc": "big"}


@pytest.mark.parametrize("old", [None, orders_key("1")], ids=["no old tuple", "old key only"])
def test_unchanged_toast_is_left_out_without_an_old_row(old: list[str | None] | None) -> None:
    (updated,) = changes(update(ORDERS, ["1", "b", TOAST], old=old))
    assert updated.op is Op.UPDATE
    assert updated.after == {"id": 1, "note": "b"}
    assert "doc" not in updated.after


def test_a_key_changing_update_is_a_delete_then_a_create() -> None:
    removed, created = changes(update(ORDERS, ["2", "b", "x"], old=orders_key("1")))
    assert (removed.op, removed.key, removed.before, removed.after) == (
        Op.DELETE,
        {"id": 1},
        {"id": 1},
        None,
    )
    assert (created.op, created.key, created.before, created.after) == (
        Op.CREATE,
        {"id": 2},
        None,
        {"id": 2, "note": "b", "doc": "x"},
    )
    assert [removed.position.seq, created.position.seq] == [1, 3]


def test_the_watermark_tables_update_is_a_watermark_write() -> None:
    items = feed(
        new_mapper(),
        begin(0x700, 11),
        WATERMARK_RELATION,
        ORDERS_RELATION,
        insert(WATERMARK, ["2", "ignored: only updates are watermarks"]),
        update(WATERMARK, ["1", "lw:d1:w1"]),
        insert(ORDERS, ["1", "a", "x"]),
        commit(0x700, 0x740),
    )
    assert isinstance(items[0], SchemaDescription)
    assert items[1] == WatermarkWrite("lw:d1:w1", Position(0x700, 1))
    assert [e.position for e in events(items)] == [Position(0x700, 3)]
    assert items[-1] == TransactionEnd(0x700)
    assert len(items) == 4


def test_an_uncaptured_table_is_ignored() -> None:
    catalog = Catalog({ORDERS: ("id",)})
    mapper = new_mapper(catalog)
    items = feed(
        mapper,
        begin(0x800, 12),
        AUDIT_RELATION,
        insert(AUDIT, ["5"]),
        update(AUDIT, ["6"], old=["5"]),
        delete(AUDIT, ["6"]),
        ORDERS_RELATION,
        insert(ORDERS, ["1", "a", "x"]),
        commit(0x800, 0x840),
    )
    assert [e.position for e in events(items)] == [Position(0x800, 1)]
    assert [e.table for e in events(items)] == [ORDERS_TABLE]
    assert [i.table for i in items if isinstance(i, SchemaDescription)] == [ORDERS_TABLE]
    assert catalog.asked == [ORDERS]


def test_every_relation_of_a_captured_table_is_described_just_before_its_change() -> None:
    """Descriptions take the even seq before the change they precede, so where pgoutput puts
    its Relation messages (it depends on where the stream started) moves no change; each
    repeats the catalog's nullability and defaults, and events leave versions to the tailer."""
    catalog = Catalog({ORDERS: ("id",)}, defaults={"size": "7"})
    mapper = new_mapper(catalog)
    widened = relation(ORDERS, "app", "orders", [*ORDERS_COLUMNS, ("size", INT8, False)])
    items = feed(
        mapper,
        begin(0x900, 13),
        ORDERS_RELATION,
        insert(ORDERS, ["1", "a", "x"]),
        ORDERS_RELATION,
        insert(ORDERS, ["2", "b", "y"]),
        widened,
        insert(ORDERS, ["3", "c", "z", "7"]),
        commit(0x900, 0x940),
    )
    described = [i for i in items if isinstance(i, SchemaDescription)]
    assert [d.position for d in described] == [Position(0x900, n) for n in (0, 2, 4)]
    assert [e.position.seq for e in events(items)] == [1, 3, 5]
    assert described[0].schema == described[1].schema
    assert described[2].schema == TableSchema(
        (
            Column("id", "bigint", False, None),
            Column("note", "text", True, None),
            Column("doc", "text", True, None),
            Column("size", "bigint", True, "7"),
        ),
        ("id",),
    )
    assert (described[2].table, described[2].txid) == (ORDERS_TABLE, 13)
    assert [e.schema_version for e in events(items)] == [0, 0, 0]
    assert events(items)[-1].after == {"id": 3, "note": "c", "doc": "z", "size": 7}
    assert catalog.asked == [ORDERS, ORDERS, ORDERS]


def test_a_dropped_transaction_is_forgotten_and_positions_come_again() -> None:
    """What a reconnecting reader relies on: the new stream resends the relation and the whole
    transaction, whose changes take the same positions again."""
    mapper = new_mapper()
    widened = relation(ORDERS, "app", "orders", [*ORDERS_COLUMNS, ("size", INT8, False)])
    first = feed(
        mapper, begin(0x900, 13), ORDERS_RELATION, widened, insert(ORDERS, ["1", "a", "x", "1"])
    )
    assert mapper.open_commit == 0x900
    mapper.drop_transaction()
    assert mapper.open_commit is None
    items = feed(
        mapper,
        begin(0x900, 13),
        widened,
        insert(ORDERS, ["1", "a", "x", "1"]),
        commit(0x900, 0x940),
    )
    assert [e.position for e in events(items)] == [e.position for e in events(first)]
    assert [e.position for e in events(items)] == [Position(0x900, 1)]


def test_a_truncate_is_one_item_per_captured_table_each_at_its_position() -> None:
    items = feed(
        new_mapper(),
        begin(0x500, 9),
        ORDERS_RELATION,
        AUDIT_RELATION,
        insert(ORDERS, ["1", "a", "x"]),
        truncate(AUDIT, ORDERS),
        commit(0x500, 0x530),
    )
    truncates = [i for i in items if isinstance(i, Truncate)]
    assert truncates == [
        Truncate(ORDERS_TABLE, Position(0x500, 3), 9, (PG_TS + PG_EPOCH_MICROS) // 1000)
    ]
    assert items[-1] == TransactionEnd(0x500)


def test_a_truncate_of_an_unknown_relation_is_refused() -> None:
    with pytest.raises(SourceError, match="truncate of relation 16385"):
        feed(new_mapper(), begin(0x500, 9), truncate(ORDERS))


def test_open_commit_follows_begin_and_commit() -> None:
    mapper = new_mapper()
    assert mapper.open_commit is None
    feed(mapper, begin(0xA00, 14))
    assert mapper.open_commit == 0xA00
    feed(mapper, commit(0xA00, 0xA40))
    assert mapper.open_commit is None


def test_a_change_of_an_unknown_relation_is_refused() -> None:
    with pytest.raises(SourceError, match="relation 16385"):
        feed(new_mapper(), begin(0x500, 9), insert(ORDERS, ["1", "a", "x"]))


@pytest.mark.parametrize(
    "before",
    [[], [begin(0x500, 9), commit(0x500, 0x530)]],
    ids=["before any transaction", "after a commit"],
)
def test_a_change_outside_a_transaction_is_refused(before: list[bytes]) -> None:
    mapper = new_mapper()
    feed(mapper, begin(0x400, 8), ORDERS_RELATION, commit(0x400, 0x430), *before)
    with pytest.raises(SourceError, match="outside a transaction"):
        feed(mapper, insert(ORDERS, ["1", "a", "x"]))


def test_a_captured_table_without_a_primary_key_is_refused() -> None:
    mapper = new_mapper(Catalog({}))
    with pytest.raises(SourceError, match=r"app\.orders has no primary key"):
        feed(mapper, begin(0x500, 9), ORDERS_RELATION)


def test_a_tuple_that_does_not_fit_its_relation_is_refused() -> None:
    with pytest.raises(SourceError, match="tuple of 2 values for 3 columns"):
        changes(insert(ORDERS, ["1", "a"]))


def test_row_events_carry_the_schema_version_current_when_each_is_built() -> None:
    """The tailer's versions are read as each event is built, after the session took every
    item before it: a schema event emitted for a description counts for the change after it."""
    versions: dict[TableRef, int] = {}
    mapper = ChangeMapper(
        source="pg-main",
        db="shop",
        captured=[ORDERS_TABLE],
        watermark=WATERMARK_TABLE,
        describe=Catalog({ORDERS: ("id",)}).describe,
        schema_versions=versions,
    )
    stamped = []
    for message in (
        begin(0x500, 9),
        ORDERS_RELATION,
        insert(ORDERS, ["1", "a", "x"]),
        insert(ORDERS, ["2", "b", "y"]),
    ):
        for item in mapper.map(decode(message)):
            if isinstance(item, SchemaDescription):
                versions[item.table] = 3  # the session emitted the schema as version 3
            elif isinstance(item, Change):
                stamped.append(item.event.schema_version)
                versions[ORDERS_TABLE] = 4
    assert stamped == [3, 4]


def test_each_column_converts_as_convert_does() -> None:
    """The converters chosen once per relation give what `convert` gives value by value."""
    columns = [
        ("id", 20, "7"),
        ("small", 21, "-3"),
        ("flag", 16, "t"),
        ("ratio", 701, "NaN"),
        ("amount", 1700, "12.50"),
        ("doc", 3802, '{"b": [1, null]}'),
        ("tags", 1009, '{a,"b c",NULL}'),
        ("blob", 17, "\\x00ff"),
        ("at", 1184, "2024-01-02 03:04:05+00"),
        ("mood", 99999, "happy"),
        ("nothing", 25, None),
    ]
    described = [(name, oid, name == "id") for name, oid, _ in columns]
    relation_message = relation(ORDERS, "app", "orders", described)
    catalog = Catalog({ORDERS: ("id",)})
    catalog_types = dict(TYPE_NAMES)
    for _, oid, _ in columns:
        catalog_types.setdefault(oid, f"type {oid}")
    mapper = ChangeMapper(
        source="pg-main",
        db="shop",
        captured=[ORDERS_TABLE],
        watermark=WATERMARK_TABLE,
        describe=lambda rel: TableSchema(
            tuple(Column(c.name, catalog_types[c.type_oid], True, None) for c in rel.columns),
            catalog.keys[rel.relation_id],
        ),
    )
    items = feed(
        mapper,
        begin(0x500, 9),
        relation_message,
        insert(ORDERS, [text for _, _, text in columns]),
        commit(0x500, 0x530),
    )
    (created,) = events(items)
    assert created.after == {name: convert(oid, text) for name, oid, text in columns}
    assert created.key == {"id": 7}


def test_rows_are_built_whatever_the_column_names() -> None:
    """The row function compiled per relation names columns by index only: names that look
    like its own variables or like code are plain keys."""
    names = ["v0", "n1", "values", "p0', 1)}\nimport os #", "None", "é 😀", ""]
    columns = [(name, INT8 if i == 0 else TEXT, i == 0) for i, name in enumerate(names)]
    texts: list[str | None] = [str(i) for i in range(len(names))]
    texts[2] = None
    catalog = Catalog({ORDERS: ("v0",)})
    mapper = ChangeMapper(
        source="pg-main",
        db="shop",
        captured=[ORDERS_TABLE],
        watermark=WATERMARK_TABLE,
        describe=catalog.describe,
    )
    items = feed(
        mapper,
        begin(0x500, 9),
        relation(ORDERS, "app", "orders", columns),
        insert(ORDERS, texts),
        update(ORDERS, ["0", *[TOAST] * (len(names) - 1)]),
        commit(0x500, 0x530),
    )
    created, updated = events(items)
    assert created.after == {"v0": 0, **{n: t for n, t in zip(names[1:], texts[1:], strict=True)}}
    assert list(created.after) == names
    assert updated.after == {"v0": 0}
