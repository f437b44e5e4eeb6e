"""The verify rule (`core/verify.py`) under random interleavings of source writes, the target's
applying of the log, corruptions of the target, and the verify's own steps (lw, source read, hw,
the wait for the target, its read, the close).

The model: the log is the list of writes, a write's position its index. The target applies the
log in order whenever a history says so, and corruptions write into it behind the log's back.
At the target's read, a key is corrupt if the target's row differs from the log applied so far.
The rule must name exactly the corrupt keys that are not in flux: no false difference, whatever
the interleaving, and every corruption that is still there and not in flux found. The same
histories must catch protocols that close the window at hw, skip the wait for the target, or
count the in-flux keys from hw only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.core.event import Key, Row
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.verify import (
    ChunkSum,
    Difference,
    RowsRead,
    applied_through,
    compare_chunk,
    row_hash,
    row_hashes,
    sums_verdict,
)
from tests.unit.histories import mutant_search

EXAMPLES = int(os.environ.get("DBLOG_PROPERTY_EXAMPLES", "1000"))
KEYS = range(6)

Action = tuple[str, int, object]
"""("write", key, value or None for a delete), ("apply", entries, None), ("corrupt", key, how)."""

STEPS = ("lw", "read", "hw", "target_read", "close")

actions = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.sampled_from(KEYS), st.none() | st.integers(0, 3)),
        st.tuples(st.just("apply"), st.integers(1, 4), st.none()),
        st.tuples(
            st.just("corrupt"), st.sampled_from(KEYS), st.sampled_from(["change", "drop", "add"])
        ),
    ),
    max_size=40,
)


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Action], list[int]]:
    """Actions and where the verify's five steps land among them, in order."""
    drawn: list[Action] = list(draw(actions))
    at = sorted(draw(st.lists(st.integers(0, len(drawn)), min_size=5, max_size=5)))
    return drawn, at


@dataclass(frozen=True)
class Protocol:
    """How a verify pass runs its steps; the correct one, and broken ones to be caught."""

    close_after_target_read: bool = True
    wait_for_target: bool = True
    flux_from_lw: bool = True


CORRECT = Protocol()


def row(key: int, value: object) -> Row:
    return {"id": key, "v": value}


def run(history: tuple[list[Action], list[int]], protocol: Protocol = CORRECT) -> None:
    drawn, at = history
    initial = {k: row(k, 0) for k in KEYS if k % 2 == 0}
    source: dict[Key, Row] = {(k,): r for k, r in initial.items()}
    target = dict(source)
    log: list[tuple[Key, Row | None]] = []
    applied = 0
    marks: dict[str, int] = {}
    source_read: dict[Key, str] = {}
    target_read: dict[Key, str] = {}
    rows_read: dict[str, list[Row]] = {}
    faithful_at_read: dict[Key, Row] = {}

    def apply(upto: int) -> None:
        nonlocal applied
        while applied < min(upto, len(log)):
            key, image = log[applied]
            if image is None:
                target.pop(key, None)
            else:
                target[key] = image
            applied += 1

    def step(name: str) -> None:
        nonlocal source_read, target_read, faithful_at_read
        marks[name] = len(log)  # every write below it is in the log before it
        if name == "read":
            source_read = row_hashes(source.values(), ("id",))
            rows_read["source"] = list(source.values())
        elif name == "target_read":
            if protocol.wait_for_target:
                apply(marks["hw"])  # the wait: the target has applied through hw
                assert applied_through(applied, Position(marks["hw"], 0))
            target_read = row_hashes(target.values(), ("id",))
            rows_read["target"] = list(target.values())
            faithful_at_read = replay(initial, log[:applied])

    steps = iter(zip(at, STEPS, strict=True))
    pending = next(steps, None)
    for index in range(len(drawn) + 1):
        while pending is not None and pending[0] == index:
            step(pending[1])
            pending = next(steps, None)
        if index == len(drawn):
            break
        kind, arg, value = drawn[index]
        if kind == "write":
            key = (arg,)
            image = None if value is None else row(arg, value)
            if image is None:
                source.pop(key, None)
            else:
                source[key] = image
            log.append((key, image))
        elif kind == "apply":
            apply(applied + arg)
        else:
            corrupt(target, (arg,), str(value))

    closed_at = marks["close"] if protocol.close_after_target_read else marks["hw"]
    flux_from = marks["lw"] if protocol.flux_from_lw else marks["hw"]
    in_flux = {key for position, (key, _) in enumerate(log) if flux_from <= position < closed_at}
    verdict = compare_chunk(source_read, target_read, in_flux)
    source_rows, target_rows = (RowsRead(rows_read[side], ("id",)) for side in ("source", "target"))
    assert compare_chunk(source_rows, target_rows, in_flux) == verdict, "rows as their hashes"

    corrupt_keys = {
        key
        for key in {*faithful_at_read, *target_read}
        if key not in in_flux
        and (None if key not in faithful_at_read else row_hash(faithful_at_read[key]))
        != target_read.get(key)
    }
    by_sums = sums_verdict(summed(source_read), summed(target_read))
    if by_sums is not None:  # equal sums: the chunk is equal, keys in flux included
        assert not corrupt_keys, f"equal sums hid {sorted(corrupt_keys)}"
        assert by_sums.checked == len({*source_read, *target_read})
    found = {key for key, _ in verdict.differences}
    assert found <= corrupt_keys, f"false differences: {sorted(found - corrupt_keys)}"
    assert found == corrupt_keys, f"corruptions not found: {sorted(corrupt_keys - found)}"
    for key, how in verdict.differences:
        expected = (
            Difference.EXTRA
            if key not in faithful_at_read
            else Difference.MISSING
            if key not in target_read
            else Difference.CHANGED
        )
        assert how is expected, (key, how)
    judged = {*source_read, *target_read}
    assert verdict.checked == len(judged - in_flux)
    assert verdict.in_flux == len(judged & in_flux)


