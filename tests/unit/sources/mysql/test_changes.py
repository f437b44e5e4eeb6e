"""The binlog mapping on hand-built records and rows events built as bytes: positions,
transaction ends, watermarks, schema descriptions and truncates, the events' lines, and the
resume points acknowledgements give."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from airflow_provider_dblog.core.event import JsonValue, Op, TableRef
from airflow_provider_dblog.core.event_codec import encode
from airflow_provider_dblog.core.lines import LogLines
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
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.sources.base import NoPrimaryKey, SourceError, UnknownTable
from airflow_provider_dblog.sources.mysql.catalog import ColumnInfo
from airflow_provider_dblog.sources.mysql.changes import BinlogMapper, TableColumns
from airflow_provider_dblog.sources.mysql.coordinates import mysql_commit
from airflow_provider_dblog.sources.mysql.events import TableMap
from airflow_provider_dblog.sources.mysql.records import (
    Begin,
    BinlogRecord,
    LogEnd,
    Query,
    RowKind,
    Rows,
    Xid,
)
from airflow_provider_dblog.sources.mysql.resume import (
    Acknowledgements,
    ResumePoint,
    advance_gtid_set,
    advance_gtid_state,
)
from tests.unit.sources.mysql.binlog_bytes import INT, VARCHAR, rows, table_map

ORDERS = TableRef("shop", "orders")
OTHER = TableRef("shop", "audit")
WATERMARK = TableRef("dblog", "watermark")
COLUMNS = (("id", INT), ("note", VARCHAR))
WIDER = (("id", INT), ("note", VARCHAR), ("extra", INT))
WATERMARK_COLUMNS = (("id", INT), ("value", VARCHAR))
ORDERS_ID, OTHER_ID, WATERMARK_ID = 7, 8, 9
MAPS = [
    table_map(ORDERS_ID, "shop", "orders", COLUMNS),
    table_map(OTHER_ID, "shop", "audit", COLUMNS),
    table_map(WATERMARK_ID, "dblog", "watermark", WATERMARK_COLUMNS),
]


def at(offset: int, file_number: int = 1) -> int:
    return mysql_commit(file_number, offset)


def described(*names: str, key: tuple[str, ...] = ("id",)) -> TableSchema:
    return TableSchema(tuple(Column(n, "int", n not in key, None) for n in names), key)


def infos(*names: str) -> tuple[ColumnInfo, ...]:
    return tuple(
        ColumnInfo(n, "varchar", "varchar(255)", "utf8mb4", "utf8mb4_bin", 255)
        if n == "note"
        else ColumnInfo(n, "int", "int(11)")
        for n in names
    )


class Catalog:
    """Tables as the catalog has them now."""

    def __init__(self) -> None:
        self.asked: list[TableRef] = []
        self.tables: dict[TableRef, tuple[str, ...]] = {ORDERS: ("id", "note")}
        self.keys: dict[TableRef, tuple[str, ...]] = {}

    def __call__(self, table: TableRef) -> TableColumns:
        self.asked.append(table)
        if table not in self.tables:
            raise UnknownTable(f"table {table} does not exist")
        names = self.tables[table]
        return TableColumns(described(*names, key=self.keys.get(table, ("id",))), infos(*names))


def mapper(catalog: Catalog | None = None) -> BinlogMapper:
    m = BinlogMapper(
        source="shop",
        db="shop",
        captured=[ORDERS],
        watermark=WATERMARK,
        columns=catalog or Catalog(),
    )
    for known in MAPS:
        m.table_map(known)
    return m


def run(m: BinlogMapper, records: Iterable[BinlogRecord]) -> list[LogItem]:
    """The items mapped, each rows event's `LogLines` as a `Change` a row."""
    return list(single_changes(item for record in records for item in m.map(record)))


def insert(*ids: int, table_id: int = ORDERS_ID) -> BinlogRecord:
    return rows(RowKind.INSERT, table_id, COLUMNS, [{"id": i, "note": "n"} for i in ids])


def changes(items: list[LogItem]) -> list[tuple[Op, JsonValue, Position]]:
    return [(i.event.op, i.event.key, i.event.position) for i in items if isinstance(i, Change)]


def table_items(items: list[LogItem]) -> list[tuple[str, TableRef, Position]]:
    return [
        (type(i).__name__, i.table, i.position)
        for i in items
        if isinstance(i, SchemaDescription | Truncate)
    ]


