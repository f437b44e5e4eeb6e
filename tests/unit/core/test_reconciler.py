"""The reconciler on hand-written sequences: the paper's example and the impossible ones."""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_provider_dblog.core.event import (
    Event,
    LogOrigin,
    Op,
    Origin,
    PlainEvent,
    SourceInfo,
    TableRef,
    table_event,
)
from airflow_provider_dblog.core.lines import LogLines
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import (
    ChunkRows,
    Closed,
    Failed,
    FailureReason,
    Opened,
    Reconciler,
    Window,
)
from airflow_provider_dblog.core.schema import Column, TableSchema

pytestmark = pytest.mark.unit

T = TableRef("public", "t")
OTHER = TableRef("public", "other")


def change(key: str, commit: int, table: TableRef = T, txid: int | None = None) -> Event:
    source = SourceInfo(
        "src", "db", table.schema, table.name, Position(commit, 0), Origin.LOG, txid=txid
    )
    return PlainEvent(Op.UPDATE, {"k": key}, None, {"k": key, "v": "log"}, source, 1)


def rows(*keys: str) -> list[dict[str, str]]:
    return [{"k": k, "v": "chunk"} for k in keys]


def chunk(window: Window, *keys: str, invisible: frozenset[int] = frozenset()) -> ChunkRows:
    return ChunkRows(window.window_id, ("k",), rows(*keys), 1, invisible)


def test_paper_example_k1_to_k6() -> None:
    """Figures 3a/3b: a chunk of k1..k6; k1 and k3 change between lw and hw, so the chunk rows
    of k1 and k3 are dropped and k2, k4, k5, k6 are appended at hw, after every log event before
    hw and before every log event after it."""
    rec = Reconciler("src", "db")
    window = Window("w1", "d1", T)
    output: list[Event] = []

    before = change("k2", 10)
    rec.change(before)
    output.append(before)
    assert isinstance(rec.low_watermark(window, Position(20, 0)), Opened)
    for key, commit in (("k1", 30), ("k3", 40)):
        event = change(key, commit)
        rec.change(event)
        output.append(event)
    closed = rec.high_watermark(window, Position(50, 0))
    assert isinstance(closed, Closed)
    assert closed.changed_keys == {("k1",), ("k3",)}
    survivors = rec.chunk_events(closed, chunk(window, "k1", "k2", "k3", "k4", "k5", "k6"))
    assert isinstance(survivors, list)
    output.extend(survivors)
    after = change("k4", 60)
    rec.change(after)
    output.append(after)

    assert [(e.op.value, e.key["k"]) for e in output] == [
        ("u", "k2"),
        ("u", "k1"),
        ("u", "k3"),
        ("r", "k2"),
        ("r", "k4"),
        ("r", "k5"),
        ("r", "k6"),
        ("u", "k4"),
    ]
    assert [e.position for e in survivors] == [Position(50, i) for i in range(1, 5)]
    assert all(e.source.window_id == "w1" and e.source.dump_id == "d1" for e in survivors)
    positions = [e.position for e in output]
    assert positions == sorted(positions)


def test_events_before_lw_and_of_other_tables_do_not_drop_rows() -> None:
    rec = Reconciler("src", "db")
    window = Window("w1", "d1", T)
    rec.change(change("k1", 10))
    rec.low_watermark(window, Position(20, 0))
    rec.change(change("k2", 30, table=OTHER))
    closed = rec.high_watermark(window, Position(40, 0))
    assert isinstance(closed, Closed)
    survivors = rec.chunk_events(closed, chunk(window, "k1", "k2"))
    assert isinstance(survivors, list)
    assert [e.key["k"] for e in survivors] == ["k1", "k2"]


def test_several_windows_are_reconciled_each_on_its_own() -> None:
    rec = Reconciler("src", "db")
    first, second = Window("w1", "d1", T), Window("w2", "d1", T)
    rec.low_watermark(first, Position(10, 0))
    rec.change(change("a", 20))
    rec.low_watermark(second, Position(30, 0))
    rec.change(change("x", 40))
    closed_first = rec.high_watermark(first, Position(50, 0))
    rec.change(change("y", 60))
    closed_second = rec.high_watermark(second, Position(70, 0))
    assert isinstance(closed_first, Closed) and isinstance(closed_second, Closed)
    assert closed_first.changed_keys == {("a",), ("x",)}
    assert closed_second.changed_keys == {("x",), ("y",)}
    assert list(rec.open_windows()) == []


def test_hw_before_lw_fails_the_window_and_ignores_the_late_lw() -> None:
    rec = Reconciler("src", "db")
    window = Window("w1", "d1", T)
    failed = rec.high_watermark(window, Position(10, 0))
    assert isinstance(failed, Failed) and failed.reason is FailureReason.HW_WITHOUT_LW
    late = rec.low_watermark(window, Position(20, 0))
    assert isinstance(late, Failed) and late.reason is FailureReason.DUPLICATE_LW
    assert list(rec.open_windows()) == []


