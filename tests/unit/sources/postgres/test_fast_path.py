"""The row changes read straight from the message bytes into runs (`ChangeMapper.add_change`,
as the log reader reads them, and `map_bytes`) give what `map(decode(...))` gives: the same
events, or the same error; and the line each event carries is `encode`'s. Over every column
type, NULLs, unchanged TOAST values, the default and the full replica identity, keys kept and
keys changed, runs broken by other tables and by changes read the general way."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.core.event import EncodedLogEvent, Event, Op, TableRef
from airflow_provider_dblog.core.event_codec import encode, encode_lines
from airflow_provider_dblog.core.lines import LogLines, LogRuns
from airflow_provider_dblog.core.log import (
    Change,
    LogItem,
    SchemaDescription,
    TransactionEnd,
    single_changes,
)
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.sources.postgres.changes import (
    ROW_CHANGE_TAGS,
    RUN_CHANGES,
    ChangeMapper,
)
from airflow_provider_dblog.sources.postgres.pgoutput import Relation, decode
from tests.unit.pgoutput_bytes import (
    TOAST,
    TupleValue,
    begin,
    commit,
    delete,
    insert,
    relation,
    update,
)

pytestmark = pytest.mark.unit

TABLE, OTHER, WATERMARK = 16385, 16386, 16400
BEGIN, COMMIT = b"BC"
INT8, INT4, TEXT, BOOL, FLOAT8, JSONB, NUMERIC, TIMESTAMPTZ = 20, 23, 25, 16, 701, 3802, 1700, 1184

VALUES: dict[int, st.SearchStrategy[str]] = {
    INT8: st.integers(-(2**63), 2**63 - 1).map(str),
    INT4: st.integers(-(2**31), 2**31 - 1).map(str),
    TEXT: st.text() | st.sampled_from(['a"b\\c', "\x00\x1f\x7f", "\u2028é😀", "%b %d %%"]),
    BOOL: st.sampled_from(["t", "f"]),
    FLOAT8: st.sampled_from(["1.5", "-0", "1e+16", "NaN", "Infinity", "3.141592653589793"]),
    JSONB: st.sampled_from(['{"a": [1, null]}', "[]", '"x"', "12.50"]),
    NUMERIC: st.sampled_from(["12.50", "-0.001", "NaN"]),
    TIMESTAMPTZ: st.just("2024-01-02 03:04:05.123456+00"),
}
GARBAGE = st.sampled_from(["", "x", "1.5", " 7", "1_000", "\ud7ff"])
"""Texts some converters refuse (or read loosely): both paths must agree on them too."""


def mapper_for(
    columns: list[tuple[str, int, bool]],
    primary_key: tuple[str, ...] = ("id",),
    *,
    capture_other: bool = False,
) -> ChangeMapper:
    """A mapper of the captured table `app.t`, whose primary key is `primary_key` (the replica
    identity may be more: FULL), and of `app.other` if `capture_other`."""

    def describe(rel: Relation) -> TableSchema:
        key = tuple(c.name for c in rel.columns if c.name in primary_key)
        return TableSchema(
            tuple(Column(c.name, str(c.type_oid), True, None) for c in rel.columns), key
        )

    return ChangeMapper(
        source='pg-%d"main',
        db="sh%bop",
        captured=[TableRef("app", "t")] + ([TableRef("app", "other")] if capture_other else []),
        watermark=TableRef("dblog", "watermark"),
        describe=describe,
    )


def decoded(mapper: ChangeMapper, message: bytes) -> list[LogItem]:
    return mapper.map(decode(message))


def outcome(call: Callable[[], list[LogItem]]) -> tuple[str, object]:
    try:
        return "items", call()
    except Exception as exc:
        return "error", (type(exc), str(exc))


@st.composite
def row_changes(draw: st.DrawFn) -> tuple[list[tuple[str, int, bool]], list[bytes]]:
    """A relation of the captured table (default or full identity), then a few inserts,
    updates and deletes of it (and of others), some malformed."""
    oids = draw(st.lists(st.sampled_from(sorted(VALUES)), min_size=1, max_size=6))
    full = draw(st.booleans())
    columns = [(f'c{i} %b"' if i else "id", oid, full or i == 0) for i, oid in enumerate(oids)]
    messages = [begin(0x500, 9), relation(TABLE, "app", "t", columns, "f" if full else "d")]
    messages.append(relation(OTHER, "app", "other", [("id", INT8, True)]))

    def values() -> list[TupleValue]:
        drawn: list[TupleValue] = []
        for _, oid, _ in columns:
            odd = st.one_of(VALUES[oid], st.none(), st.just(TOAST), GARBAGE)
            drawn.append(draw(odd if draw(st.integers(0, 3)) == 0 else VALUES[oid]))
        if draw(st.integers(0, 9)) == 0:
            drawn = drawn[:-1]  # a tuple that does not fit the relation
        return drawn

    def old_tuple(new: list[TupleValue]) -> list[TupleValue]:
        """The old row (full identity) or key ('K': nulls but the key); its key mostly kept."""
        old = values()
        if old and new and draw(st.integers(0, 3)):
            old[0] = new[0]
        return old if full else [v if i == 0 else None for i, v in enumerate(old)]

    for _ in range(draw(st.integers(1, 4))):
        relation_id = draw(st.sampled_from([TABLE, TABLE, TABLE, OTHER, 99]))
        new = values()
        kind = draw(st.sampled_from(["insert", "update", "update-old", "delete"]))
        if kind == "insert":
            message = insert(relation_id, new)
        elif kind == "update":
            message = update(relation_id, new)
        elif kind == "update-old":
            message = update(relation_id, new, old=old_tuple(new), old_is_key_only=not full)
        else:
            message = delete(relation_id, old_tuple(new), old_is_key_only=not full)
        cut = draw(st.integers(0, 9))
        if cut == 0:
            message = message[: draw(st.integers(0, len(message) - 1))]
        elif cut == 1:
            message += b"\0"
        messages.append(message)
    messages.append(commit(0x500, 0x530))
    return columns, messages


def read_as_the_stream_does(mapper: ChangeMapper, data: bytes, start: int) -> Iterator[LogItem]:
    """The items the log reader (`PostgresLogReader.items`) yields for one message of a stream
    that goes on: a change goes into the run, a commit's run joins the runs held, and what is
    held goes out once `full` or before any other item (`take_all`; and at the stream's end:
    `read_stream`)."""
    tag = data[start] if len(data) > start else 0
    if tag in ROW_CHANGE_TAGS and mapper.add_change(data, start):
        if mapper.full:
            yield from mapper.take_all()
        return
    if tag == BEGIN and mapper.read_begin(data, start):
        return
    if tag == COMMIT and mapper.read_commit(data, start) is not None:
        if mapper.full:
            yield from mapper.take_all()
        return
    yield from mapper.take_all()
    yield from mapper.map(decode(data[start:]))


def read_stream(mapper: ChangeMapper, messages: list[bytes]) -> list[LogItem]:
    """The items of `messages` read as the stream does, and what is held at their end."""
    items = [item for m in messages for item in read_as_the_stream_does(mapper, m, 0)]
    return items + mapper.take_all()


def counted(events: Iterable[Event]) -> Counter[tuple[str, str, Op]]:
    """How many of `events` are of each (schema, table, operation)."""
    return Counter((event.table.schema, event.table.name, event.op) for event in events)


def read_all(
    read: Callable[[bytes], Iterable[LogItem]], messages: list[bytes]
) -> tuple[list[LogItem], object]:
    """The items of `messages`, and the error that ended them (None if none did)."""
    items: list[LogItem] = []
    for message in messages:
        try:
            for item in read(message):
                items.append(item)
        except Exception as exc:
            return items, (type(exc), str(exc))
    return items, None


@settings(max_examples=600, deadline=None)
@given(row_changes(), st.integers(0, 30), st.booleans())
def test_row_changes_read_from_bytes_are_what_the_decoded_messages_give(
    case: tuple[list[tuple[str, int, bool]], list[bytes]], offset: int, capture_other: bool
) -> None:
    columns, messages = case
    general = mapper_for(columns, capture_other=capture_other)
    from_bytes = mapper_for(columns, capture_other=capture_other)
    expected, expected_error = read_all(partial(decoded, general), messages)
    got, error = read_all(
        lambda message: read_as_the_stream_does(from_bytes, b"w" * offset + message, offset),
        messages,
    )
    if error is None:  # the stream's end: what is held goes out
        got += from_bytes.take_all()
    assert error == expected_error
    assert list(single_changes(got)) == expected
    for item in got:
        if isinstance(item, LogLines):
            assert item.step == 2 and len(item) == len(item.keys)
            for event in item.events():
                assert isinstance(event, EncodedLogEvent)
                assert event.line == (encode(event) + "\n").encode()
                assert encode_lines([event]) == [event.line]


def test_an_insert_outside_a_transaction_is_refused_as_before() -> None:
    mapper = mapper_for([("id", INT8, True)])
    expected: list[LogItem] = []
    assert mapper.map_bytes(begin(0x500, 9)) == expected
    mapper.map_bytes(relation(TABLE, "app", "t", [("id", INT8, True)]))
    mapper.map_bytes(commit(0x500, 0x530))
    message = insert(TABLE, ["1"])
    assert outcome(partial(mapper.map_bytes, message)) == outcome(partial(decoded, mapper, message))


@pytest.mark.parametrize("full", [False, True])
def test_updates_and_deletes_keeping_their_key_are_read_from_bytes(full: bool) -> None:
    """The changes of an OLTP load take the bytes' way, each with its line."""
    columns = [("id", INT8, True), ("k", INT4, full), ("c", TEXT, full)]
    mapper = mapper_for(columns)
    mapper.map_bytes(begin(0x500, 9))
    mapper.map_bytes(relation(TABLE, "app", "t", columns, "f" if full else "d"))
    old: list[TupleValue] = ["7", "1", "a"] if full else ["7", None, None]
    messages = [
        insert(TABLE, ["7", "1", "a"]),
        update(TABLE, ["7", "2", "b"]),
        update(TABLE, ["7", "2", "b"], old=old, old_is_key_only=not full),
        delete(TABLE, old, old_is_key_only=not full),
    ]
    read = [item for message in messages for item in mapper.map_bytes(message)]
    assert all(isinstance(i, LogLines) for i in read)
    assert [e.event.op.value for e in single_changes(read) if isinstance(e, Change)] == [
        "c",
        "u",
        "u",
        "d",
    ]