def test_a_transaction_is_positioned_at_its_first_event_and_ends_at_its_xid() -> None:
    items = run(
        mapper(),
        [
            Begin(at(400), 1_700_000_000_000, "0-1-7", 7, standalone=False),
            insert(1, 2),
            rows(RowKind.UPDATE, ORDERS_ID, COLUMNS, [({"id": 2, "note": "a"}, {"id": 2})]),
            rows(RowKind.DELETE, ORDERS_ID, COLUMNS, [{"id": 1, "note": "a"}]),
            Xid(),
        ],
    )
    assert changes(items) == [
        (Op.CREATE, {"id": 1}, Position(at(400), 0)),
        (Op.CREATE, {"id": 2}, Position(at(400), 1)),
        (Op.UPDATE, {"id": 2}, Position(at(400), 2)),
        (Op.DELETE, {"id": 1}, Position(at(400), 3)),
    ]
    assert items[-1] == TransactionEnd(at(400))
    first, update = items[0], items[2]
    assert isinstance(first, Change) and isinstance(update, Change)
    assert first.event.after == {"id": 1, "note": "n"}
    assert (update.event.before, update.event.after) == (
        {"id": 2, "note": "a"},
        {"id": 2, "note": None},
    )
    assert (first.event.source.txid, first.event.source.ts_ms) == (7, 1_700_000_000_000)
    assert first.event.schema_version == 0, "no version known for the table yet"
    for item in items:
        if isinstance(item, Change):
            line = item.event.line
            assert line == (encode(item.event.event()) + "\n").encode(), "the line encodes it"


def test_a_rows_event_is_one_item_of_consecutive_positions_and_joined_lines() -> None:
    """Inserts, deletes and updates that keep their keys: one `LogLines` a rows event of
    several rows, whose lines are `encode`'s of its events; a rows event of one row, and an
    update of a key: a `Change` a row."""
    m = mapper()
    assert list(m.map(Begin(at(50), 9, "0-1-3", 3, standalone=False))) == []
    created, updated, deleted, single, rekeyed = (
        list(m.map(record))
        for record in (
            insert(1, 2, 3),
            rows(RowKind.UPDATE, ORDERS_ID, COLUMNS, [({"id": 1}, {"id": 1, "note": "b"})] * 2),
            rows(RowKind.DELETE, ORDERS_ID, COLUMNS, [{"id": 2, "note": "n"}, {"id": 3}]),
            rows(RowKind.DELETE, ORDERS_ID, COLUMNS, [{"id": 1, "note": "b"}]),
            rows(
                RowKind.UPDATE, ORDERS_ID, COLUMNS, [({"id": 3}, {"id": 3}), ({"id": 2}, {"id": 7})]
            ),
        )
    )
    shapes = [
        (lines.op, lines.first, lines.last, lines.keys)
        for [lines] in (created, updated, deleted)
        if isinstance(lines, LogLines)
    ]
    assert shapes == [
        (Op.CREATE, 0, 2, [{"id": 1}, {"id": 2}, {"id": 3}]),
        (Op.UPDATE, 3, 4, [{"id": 1}, {"id": 1}]),
        (Op.DELETE, 5, 6, [{"id": 2}, {"id": 3}]),
    ]
    changed = [item for item in single + rekeyed if isinstance(item, Change)]
    assert len(changed) == 4
    assert [(c.event.op, c.event.position.seq) for c in changed] == [
        (Op.DELETE, 7),
        (Op.UPDATE, 8),
        (Op.DELETE, 9),
        (Op.CREATE, 10),
    ]
    for change in changed:
        assert change.event.line == (encode(change.event.event()) + "\n").encode()
    for [lines] in (created, updated, deleted):
        assert isinstance(lines, LogLines) and len(lines) == len(lines.keys)
        events = lines.events()
        assert [e.position for e in events] == [
            Position(at(50), s) for s in range(lines.first, lines.last + 1)
        ]
        assert b"".join((encode(e.event()) + "\n").encode() for e in events) == lines.data