def test_restart_inside_a_window_fails_it() -> None:
    window = Window("w1", "d1", T)
    Reconciler("src", "db").low_watermark(window, Position(10, 0))
    restarted = Reconciler("src", "db")
    failed = restarted.high_watermark(window, Position(20, 0))
    assert isinstance(failed, Failed) and failed.reason is FailureReason.HW_WITHOUT_LW


def test_duplicate_lw_fails_the_window() -> None:
    rec = Reconciler("src", "db")
    window = Window("w1", "d1", T)
    rec.low_watermark(window, Position(10, 0))
    failed = rec.low_watermark(window, Position(20, 0))
    assert isinstance(failed, Failed) and failed.reason is FailureReason.DUPLICATE_LW
    assert list(rec.open_windows()) == []
    again = rec.high_watermark(window, Position(30, 0))
    assert isinstance(again, Failed) and again.reason is FailureReason.DUPLICATE_HW


def test_duplicate_hw_after_close_is_reported_not_emitted_twice() -> None:
    rec = Reconciler("src", "db")
    window = Window("w1", "d1", T)
    rec.low_watermark(window, Position(10, 0))
    assert isinstance(rec.high_watermark(window, Position(20, 0)), Closed)
    again = rec.high_watermark(window, Position(30, 0))
    assert isinstance(again, Failed) and again.reason is FailureReason.DUPLICATE_HW


def test_expired_window_emits_nothing_at_a_late_hw() -> None:
    rec = Reconciler("src", "db")
    window = Window("w1", "d1", T)
    rec.low_watermark(window, Position(10, 0))
    expired = rec.expire("w1")
    assert isinstance(expired, Failed) and expired.reason is FailureReason.EXPIRED
    assert rec.expire("w1") is None
    late = rec.high_watermark(window, Position(20, 0))
    assert isinstance(late, Failed)


def test_invisible_transaction_committed_before_lw_fails_the_window() -> None:
    rec = Reconciler("src", "db")
    window = Window("w1", "d1", T)
    rec.change(change("k9", 5, txid=77))  # committed before lw, but the read did not see it
    rec.low_watermark(window, Position(10, 0))
    rec.change(change("k1", 15, txid=78))  # committed inside the window: its key is dropped
    closed = rec.high_watermark(window, Position(20, 0))
    assert isinstance(closed, Closed)
    stale = rec.chunk_events(closed, chunk(window, "k1", "k9", invisible=frozenset({77})))
    assert isinstance(stale, Failed) and stale.reason is FailureReason.STALE_READ
    fine = rec.chunk_events(closed, chunk(window, "k1", "k9", invisible=frozenset({78, 99})))
    assert isinstance(fine, list) and [e.key["k"] for e in fine] == ["k9"]


def test_a_read_whose_snapshot_ends_before_a_positional_lw_is_stale() -> None:
    """A read-only window armed when every commit below 11 was read (lw at 10): a read that saw
    exactly the commits below 11 or more is fine, one that saw only those below 10 missed
    commits the tailer had read before it armed the window."""
    for snapshot_end, stale in ((10, True), (11, False), (40, False)):
        rec = Reconciler("src", "db")
        window = Window("w1", "d1", T)
        rec.low_watermark(window, Position(10, 0))
        closed = rec.high_watermark(window, Position(41, 0))
        assert isinstance(closed, Closed)
        read = replace(chunk(window, "k1"), snapshot_end=snapshot_end)
        decided = rec.chunk_events(closed, read)
        if stale:
            assert isinstance(decided, Failed) and decided.reason is FailureReason.STALE_READ
            assert "snapshot ends at 10, before lw at 11" in decided.detail
        else:
            assert isinstance(decided, list) and [e.key["k"] for e in decided] == ["k1"]


def test_rows_of_another_window_are_refused() -> None:
    rec = Reconciler("src", "db")
    window = Window("w1", "d1", T)
    rec.low_watermark(window, Position(10, 0))
    closed = rec.high_watermark(window, Position(20, 0))
    assert isinstance(closed, Closed)
    wrong = rec.chunk_events(closed, chunk(Window("w2", "d1", T), "k1"))
    assert isinstance(wrong, Failed) and wrong.reason is FailureReason.WRONG_CHUNK


def test_a_row_without_its_key_column_is_refused_whether_or_not_keys_changed() -> None:
    for changed in (False, True):
        rec = Reconciler("src", "db")
        window = Window("w1", "d1", T)
        rec.low_watermark(window, Position(10, 0))
        if changed:
            rec.change(change("k1", 15))
        closed = rec.high_watermark(window, Position(20, 0))
        assert isinstance(closed, Closed)
        rows = ChunkRows("w1", ("k",), [{"k": "k2", "v": "x"}, {"v": "no key"}], 1)
        with pytest.raises(ValueError, match="row has no primary-key column 'k'"):
            rec.chunk_events(closed, rows)