@pytest.mark.parametrize("full", [False, True])
def test_a_transactions_changes_go_out_as_one_run(full: bool) -> None:
    """An OLTP transaction's update, update, delete and insert, over two tables, are one
    `LogLines` at seqs 1, 3, 5, 7 and 9, whose events are the decoded messages'."""
    columns = [("id", INT8, True), ("k", INT4, full), ("c", TEXT, full)]
    old: list[TupleValue] = ["7", "1", "a"] if full else ["7", None, None]
    messages = [
        begin(0x500, 9),
        relation(TABLE, "app", "t", columns, "f" if full else "d"),
        relation(OTHER, "app", "other", [("id", INT8, True)]),
        update(TABLE, ["7", "2", "b"]),
        update(TABLE, ["7", "2", "c"], old=old, old_is_key_only=not full),
        delete(TABLE, old, old_is_key_only=not full),
        insert(OTHER, ["1"]),
        insert(TABLE, ["8", "1", "a"]),
        commit(0x500, 0x530),
    ]
    general = mapper_for(columns, capture_other=True)
    from_bytes = mapper_for(columns, capture_other=True)
    expected = [item for message in messages for item in decoded(general, message)]
    got = read_stream(from_bytes, messages)
    assert list(single_changes(got)) == expected
    runs = [item for item in got if isinstance(item, LogLines)]
    assert len(runs) == 1
    (run,) = runs
    assert (run.first, run.last, run.step, len(run)) == (1, 9, 2, 5)
    assert run.ops == [Op.UPDATE, Op.UPDATE, Op.DELETE, Op.CREATE, Op.CREATE]
    assert run.tables is not None
    assert [table.name for table in run.tables] == ["t", "t", "t", "other", "t"]
    assert [event.source.table for event in run.events()] == ["t", "t", "t", "other", "t"]
    assert got[-1] == TransactionEnd(0x500)


