"""A run of log lines (`LogLines`) cut into parts and trimmed after a replay's end keeps each
line with its own event, whatever the seqs' step (a binlog rows event's are consecutive, a
pgoutput run's two apart), with mixed operations and tables; so do the runs of several
transactions (`LogRuns`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_dblog.core.event import EncodedLogEvent, LogOrigin, Op, TableRef
from airflow_provider_dblog.core.event_codec import encode, log_line_format
from airflow_provider_dblog.core.lines import LogLines, LogRuns
from airflow_provider_dblog.core.position import Position

pytestmark = pytest.mark.unit

ORIGIN = LogOrigin("src", "db", TableRef("app", "t"), 7, 1_700_000_000_000)
OTHER = LogOrigin("src", "db", TableRef("app", "other"), 7, 1_700_000_000_000)
VERSIONS = {ORIGIN.table: 1, OTHER.table: 3}
COMMIT = 0x500
BEFORE: dict[Op, bool] = {Op.CREATE: False, Op.UPDATE: True, Op.DELETE: True}
AFTER: dict[Op, bool] = {Op.CREATE: True, Op.UPDATE: True, Op.DELETE: False}


def run_of(
    ops: list[Op], first: int, step: int, several_tables: bool = False, commit: int = COMMIT
) -> LogLines:
    """A run of `ops` at seqs `first`, `first + step`, ..., each line `encode`'s for its event;
    every other change of another table if `several_tables`."""
    keys = [{"id": i} for i in range(len(ops))]
    befores = [{"id": i, "v": "old"} if BEFORE[op] else None for i, op in enumerate(ops)]
    afters = [{"id": i, "v": "new"} if AFTER[op] else None for i, op in enumerate(ops)]
    origins = [OTHER if several_tables and i % 2 else ORIGIN for i in range(len(ops))]
    data = b"".join(
        log_line_format(op, origin.name, origin.db, origin.table)
        % (
            b'{"id":%d}' % i,
            b'{"id":%d,"v":"old"}' % i if BEFORE[op] else b"null",
            b'{"id":%d,"v":"new"}' % i if AFTER[op] else b"null",
            commit,
            first + i * step,
            origin.txid_json,
            origin.ts_ms,
            VERSIONS[origin.table],
        )
        for i, (op, origin) in enumerate(zip(ops, origins, strict=True))
    )
    mixed, several = len(set(ops)) > 1, len(set(origins)) > 1
    return LogLines(
        ORIGIN,
        1,
        ops[0],
        commit,
        first,
        first + (len(ops) - 1) * step,
        keys,
        befores if any(b is not None for b in befores) else None,
        afters if any(a is not None for a in afters) else None,
        data,
        ops if mixed else None,
        step,
        [origin.table for origin in origins] if several else None,
        [VERSIONS[o.table] for o in origins] if several else None,
    )


def check(lines: LogLines) -> list[EncodedLogEvent]:
    """Its events, each carrying the line `encode` gives it, at seqs `step` apart."""
    events = lines.events()
    assert len(events) == len(lines)
    assert [e.position for e in events] == [
        Position(lines.commit, seq) for seq in range(lines.first, lines.last + 1, lines.step)
    ]
    for event in events:
        assert isinstance(event, EncodedLogEvent)
        assert event.line == (encode(event) + "\n").encode()
    assert b"".join(e.line for e in events if isinstance(e, EncodedLogEvent)) == lines.data
    return [e for e in events if isinstance(e, EncodedLogEvent)]


RUNS = st.tuples(
    st.lists(st.sampled_from([Op.CREATE, Op.UPDATE, Op.DELETE]), min_size=1, max_size=8),
    st.integers(0, 50),
    st.sampled_from([1, 2]),
    st.booleans(),
)


@given(RUNS, st.integers(0, 4000))
def test_a_cut_run_is_its_events_in_two_parts(
    run: tuple[list[Op], int, int, bool], size: int
) -> None:
    lines = run_of(*run)
    whole = check(lines)
    fits, rest = lines.cut(size)
    parts = check(fits) + (check(rest) if rest is not None else [])
    assert parts == whole
    assert len(fits.data) <= size or len(fits) == 1


@given(RUNS, st.integers(0, 70), st.integers(-1, 1))
def test_the_lines_after_a_replays_end_are_the_events_after_it(
    run: tuple[list[Op], int, int, bool], seq: int, commit_offset: int
) -> None:
    lines = run_of(*run)
    whole = check(lines)
    end = Position(COMMIT + commit_offset, seq)
    rest = lines.after(end)
    expected = [e for e in whole if e.position > end]
    assert (check(rest) if rest is not None else []) == expected


TRANSACTIONS = st.lists(RUNS, min_size=1, max_size=5)


def runs_of(transactions: list[tuple[list[Op], int, int, bool]]) -> LogRuns:
    """A run of each transaction, their commits 0x100 apart."""
    return LogRuns.of(
        [run_of(*run, commit=COMMIT + 0x100 * i) for i, run in enumerate(transactions)]
    )


def check_runs(lines: LogRuns) -> list[EncodedLogEvent]:
    """Its runs' events, in order, each with its line."""
    events = [event for run in lines.runs for event in check(run)]
    assert lines.events() == events
    assert lines.data == b"".join(e.line for e in events) and len(lines) == len(events)
    assert (lines.first_position, lines.last_position) == (events[0].position, events[-1].position)
    return events


@given(TRANSACTIONS, st.integers(0, 8000))
def test_cut_runs_are_their_events_in_two_parts(
    transactions: list[tuple[list[Op], int, int, bool]], size: int
) -> None:
    lines = runs_of(transactions)
    whole = check_runs(lines)
    fits, rest = lines.cut(size)
    assert check_runs(fits) + (check_runs(rest) if rest is not None else []) == whole
    assert len(fits.data) <= size or len(fits) == 1


@given(TRANSACTIONS, st.integers(0, 5), st.integers(-1, 1), st.integers(0, 70))
def test_the_runs_after_a_replays_end_are_the_events_after_it(
    transactions: list[tuple[list[Op], int, int, bool]], index: int, offset: int, seq: int
) -> None:
    lines = runs_of(transactions)
    whole = check_runs(lines)
    end = Position(COMMIT + 0x100 * index + offset, seq)
    rest = lines.after(end)
    assert (check_runs(rest) if rest is not None else []) == [e for e in whole if e.position > end]
    assert rest is lines or rest is None or whole[0].position <= end
