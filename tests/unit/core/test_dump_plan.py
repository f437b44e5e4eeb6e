"""Dump planning: requests, key lists, chunk bounds and resumable progress."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from airflow_provider_dblog.core.dump_plan import (
    DumpKind,
    DumpRequest,
    TablePlanner,
    TableProgress,
    coerce_keys,
    estimated_fraction,
    key_example,
    key_items,
    shaped_keys,
)
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import Key, TableRef

pytestmark = pytest.mark.unit

T = TableRef("public", "t")


def parse_keys(
    text: str,
    columns: tuple[str, ...],
    table: TableRef,
    sample_key: Callable[[], Key | None] = lambda: None,
) -> tuple[Key, ...]:
    """A key list as a person types it, parsed and checked against the key's columns."""
    return coerce_keys(key_items(text, columns, table, sample_key), columns, table)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk_size": 0}, "chunk_size must be at least 1"),
        ({"chunk_size": True}, "chunk_size must be an integer"),
        ({"parallelism": 0}, "parallelism must be at least 1"),
        ({"tables": ()}, "names no table"),
        ({"tables": (T, T), "kind": DumpKind.ALL}, "names a table twice"),
        ({"kind": DumpKind.KEYS}, "needs at least one key"),
        ({"keys": ((1,),)}, "takes no keys"),
        ({"tables": (T, TableRef("public", "u"))}, "takes exactly one table"),
        ({"where": " "}, "non-empty condition"),
        ({"where": 1}, "non-empty condition"),
        ({"kind": DumpKind.ALL, "where": "n > 1"}, "dump of one table"),
        ({"kind": DumpKind.KEYS, "keys": ((1,),), "where": "n > 1"}, "not to a dump of given"),
    ],
)
def test_invalid_requests_name_the_problem(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"dump_id": "d", "kind": DumpKind.TABLE, "tables": (T,)}
    fields.update(kwargs)
    with pytest.raises(InvalidRequest, match=message):
        DumpRequest(**fields)  # type: ignore[arg-type]


def test_parse_keys_forms() -> None:
    assert parse_keys("1, 2,3", ("id",), T) == (("1",), ("2",), ("3",))
    assert parse_keys("[1, 2, 2]", ("id",), T) == ((1,), (2,))
    assert parse_keys('[["eu", 1], {"n": 2, "region": "us"}]', ("region", "n"), T) == (
        ("eu", 1),
        ("us", 2),
    )