def test_row_events_carry_the_tailers_schema_version_and_a_null_txid_without_one() -> None:
    m = mapper()
    m.schema_versions = {ORDERS: 3}
    items = run(m, [Begin(at(10), 5, standalone=False), insert(1), Xid()])
    change = items[0]
    assert isinstance(change, Change)
    assert change.event.schema_version == 3 and change.event.source.txid is None
    line = change.event.line
    assert line == (encode(change.event.event()) + "\n").encode()
    assert b'"txid":null,"ts_ms":5},"schema_version":3}' in line


def test_a_key_change_is_a_delete_then_a_create() -> None:
    items = run(
        mapper(),
        [
            Begin(at(10), 0, standalone=False),
            rows(RowKind.UPDATE, ORDERS_ID, COLUMNS, [({"id": 1, "note": "a"}, {"id": 9})]),
            Xid(),
        ],
    )
    assert [(op, key) for op, key, _ in changes(items)] == [
        (Op.DELETE, {"id": 1}),
        (Op.CREATE, {"id": 9}),
    ]


def test_rows_whose_json_holds_floats_are_spelled_as_encode_spells_them() -> None:
    """msgspec spells floats otherwise than `json`: a row whose document held one is spelled
    by the standard encoder, the rows around it by msgspec, and every line is `encode`'s."""
    json_note = ColumnInfo("note", "json", "longtext", "utf8mb4", "utf8mb4_bin")
    m = BinlogMapper(
        source="shop",
        db="shop",
        captured=[ORDERS],
        watermark=WATERMARK,
        columns=lambda _: TableColumns(described("id", "note"), (infos("id")[0], json_note)),
    )
    m.table_map(MAPS[0])
    docs = ['{"a": 1e16, "b": [0.1]}', '{"a": 1}', "1.0", '"x"']
    items = run(
        m,
        [
            Begin(at(10), 0, standalone=False),
            rows(
                RowKind.INSERT,
                ORDERS_ID,
                COLUMNS,
                [{"id": i, "note": d} for i, d in enumerate(docs)],
            ),
            rows(
                RowKind.UPDATE,
                ORDERS_ID,
                COLUMNS,
                [
                    ({"id": 0, "note": docs[1]}, {"id": 0, "note": docs[0]}),
                    ({"id": 1, "note": docs[0]}, {"id": 5, "note": docs[1]}),
                ],
            ),
            rows(
                RowKind.DELETE,
                ORDERS_ID,
                COLUMNS,
                [{"id": i, "note": d} for i, d in enumerate(docs)],
            ),
            Xid(),
        ],
    )
    lines = [item.event.line for item in items if isinstance(item, Change)]
    assert len(lines) == 11
    for item in items:
        if isinstance(item, Change):
            assert item.event.line == (encode(item.event.event()) + "\n").encode()
    assert b'"a":1e+16' in lines[0] and b'"a":1}' in lines[1]


def test_watermark_updates_take_a_position_and_other_tables_are_skipped() -> None:
    catalog = Catalog()
    items = run(
        mapper(catalog),
        [
            Begin(at(100), 0, standalone=False),
            insert(5, table_id=OTHER_ID),
            rows(
                RowKind.UPDATE,
                WATERMARK_ID,
                WATERMARK_COLUMNS,
                [({"id": 1, "value": "old"}, {"id": 1, "value": "lw-1"})],
            ),
            insert(1),
            Xid(),
        ],
    )
    assert items[0] == WatermarkWrite("lw-1", Position(at(100), 0))
    assert changes(items) == [(Op.CREATE, {"id": 1}, Position(at(100), 1))]
    assert catalog.asked == [ORDERS], "the catalog is asked only about captured tables"


def test_without_gtids_begin_and_commit_queries_bound_the_transaction() -> None:
    """MySQL without GTIDs, or a non-transactional table: BEGIN opens, COMMIT closes; a
    statement between (a SAVEPOINT) does not end it."""
    items = run(
        mapper(),
        [
            Query(at(200), 0, "shop", "BEGIN"),
            insert(1),
            Query(at(300), 0, "shop", "SAVEPOINT s1"),
            insert(2),
            Query(at(400), 0, "shop", "COMMIT"),
        ],
    )
    assert [p for _, _, p in changes(items)] == [Position(at(200), 0), Position(at(200), 1)]
    assert items[-1] == TransactionEnd(at(200))