def changes_of(items: list[LogItem]) -> list[LogItem]:
    """Every item but the transactions' ends, a change a row."""
    return [item for item in single_changes(items) if not isinstance(item, TransactionEnd)]


def test_transactions_read_one_after_another_go_out_together() -> None:
    """Small transactions read one after another are one `LogRuns` followed by the last one's
    end, which stands for an empty transaction's after them too: each change at its own
    commit, as decoded."""
    columns = [("id", INT8, True), ("k", INT4, False)]
    messages = [
        begin(0x400, 8),
        relation(TABLE, "app", "t", columns),
        relation(OTHER, "app", "other", [("id", INT8, True)]),
        commit(0x400, 0x430),
    ]
    for n in range(5):
        lsn = 0x500 + n * 0x100
        messages += [
            begin(lsn, 10 + n),
            update(TABLE, [str(n), "1"]),
            insert(OTHER, [str(n)]),
            commit(lsn, lsn + 0x30),
        ]
    messages += [begin(0x1000, 20), commit(0x1000, 0x1030)]
    general = mapper_for(columns, capture_other=True)
    from_bytes = mapper_for(columns, capture_other=True)
    expected = [item for message in messages for item in decoded(general, message)]
    got = read_stream(from_bytes, messages)
    assert changes_of(got) == changes_of(expected)
    descriptions, first_end, runs, end = got[:2], *got[2:]
    assert all(isinstance(item, SchemaDescription) for item in descriptions)
    assert first_end == TransactionEnd(0x400)  # no run was held: its end went out at once
    assert isinstance(runs, LogRuns) and end == TransactionEnd(0x1000)
    assert (len(runs.runs), len(runs)) == (5, 10)
    assert runs.counts == {("app", "t", Op.UPDATE): 5, ("app", "other", Op.CREATE): 5}
    assert runs.data == b"".join(run.data for run in runs.runs)
    assert [event.position for event in runs.events()] == [
        Position(0x500 + n * 0x100, seq) for n in range(5) for seq in (1, 3)
    ]