@pytest.mark.parametrize(
    ("text", "columns", "message"),
    [
        ("", ("id",), "is empty"),
        ("[1,", ("id",), "not valid JSON"),
        ('{"a": 1}', ("id",), "composite|JSON array"),
        ("1,2", ("region", "n"), "composite primary key"),
        ('[["eu"]]', ("region", "n"), r"key #1 .* has 1 value\(s\)"),
        ('[{"region": "eu"}]', ("region", "n"), "names columns"),
        ("[1, null]", ("id",), "key #2 .* empty value"),
        ("1,,2", ("id",), "key #2 .* empty value"),
    ],
)
def test_malformed_key_lists_are_refused(text: str, columns: tuple[str, ...], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        parse_keys(text, columns, T)


def test_every_malformed_key_of_a_list_is_named_at_once() -> None:
    text = '[["eu"], ["us", 1], {"region": "eu"}, ["eu", null], ' + '["x"], ' * 3 + '["y"]]'
    with pytest.raises(InvalidRequest) as refused:
        parse_keys(text, ("region", "n"), T)
    message = str(refused.value)
    assert message.startswith("key #1 of public.t has 1 value(s)"), message
    assert "key #3 of public.t names columns ['region']" in message
    assert "key #4 of public.t has an empty value" in message
    assert "key #2" not in message and message.endswith("; and 2 more"), message


def test_the_keys_that_fit_are_kept_for_further_checks_beside_the_problems() -> None:
    keys, problems = shaped_keys([["eu", 7], ["us"], ["eu", "x"], {"n": 1}], ("region", "n"), T)
    assert keys == {1: ("eu", 7), 3: ("eu", "x")}
    assert problems == {
        2: "key #2 of public.t has 1 value(s), the primary key (region, n) has 2",
        4: "key #4 of public.t names columns ['n'], the primary key is (region, n)",
    }


def test_the_composite_key_example_follows_the_key_order_and_types() -> None:
    """Shaped like a key of the table (asked for only when refusing), never its values."""
    with pytest.raises(InvalidRequest) as refused:
        parse_keys("eu,1", ("region", "n"), T, lambda: ("secret-region", 981))
    assert str(refused.value) == (
        "public.t has a composite primary key (region, n): give the keys as JSON, one list "
        'per key in that order, e.g. [["a", 1], ["b", 2]]'
    )
    assert key_example(("n", "region"), (981, "x")) == '[[1, "a"], [2, "b"]]'
    assert key_example(("at", "ok", "x"), ("2026-01-01", True, 1.25)) == (
        '[["a", true, 1.5], ["b", false, 2.5]]'
    )
    assert key_example(("region", "n"), None) == "[[<region>, <n>], ...]"


def test_sequential_range_chunks_walk_to_the_captured_max_key() -> None:
    planner = TablePlanner(TableProgress(T), chunk_size=2)
    assert planner.needs_max_key
    planner.begin((5,))
    (first,) = planner.next_chunks(1)
    assert (first.after, first.upto, first.limit) == (None, (5,), 2)
    assert planner.next_chunks(1) == []  # one LIMIT chunk at a time
    planner.complete(first, 2, (2,))
    assert planner.progress.after == (2,) and not planner.done
    (second,) = planner.next_chunks(1)
    assert second.after == (2,)
    planner.complete(second, 2, (5,))  # reached the max key: done without an empty chunk
    assert planner.done and planner.progress.rows_done == 4


def test_bounded_chunks_have_an_end_even_one_at_a_time() -> None:
    """The Spark dump splits each chunk across tasks, so it needs the chunk's end first: no
    LIMIT chunks, and fewer rows than the chunk size (deletes) never end the table early."""
    planner = TablePlanner(TableProgress(T), chunk_size=2, bounded=True)
    planner.begin((5,))
    assert planner.split_keys_wanted(1) == 1
    (first,) = planner.next_chunks(1, [(2,)])
    assert (first.after, first.upto, first.limit) == (None, (2,), None)
    planner.complete(first, 0, None)  # its rows were deleted meanwhile
    assert planner.progress.after == (2,) and not planner.done
    (last,) = planner.next_chunks(1, [])  # no split key left: the rest up to the max key
    assert (last.after, last.upto) == ((2,), (5,))
    planner.complete(last, 3, None)
    assert planner.done and planner.progress.rows_done == 3


def test_a_filter_travels_with_every_chunk_whose_bounds_stay_the_keys() -> None:
    """A filter narrows each chunk; it never drives the paging: every range chunk is bounded
    by split keys (from the key alone), even one at a time, so a chunk ends at its bound,
    however few of its rows match."""
    planner = TablePlanner(TableProgress(T), chunk_size=2, where="n > 1")
    planner.begin((9,))
    assert planner.bounded and planner.split_keys_wanted(1) == 1
    (first,) = planner.next_chunks(1, [(3,)])
    assert (first.after, first.upto, first.limit, first.where) == (None, (3,), None, "n > 1")
    planner.complete(first, 0, None)  # no row of (.., 3] matched
    assert planner.progress.after == (3,) and not planner.done
    (last,) = planner.next_chunks(1, [])
    assert (last.after, last.upto, last.where) == ((3,), (9,), "n > 1")


def test_empty_table_is_done_at_once() -> None:
    planner = TablePlanner(TableProgress(T), chunk_size=10)
    planner.begin(None)
    assert planner.done and planner.next_chunks(3) == []


def test_parallel_chunks_use_split_keys_and_progress_has_no_gap() -> None:
    planner = TablePlanner(TableProgress(T), chunk_size=10)
    planner.begin((100,))
    assert planner.split_keys_wanted(3) == 3
    chunks = planner.next_chunks(3, [(10,), (20,), (30,)])
    assert [(c.after, c.upto, c.limit) for c in chunks] == [
        (None, (10,), None),
        ((10,), (20,), None),
        ((20,), (30,), None),
    ]
    planner.complete(chunks[1], 10, (20,))
    assert planner.progress.after is None  # chunk 0 is still in flight
    planner.complete(chunks[0], 10, (10,))
    assert planner.progress.after == (20,)
    assert planner.split_keys_wanted(3) == 2
    rest = planner.next_chunks(3, [(40,)])  # fewer split keys than asked: the end is near
    assert [(c.after, c.upto) for c in rest] == [((30,), (40,)), ((40,), (100,))]
    assert planner.split_keys_wanted(3) == 0
    for chunk in (chunks[2], *rest):
        planner.complete(chunk, 5, chunk.upto)
    assert planner.done and planner.progress.after == (100,)


def test_resume_from_progress_rereads_only_unfinished_chunks() -> None:
    planner = TablePlanner(TableProgress(T), chunk_size=10)
    planner.begin((100,))
    chunks = planner.next_chunks(2, [(10,), (20,)])
    planner.complete(chunks[0], 10, (10,))
    saved = TableProgress.from_json(planner.progress.to_json())
    resumed = TablePlanner(saved, chunk_size=10)
    assert not resumed.needs_max_key
    (again,) = resumed.next_chunks(1)
    assert again.after == (10,) and again.upto == (100,)


def test_key_chunks_and_their_progress() -> None:
    keys = tuple((k,) for k in range(5))
    planner = TablePlanner(TableProgress(T), chunk_size=2, keys=keys)
    assert not planner.needs_max_key
    chunks = planner.next_chunks(2)
    assert [c.keys for c in chunks] == [keys[0:2], keys[2:4]]
    planner.complete(chunks[1], 2, None)
    assert planner.progress.key_index == 0
    planner.complete(chunks[0], 2, None)
    assert planner.progress.key_index == 4
    (last,) = planner.next_chunks(2)
    planner.complete(last, 1, None)
    assert planner.done


def test_completing_a_chunk_twice_is_refused() -> None:
    planner = TablePlanner(TableProgress(T), chunk_size=2)
    planner.begin((5,))
    (chunk,) = planner.next_chunks(1)
    planner.complete(chunk, 1, (1,))
    with pytest.raises(InvalidRequest, match="not in flight"):
        planner.complete(chunk, 1, (1,))


def test_fraction_is_known_when_done_not_started_or_by_keys() -> None:
    assert estimated_fraction(TableProgress(T, started=True, done=True), 0, None) == 1.0
    assert estimated_fraction(TableProgress(T), 0, None) == 0.0
    assert estimated_fraction(TableProgress(T, started=True, key_index=3), 4, None) == 0.75


def test_fraction_of_an_integer_key_is_estimated_from_the_rows_met_per_key() -> None:
    progress = TableProgress(T, started=True, max_key=(1000,), after=(400,), rows_done=300)
    # Seen first at key 200 with 100 rows: 1 row per key since, so 600 keys are 600 rows left.
    assert estimated_fraction(progress, 0, (200, 100)) == 300 / 900
    assert estimated_fraction(progress, 0, (400, 300)) is None  # no step seen since
    assert estimated_fraction(progress, 0, None) is None
    text_key = TableProgress(T, started=True, max_key=("z",), after=("m",), rows_done=5)
    assert estimated_fraction(text_key, 0, (1, 1)) is None
    flag_key = TableProgress(T, started=True, max_key=(True,), after=(False,), rows_done=5)
    assert estimated_fraction(flag_key, 0, (0, 0)) is None