@pytest.mark.parametrize("standalone", [True, None])
def test_ddl_is_a_transaction_of_its_own_describing_the_table_it_names(
    standalone: bool | None,
) -> None:
    """MariaDB flags a DDL group standalone; MySQL's GTID says nothing, and a first query that
    is not BEGIN tells. The ALTER describes the table as the catalog has it, and its next rows
    (a new shape) are read with the new columns."""
    catalog = Catalog()
    m = mapper(catalog)
    run(m, [Begin(at(10), 0, standalone=False), insert(1), Xid()])
    catalog.tables[ORDERS] = ("id", "note", "extra")
    items = run(
        m,
        [
            Begin(at(20), 0, standalone=standalone),
            Query(at(30), 0, "shop", "ALTER TABLE `orders` ADD COLUMN extra int"),
            Begin(at(40), 0, standalone=False),
            table_map(ORDERS_ID + 10, "shop", "orders", WIDER),
            rows(RowKind.INSERT, ORDERS_ID + 10, WIDER, [{"id": 2, "note": "n", "extra": 3}]),
            Xid(),
        ],
    )
    assert items[0] == SchemaDescription(
        ORDERS, described("id", "note", "extra"), Position(at(20), 0), ts_ms=0, after_ddl=True
    ), "a DDL statement's description ends open windows even as the table's first"
    assert items[1] == TransactionEnd(at(20))
    assert changes(items) == [(Op.CREATE, {"id": 2}, Position(at(40), 0))]
    created = items[2]
    assert isinstance(created, Change) and created.event.after == {"id": 2, "note": "n", "extra": 3}
    assert items[-1] == TransactionEnd(at(40))
    assert catalog.asked == [ORDERS, ORDERS, ORDERS], "first rows, the ALTER, the new shape"
    third = rows(RowKind.INSERT, ORDERS_ID + 10, WIDER, [{"id": 3}])
    more = [Begin(at(50), 0, standalone=False), third, Xid()]
    assert table_items(run(m, more)) == []
    assert catalog.asked == [ORDERS, ORDERS, ORDERS], "the same shape: not asked again"


def test_truncate_of_a_captured_table_and_ddl_of_others() -> None:
    catalog = Catalog()
    m = mapper(catalog)
    items = run(
        m,
        [
            Begin(at(10), 0, standalone=True),
            Query(at(10), 0, "shop", "TRUNCATE TABLE orders"),
            Begin(at(20), 0, standalone=True),
            Query(at(20), 0, "other", "truncate `shop`.`orders`"),
            Begin(at(30), 0, standalone=True),
            Query(at(30), 0, "other", "TRUNCATE orders"),
            Begin(at(40), 0, standalone=True),
            Query(at(40), 0, "shop", "ALTER TABLE audit ADD COLUMN x int"),
        ],
    )
    del catalog.tables[ORDERS]
    items += run(
        m, [Begin(at(50), 0, standalone=True), Query(at(50), 0, "shop", "DROP TABLE orders")]
    )
    assert table_items(items) == [
        ("Truncate", ORDERS, Position(at(10), 0)),
        ("Truncate", ORDERS, Position(at(20), 0)),
    ], "other.orders is not captured; audit is not; a dropped table is not described"
    assert items[-1] == TransactionEnd(at(50))
    assert len([i for i in items if isinstance(i, TransactionEnd)]) == 5


def test_positions_do_not_depend_on_where_the_reader_started() -> None:
    """A reader started at the second transaction (after a restart) gives it exactly the
    positions the first reader gave it, so replays repeat positions and are recognised."""
    second = [
        Begin(at(20), 0, standalone=False),
        rows(
            RowKind.UPDATE,
            WATERMARK_ID,
            WATERMARK_COLUMNS,
            [({"id": 1, "value": "a"}, {"id": 1, "value": "hw-1"})],
        ),
        insert(2),
        Xid(),
    ]
    from_start = run(mapper(), [Begin(at(10), 0, standalone=False), insert(1), Xid(), *second])
    assert from_start[2:] == run(mapper(), second)


def test_idle_lies_below_a_transaction_that_starts_at_the_log_end() -> None:
    """The heartbeat says the log ends at 500; the next transaction may start at exactly 500,
    so acknowledging the idle value must not pass it."""
    m = mapper()
    idle = run(m, [LogEnd(at(500))])
    assert idle == [Idle(at(500) - 1)]
    items = run(m, [Begin(at(500), 0, standalone=False), insert(1)])
    assert changes(items)[0][2] == Position(at(500), 0)
    assert run(m, [LogEnd(at(600))]) == [], "no Idle inside a transaction"