def test_chunk_events_are_positioned_one_after_another_past_hw() -> None:
    rec = Reconciler("src", "db")
    window = Window("w1", "d1", T)
    rec.low_watermark(window, Position(10, 0))
    rec.change(change("k2", 15))
    closed = rec.high_watermark(window, Position(20, 7))
    assert isinstance(closed, Closed)
    rows = [{"v": "chunk", "k": k} for k in ("k1", "k2", "k3")]
    events = rec.chunk_events(closed, ChunkRows("w1", ("k",), rows, 3))
    assert isinstance(events, list)
    assert [e.position for e in events] == [Position(20, 8), Position(20, 9)]
    assert [e.key for e in events] == [{"k": "k1"}, {"k": "k3"}]
    assert [e.after for e in events] == [rows[0], rows[2]]
    assert all(e.after is row for e, row in zip(events, (rows[0], rows[2]), strict=True))
    expected_source = SourceInfo(
        "src", "db", "public", "t", Position(20, 8), Origin.DUMP, "d1", "w1"
    )
    assert events[0] == PlainEvent(Op.READ, {"k": "k1"}, None, rows[0], expected_source, 3)


@pytest.mark.parametrize(
    ("op", "reason"),
    [(Op.TRUNCATE, FailureReason.TRUNCATED), (Op.SCHEMA, FailureReason.SCHEMA_CHANGED)],
)
def test_a_table_level_event_fails_the_open_windows_of_its_table_only(
    op: Op, reason: FailureReason
) -> None:
    """A truncate inside a window would let chunk rows it removed come back; a schema change
    would mix columns. Either way the chunk is read again, after the event."""
    rec = Reconciler("src", "db")
    mine, mine_too, other = Window("w1", "d1", T), Window("w2", "d1", T), Window("w3", "d1", OTHER)
    for n, window in enumerate((mine, mine_too, other)):
        assert isinstance(rec.low_watermark(window, Position(10 + n, 0)), Opened)
    source = SourceInfo("src", "db", T.schema, T.name, Position(20, 0), Origin.LOG)
    schema = TableSchema((Column("k", "text", False, None),), ("k",))
    event = table_event(op, source, 2, schema if op is Op.SCHEMA else None)
    failed = rec.table_event(event)
    assert [(f.window, f.reason) for f in failed] == [(mine, reason), (mine_too, reason)]
    assert "inside the window" in failed[0].detail
    late = rec.high_watermark(mine, Position(30, 0))
    assert isinstance(late, Failed) and late.reason is FailureReason.DUPLICATE_HW
    assert isinstance(rec.high_watermark(other, Position(31, 0)), Closed)
    assert rec.table_event(event) == []


@pytest.mark.parametrize("several_tables", [False, True])
def test_log_lines_are_reconciled_as_each_of_their_events(several_tables: bool) -> None:
    """`log_lines` is `change` of each event of the run: every key of the chunk's table (a
    list one frozen) leaves the open chunk, and its transaction's commit is known to the
    stale-read check; in a run over several tables, only that table's keys do."""
    keys = [{"k": "k1"}, {"k": ["a", 1]}, {"k": "k3"}]
    other = TableRef("app", "other")

    def run(commit: int, txid: int) -> LogLines:
        origin = LogOrigin("src", "db", T, txid, 0)
        if not several_tables:
            return LogLines(origin, 1, Op.CREATE, commit, 0, 2, keys, None, keys, b"l\n" * 3)
        return LogLines(
            origin,
            1,
            Op.CREATE,
            commit,
            0,
            4,
            keys,
            None,
            keys,
            b"l\n" * 3,
            None,
            2,
            [T, other, T],
            [1, 1, 1],
        )

    window = Window("w1", "d1", T)
    outcomes = []
    for one_by_one in (True, False):
        rec = Reconciler("src", "db")
        for lines in (run(10, 7), None, run(30, 8)):
            if lines is None:
                assert isinstance(rec.low_watermark(window, Position(20, 0)), Opened)
            elif one_by_one:
                for event in lines.events():
                    rec.change(event)
            else:
                rec.log_lines(lines)
        closed = rec.high_watermark(window, Position(50, 0))
        assert isinstance(closed, Closed)
        stale = rec.chunk_events(closed, chunk(window, "k2", invisible=frozenset({7})))
        outcomes.append((closed.changed_keys, isinstance(stale, Failed) and stale.reason))
    assert outcomes[0] == outcomes[1]
    changed = {("k1",), ("k3",)} if several_tables else {("k1",), (("a", 1),), ("k3",)}
    assert outcomes[1] == (changed, FailureReason.STALE_READ)
