"""What the dump operators take from params and templates: the dump id of a task instance,
counts, lists and filters as forms and templates give them, refused with the param's name."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_dblog.operators.request import (
    default_dump_id,
    dump_id_for,
    flag,
    non_negative,
    optional_filter,
    optional_list,
    positive_int,
)


def test_a_task_instance_dump_id_joins_its_ids_and_replaces_the_unusual() -> None:
    assert dump_id_for("dblog_dump", "manual__2026-01-01T00:00:00+00:00", "dump") == (
        "dblog_dump.manual__2026-01-01T00_00_00_00_00.dump"
    )
    assert dump_id_for("d", "r", "t", map_index=3) == "d.r.t.3"
    assert dump_id_for("d", "r", "t", map_index=-1) == "d.r.t"
    assert dump_id_for("d a", "r/b", "t") == "d_a.r_b.t"


def test_every_try_of_a_task_instance_gets_the_same_dump_id() -> None:
    first = SimpleNamespace(dag_id="d", run_id="r 1", task_id="t", map_index=-1, try_number=1)
    retry = SimpleNamespace(dag_id="d", run_id="r 1", task_id="t", map_index=-1, try_number=2)
    assert default_dump_id({"ti": first}) == default_dump_id({"ti": retry}) == "d.r_1.t"  # type: ignore[typeddict-item]
    mapped = SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=0)
    assert default_dump_id({"ti": mapped}) == "d.r.t.0"  # type: ignore[typeddict-item]


@pytest.mark.parametrize(("value", "number"), [(1, 1), ("1000", 1000), (" 7 ", 7)])
def test_positive_int_takes_numbers_and_their_text(value: Any, number: int) -> None:
    assert positive_int("chunk_size", value) == number


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "chunk_size must be a whole number of at least 1, got 0"),
        ("-3", "chunk_size must be a whole number of at least 1, got '-3'"),
        (2.5, "chunk_size must be a whole number of at least 1, got 2.5"),
        ("two", "chunk_size must be a whole number, got 'two'"),
        (None, "chunk_size must be a whole number, got None"),
    ],
)
def test_positive_int_refuses_the_rest_naming_the_param(value: Any, message: str) -> None:
    with pytest.raises(AirflowFailException) as refused:
        positive_int("chunk_size", value)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("value", "listed"),
    [
        (None, None),
        ("", None),
        ([], None),
        ("public.accounts", ["public.accounts"]),
        (("a", "b"), ["a", "b"]),
        ([1, [2, 3]], [1, [2, 3]]),
    ],
)
def test_optional_list_reads_an_empty_form_field_as_not_given(value: Any, listed: Any) -> None:
    assert optional_list("tables", value) == listed


def test_optional_list_refuses_what_is_no_list_naming_the_param() -> None:
    with pytest.raises(AirflowFailException, match="tables must be a list, got 5"):
        optional_list("tables", 5)


@pytest.mark.parametrize(
    ("value", "whole", "number"),
    [(0, True, 0), (" 250 ", True, 250), ("0.5", False, 0.5), (3, False, 3.0)],
)
def test_non_negative_takes_zero_and_up(value: Any, whole: bool, number: float) -> None:
    assert non_negative("delay_ms", value, whole=whole) == number


@pytest.mark.parametrize(
    ("value", "whole"),
    [(-1, True), ("1.5", True), (True, True), ("nan", False), ("inf", False), ("-0.1", False),
     (None, False), ("fast", False)],
)  # fmt: skip
def test_non_negative_refuses_the_rest_naming_the_param(value: Any, whole: bool) -> None:
    with pytest.raises(AirflowFailException, match=r"^delay_ms must be a"):
        non_negative("delay_ms", value, whole=whole)


@pytest.mark.parametrize(
    ("value", "where"),
    [(None, None), ("", None), ("  \n", None), ("active", "active"), (" n > 1 ", " n > 1 ")],
)
def test_optional_filter_reads_a_blank_form_field_as_no_filter(value: Any, where: Any) -> None:
    """The text is the source's to trim and judge (`ChunkSource.check_filter`)."""
    assert optional_filter(value) == where


@pytest.mark.parametrize("value", [True, 5, ["active"], {"active": True}])
def test_optional_filter_refuses_what_is_no_text_naming_the_param(value: Any) -> None:
    with pytest.raises(AirflowFailException, match=r"^where must be a condition .* as text"):
        optional_filter(value)


@pytest.mark.parametrize(
    ("value", "on"),
    [(True, True), (False, False), ("true", True), (" False ", False), (None, False)],
)
def test_flag_takes_a_bool_or_its_text_and_none_is_off(value: Any, on: bool) -> None:
    assert flag("read_only", value) is on


@pytest.mark.parametrize("value", [1, "yes", "", ["true"]])
def test_flag_refuses_the_rest_naming_the_param(value: Any) -> None:
    with pytest.raises(AirflowFailException, match=r"^read_only must be true or false, got"):
        flag("read_only", value)