def test_a_captured_table_without_primary_key_is_refused() -> None:
    catalog = Catalog()
    catalog.keys[ORDERS] = ()
    with pytest.raises(NoPrimaryKey, match=r"shop\.orders"):
        run(mapper(catalog), [Begin(at(1), 0, standalone=False), insert(1)])


def test_rows_outside_a_transaction_or_before_their_table_map_are_an_error() -> None:
    with pytest.raises(SourceError, match="outside a transaction"):
        run(mapper(), [insert(1)])
    with pytest.raises(SourceError, match="table id 99 before its table map"):
        run(mapper(), [Begin(at(1), 0, standalone=False), insert(1, table_id=99)])


def test_rows_that_do_not_end_where_the_event_does_are_an_error() -> None:
    """Images read past the event's end (a table map that does not describe them) are never
    taken for rows."""
    event = insert(1, 2)
    assert isinstance(event, Rows)
    short = Rows(event.kind, event.head, event.data, event.end - 2)
    with pytest.raises(SourceError, match="does not end where its rows do"):
        run(mapper(), [Begin(at(1), 0, standalone=False), short])


def test_without_column_names_the_catalog_names_them_by_position() -> None:
    """binlog_row_metadata = MINIMAL: the map carries no names; more columns than the catalog
    knows is an error saying how to fix it."""
    m = mapper()
    m.table_map(table_map(ORDERS_ID, "shop", "orders", COLUMNS, names=False))
    items = run(m, [Begin(at(1), 0, standalone=False), insert(4), Xid()])
    change = items[0]
    assert isinstance(change, Change) and change.event.after == {"id": 4, "note": "n"}
    m.table_map(table_map(ORDERS_ID, "shop", "orders", WIDER, names=False))
    wider = rows(RowKind.INSERT, ORDERS_ID, WIDER, [{"id": 5, "extra": 1}])
    with pytest.raises(SourceError, match="binlog_row_metadata = 'FULL'"):
        run(m, [Begin(at(2), 0, standalone=False), wider])


def test_a_table_map_is_parsed_from_its_bytes() -> None:
    assert MAPS[0] == TableMap(
        7, "shop", "orders", bytes([INT, VARCHAR]), (0, 1020), ("id", "note")
    )


def test_acknowledging_gives_the_point_after_the_last_durable_transaction() -> None:
    start = ResumePoint("binlog.000001", 300, "0-1-4")
    acks = Acknowledgements(start)
    acks.handed(at(400), ResumePoint("binlog.000001", 480, "0-1-5"))
    acks.handed(at(480), ResumePoint("binlog.000001", 560, "0-1-6"))
    assert acks.acknowledge(at(399)) == start
    assert acks.acknowledge(at(400)) == ResumePoint("binlog.000001", 480, "0-1-5")
    assert acks.acknowledge(at(560) - 1) == ResumePoint("binlog.000001", 560, "0-1-6")
    assert acks.acknowledge(at(100)) == ResumePoint("binlog.000001", 560, "0-1-6"), "no going back"
    with pytest.raises(SourceError, match="does not grow"):
        acks.handed(at(480), ResumePoint("binlog.000001", 600, "0-1-7"))
        acks.handed(at(470), ResumePoint("binlog.000001", 650, "0-1-8"))


def test_resume_points_round_trip_and_gtid_states_advance_per_domain() -> None:
    point = ResumePoint("binlog.000007", 1234, "0-1-42,1-7-3")
    assert ResumePoint.from_text(point.to_text()) == point
    with pytest.raises(SourceError, match="not one this reader wrote"):
        ResumePoint.from_text("12345")
    assert advance_gtid_state("0-1-42,1-7-3", "1-7-4") == "0-1-42,1-7-4"
    assert advance_gtid_state("", "0-5-1") == "0-5-1"
    assert advance_gtid_state("0-1-42", "10-2-1") == "0-1-42,10-2-1"


def test_mysql_gtid_sets_take_each_transaction() -> None:
    uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
    other = "4e11fa47-71ca-11e1-9e33-c80aa9429562"
    assert advance_gtid_set(f"{uuid}:1-5,\n{other}:1-2", f"{uuid}:6") == (f"{uuid}:1-6,{other}:1-2")
    assert advance_gtid_set("", f"{other}:1") == f"{other}:1"