def test_the_changes_held_go_out_at_run_changes() -> None:
    """However many transactions come one after another, or however large one is, the reader
    holds at most `RUN_CHANGES` changes."""
    columns = [("id", INT8, True)]
    messages = [begin(0x100, 1), relation(TABLE, "app", "t", columns), commit(0x100, 0x130)]
    transactions = RUN_CHANGES  # of two changes each
    for n in range(transactions):
        lsn = 0x1000 + n * 0x100
        messages += [
            begin(lsn, 10 + n),
            insert(TABLE, [str(2 * n)]),
            insert(TABLE, [str(2 * n + 1)]),
        ]
        messages.append(commit(lsn, lsn + 0x30))
    big = 0x1000 + transactions * 0x100
    messages.append(begin(big, 99))
    messages += [insert(TABLE, [str(-1 - i)]) for i in range(RUN_CHANGES + 3)]
    messages.append(commit(big, big + 0x30))
    general, from_bytes = mapper_for(columns), mapper_for(columns)
    expected = [item for message in messages for item in decoded(general, message)]
    got = read_stream(from_bytes, messages)
    assert changes_of(got) == changes_of(expected)
    held = [len(item) for item in got if isinstance(item, LogLines | LogRuns)]
    assert all(item.counts == counted(item.events()) for item in got if isinstance(item, LogRuns))
    assert max(held) == RUN_CHANGES and sum(held) == 2 * transactions + RUN_CHANGES + 3
    assert got[-1] == TransactionEnd(big)


@pytest.mark.parametrize(
    "message",
    [begin(0x500, 9)[:-1], begin(0x500, 9) + b"\0", commit(0x500, 0x530)[:-1], b"B", b"C"],
    ids=["begin-short", "begin-long", "commit-short", "begin-bare", "commit-bare"],
)
def test_a_malformed_begin_or_commit_fails_as_the_decoder_does(message: bytes) -> None:
    general, from_bytes = mapper_for([("id", INT8, True)]), mapper_for([("id", INT8, True)])
    expected = outcome(partial(decoded, general, message))
    assert expected[0] == "error"
    assert outcome(partial(from_bytes.map_bytes, message)) == expected


def test_a_transaction_read_from_bytes_ends_at_its_commit() -> None:
    mapper = mapper_for([("id", INT8, True)])
    mapper.map_bytes(begin(0x500, 9))
    assert mapper.open_commit == 0x500
    assert mapper.map_bytes(commit(0x500, 0x530)) == [TransactionEnd(0x500)]
    assert mapper.open_commit is None
