"""The binlog mapping on hand-built records: positions, transaction ends, watermarks, schema
descriptions and truncates, and the resume points acknowledgements give."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from airflow_provider_dblog.core.event import JsonValue, Op, TableRef
from airflow_provider_dblog.core.log import (
    Change,
    Idle,
    LogItem,
    SchemaDescription,
    TransactionEnd,
    Truncate,
    WatermarkWrite,
)
from airflow_provider_dblog.core.position import Position, mysql_commit
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.sources.base import NoPrimaryKey, SourceError, UnknownTable
from airflow_provider_dblog.sources.mysql.changes import (
    Begin,
    BinlogMapper,
    BinlogRecord,
    LogEnd,
    Query,
    RowKind,
    Rows,
    TableColumns,
    Xid,
)
from airflow_provider_dblog.sources.mysql.resume import (
    Acknowledgements,
    ResumePoint,
    advance_gtid_set,
    advance_gtid_state,
)

ORDERS = TableRef("shop", "orders")
OTHER = TableRef("shop", "audit")
WATERMARK = TableRef("dblog", "watermark")
SHAPE = (("id", 3), ("note", 15))


def at(offset: int, file_number: int = 1) -> int:
    return mysql_commit(file_number, offset)


def described(*names: str, key: tuple[str, ...] = ("id",)) -> TableSchema:
    return TableSchema(tuple(Column(n, "int", n not in key, None) for n in names), key)


class Catalog:
    """Tables as the catalog has them now; values pass through, upper-cased strings show the
    converter ran."""

    def __init__(self) -> None:
        self.asked: list[TableRef] = []
        self.tables: dict[TableRef, TableSchema] = {ORDERS: described("id", "note")}

    def __call__(self, table: TableRef) -> TableColumns:
        self.asked.append(table)
        if table not in self.tables:
            raise UnknownTable(f"table {table} does not exist")

        def convert(name: str, value: object) -> JsonValue:
            return value.upper() if isinstance(value, str) else value

        return TableColumns(self.tables[table], convert)


def mapper(catalog: Catalog | None = None) -> BinlogMapper:
    return BinlogMapper(
        source="shop",
        db="shop",
        captured=[ORDERS],
        watermark=WATERMARK,
        columns=catalog or Catalog(),
    )


def run(m: BinlogMapper, records: Iterable[BinlogRecord]) -> list[LogItem]:
    return [item for record in records for item in m.map(record)]


def insert(*ids: int, table: TableRef = ORDERS, shape: tuple[object, ...] = SHAPE) -> Rows:
    return Rows(table, RowKind.INSERT, [(None, {"id": i, "note": "n"}) for i in ids], shape)


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
            Rows(
                ORDERS,
                RowKind.UPDATE,
                [({"id": 2, "note": "a"}, {"id": 2, "note": "b"})],
                SHAPE,
            ),
            Rows(ORDERS, RowKind.DELETE, [({"id": 1, "note": "a"}, None)], SHAPE),
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
    first = items[0]
    assert isinstance(first, Change)
    assert first.event.after == {"id": 1, "note": "N"}, "values go through the converter"
    assert (first.event.source.txid, first.event.source.ts_ms) == (7, 1_700_000_000_000)
    assert first.event.schema_version == 0, "the tailer stamps versions"


def test_a_key_change_is_a_delete_then_a_create() -> None:
    items = run(
        mapper(),
        [
            Begin(at(10), 0, standalone=False),
            Rows(ORDERS, RowKind.UPDATE, [({"id": 1, "note": "a"}, {"id": 9, "note": "a"})], SHAPE),
            Xid(),
        ],
    )
    assert [(op, key) for op, key, _ in changes(items)] == [
        (Op.DELETE, {"id": 1}),
        (Op.CREATE, {"id": 9}),
    ]


def test_watermark_updates_take_a_position_and_other_tables_are_skipped() -> None:
    catalog = Catalog()
    items = run(
        mapper(catalog),
        [
            Begin(at(100), 0, standalone=False),
            insert(5, table=OTHER),
            Rows(WATERMARK, RowKind.UPDATE, [({"value": "old"}, {"value": "lw-1"})], ()),
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
    (a new shape) are converted with the new columns."""
    catalog = Catalog()
    m = mapper(catalog)
    run(m, [Begin(at(10), 0, standalone=False), insert(1), Xid()])
    catalog.tables[ORDERS] = described("id", "note", "extra")
    items = run(
        m,
        [
            Begin(at(20), 0, standalone=standalone),
            Query(at(30), 0, "shop", "ALTER TABLE `orders` ADD COLUMN extra int"),
            Begin(at(40), 0, standalone=False),
            Rows(ORDERS, RowKind.INSERT, [(None, {"id": 2, "note": "n", "extra": 3})], (1, 2, 3)),
            Xid(),
        ],
    )
    assert items[0] == SchemaDescription(
        ORDERS, described("id", "note", "extra"), Position(at(20), 0), ts_ms=0, after_ddl=True
    ), "a DDL statement's description ends open windows even as the table's first"
    assert items[1] == TransactionEnd(at(20))
    assert changes(items) == [(Op.CREATE, {"id": 2}, Position(at(40), 0))]
    assert items[-1] == TransactionEnd(at(40))
    assert catalog.asked == [ORDERS, ORDERS, ORDERS], "first rows, the ALTER, the new shape"
    assert table_items(run(m, [Begin(at(50), 0, standalone=False), insert(3), Xid()])) == []


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
        Rows(WATERMARK, RowKind.UPDATE, [({"value": "a"}, {"value": "hw-1"})], ()),
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
    catalog.tables[ORDERS] = described("id", "note", key=())
    with pytest.raises(NoPrimaryKey, match=r"shop\.orders"):
        run(mapper(catalog), [Begin(at(1), 0, standalone=False), insert(1)])


def test_rows_outside_a_transaction_are_an_error() -> None:
    with pytest.raises(SourceError, match="outside a transaction"):
        run(mapper(), [insert(1)])


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