def summed(hashes: dict[Key, str]) -> ChunkSum:
    """A side's read summed as a database sums it: its rows' hashes, in no order."""
    return ChunkSum(len(hashes), (("id", "int"), ("v", "text")), repr(sorted(hashes.items())))


def replay(initial: dict[int, Row], log: list[tuple[Key, Row | None]]) -> dict[Key, Row]:
    state: dict[Key, Row] = {(k,): r for k, r in initial.items()}
    for key, image in log:
        if image is None:
            state.pop(key, None)
        else:
            state[key] = image
    return state


def corrupt(target: dict[Key, Row], key: Key, how: str) -> None:
    """Write into the target behind the log's back: change a row, drop one, add one."""
    if how == "change" and key in target:
        target[key] = {**target[key], "v": "corrupt"}
    elif how == "drop":
        target.pop(key, None)
    elif how == "add" and key not in target:
        target[key] = row(key[0], "extra")


@settings(max_examples=EXAMPLES, deadline=None)
@given(histories())
def test_no_false_difference_and_every_corruption_found(
    history: tuple[list[Action], list[int]],
) -> None:
    run(history)


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(Protocol(close_after_target_read=False), id="closes-at-hw"),
        pytest.param(Protocol(wait_for_target=False), id="no-wait-for-target"),
        pytest.param(Protocol(flux_from_lw=False), id="flux-from-hw"),
    ],
)
def test_broken_protocols_are_caught(broken: Protocol) -> None:
    @mutant_search(3000)
    @given(histories())
    def broken_run(history: tuple[list[Action], list[int]]) -> None:
        run(history, broken)

    with pytest.raises(AssertionError, match="false differences"):
        broken_run()


def test_each_kind_of_corruption_is_named_by_key() -> None:
    """A quiet source, a target with one row changed, one dropped, one added."""
    source = {(1,): row_hash(row(1, 0)), (2,): row_hash(row(2, 0)), (3,): row_hash(row(3, 0))}
    target = {(1,): row_hash(row(1, 9)), (3,): source[(3,)], (4,): row_hash(row(4, 0))}
    verdict = compare_chunk(source, target, frozenset({(5,)}))
    assert verdict.differences == (
        ((1,), Difference.CHANGED),
        ((2,), Difference.MISSING),
        ((4,), Difference.EXTRA),
    )
    assert (verdict.checked, verdict.in_flux) == (4, 0)
    assert [verdict.count(kind) for kind in Difference] == [1, 1, 1]


def test_a_key_in_flux_is_skipped_and_counted() -> None:
    source = {(1,): row_hash(row(1, 0))}
    target = {(1,): row_hash(row(1, 1)), (2,): row_hash(row(2, 0))}
    verdict = compare_chunk(source, target, frozenset({(1,), (2,)}))
    assert (verdict.checked, verdict.in_flux, verdict.differences) == (0, 2, ())


def test_row_hash_is_the_canonical_json_whatever_the_column_order() -> None:
    assert row_hash({"a": 1, "b": "x"}) == row_hash({"b": "x", "a": 1})
    assert row_hash({"a": 1, "b": "x"}) != row_hash({"a": 1, "b": "y"})
    assert row_hash({"a": 1}) != row_hash({"a": "1"})
