"""Two reads compared as rows (`core.verify.RowsRead`) give the verdict their row hashes give
(`compare_chunk` of `row_hashes`), whatever the rows: equal or not, in the same order or not,
columns in another order, and values `==` and JSON disagree on (`True`, `1` and `1.0`; `-0.0`
and `0.0`; NaN)."""

from __future__ import annotations

import os
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.core.event import Row
from airflow_provider_dblog.core.verify import (
    ChunkSum,
    ChunkVerdict,
    Difference,
    RowsRead,
    compare_chunk,
    row_hash,
    row_hashes,
    sums_verdict,
)

EXAMPLES = int(os.environ.get("DBLOG_PROPERTY_EXAMPLES", "1000"))
KEY = ("id",)

scalars = st.sampled_from([None, True, False, 0, 1, 1.0, 0.0, -0.0, float("nan"), "1", "", "é"])
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=2),
    st.dictionaries(st.sampled_from("ab"), scalars, max_size=2),
)
rows_of = st.dictionaries(st.integers(0, 7), st.tuples(values, values), max_size=8)


def rows(drawn: dict[int, tuple[object, object]], *, reorder: bool = False) -> list[Row]:
    """Rows keyed by `id`, in key order; columns `a` and `b` before the key when reordered."""
    made: list[Row] = []
    for key in sorted(drawn):
        a, b = drawn[key]
        row: Row = {"a": a, "b": b, "id": key} if reorder else {"id": key, "a": a, "b": b}
        made.append(row)
    return made


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    source=rows_of,
    target=rows_of,
    copied=st.sets(st.integers(0, 7)),
    flux=st.sets(st.integers(0, 9)),
    reorder=st.booleans(),
    reverse=st.booleans(),
)
def test_rows_compare_as_their_hashes(
    source: dict[int, tuple[object, object]],
    target: dict[int, tuple[object, object]],
    copied: set[int],
    flux: set[int],
    reorder: bool,
    reverse: bool,
) -> None:
    # Some keys of the target hold the source's row, so that most chunks have equal rows.
    target = {**target, **{k: source[k] for k in copied if k in source}}
    ours, theirs = rows(source), rows(target, reorder=reorder)
    if reverse:
        theirs.reverse()
    in_flux = frozenset((k,) for k in flux)
    expected = compare_chunk(row_hashes(ours, KEY), row_hashes(theirs, KEY), in_flux)
    assert compare_chunk(RowsRead(ours, KEY), RowsRead(theirs, KEY), in_flux) == expected


@settings(max_examples=EXAMPLES, deadline=None)
@given(source=rows_of, flux=st.sets(st.integers(0, 9)))
def test_an_equal_read_is_judged_without_differences(
    source: dict[int, tuple[object, object]], flux: set[int]
) -> None:
    ours = rows(source)
    in_flux = frozenset((k,) for k in flux)
    verdict = compare_chunk(RowsRead(ours, KEY), RowsRead(rows(source), KEY), in_flux)
    assert verdict.differences == ()
    assert verdict.in_flux == len(source.keys() & flux)
    assert verdict.checked == len(source.keys() - flux)


def test_values_equal_in_python_but_not_in_json_differ() -> None:
    source: list[Row] = [
        {"id": 1, "v": True},
        {"id": 2, "v": 0.0},
        {"id": 3, "v": 1},
        {"id": 4, "v": [1]},
    ]
    target: list[Row] = [
        {"id": 1, "v": 1},
        {"id": 2, "v": -0.0},
        {"id": 3, "v": 1.0},
        {"id": 4, "v": [1]},
    ]
    assert source == target, "the case: == calls them equal"
    verdict = compare_chunk(RowsRead(source, KEY), RowsRead(target, KEY), frozenset())
    changed = [((k,), Difference.CHANGED) for k in (1, 2, 3)]
    assert verdict.differences == tuple(changed)
    assert verdict.checked == 4


def test_nan_is_equal_as_json_says() -> None:
    source = [{"id": 1, "v": float("nan")}]
    target = [{"id": 1, "v": float("nan")}]
    verdict = compare_chunk(RowsRead(source, KEY), RowsRead(target, KEY), frozenset())
    assert (verdict.checked, verdict.differences) == (1, ())


def test_rows_read_is_the_mapping_of_its_hashes() -> None:
    read = RowsRead([{"id": 2, "v": "x"}, {"id": 1, "v": "y"}], KEY)
    assert list(read) == [(2,), (1,)]
    assert dict(read) == {(2,): row_hash({"id": 2, "v": "x"}), (1,): row_hash({"v": "y", "id": 1})}
    assert (1,) in read and (3,) not in read and len(read) == 2


def test_two_sums_judge_a_chunk_equal_only_when_rows_columns_and_digest_agree() -> None:
    summed = ChunkSum(3, (("id", "bigint"), ("name", "text")), "12:34")
    assert sums_verdict(summed, replace(summed)) == ChunkVerdict(3, 0, ())
    for other in (
        replace(summed, rows=2),
        replace(summed, digest="12:35"),
        replace(summed, columns=(("id", "integer"), ("name", "text"))),
    ):
        assert sums_verdict(summed, other) is None
