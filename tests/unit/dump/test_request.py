"""The key list of a request, checked: every bad key named in one refusal, those that do not
fit the key's columns and those whose values the source refuses, with few queries to the
source when a long list holds a few bad keys."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import pytest

from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import Key, TableRef
from airflow_provider_dblog.dump.request import checked_keys
from airflow_provider_dblog.sources.base import ChunkSource, InvalidKey

pytestmark = pytest.mark.unit
ORDERS = TableRef("public", "orders")
COLUMNS = ("region", "n")


class IntegerN:
    """A source whose `n` column takes whole numbers: it names the first value it refuses in
    a list, as `ChunkSource.check_keys` does, and normalises "7" to 7."""

    def __init__(self) -> None:
        self.checks = 0

    def check_keys(self, table: TableRef, keys: Sequence[Key]) -> tuple[Key, ...]:
        self.checks += 1
        for _, n in keys:
            if not str(n).isdigit():
                raise InvalidKey(
                    f"key value {n!r} is not a valid integer for column n of {table}: bad"
                )
        return tuple(dict.fromkeys((region, int(str(n))) for region, n in keys))

    def max_key(self, table: TableRef) -> Key | None:
        return ("eu", 1)


def check(source: IntegerN, keys: str | Sequence[object]) -> tuple[Key, ...]:
    return checked_keys(cast(ChunkSource, source), ORDERS, keys, COLUMNS)


def test_every_bad_key_is_named_in_one_refusal() -> None:
    with pytest.raises(InvalidRequest) as refused:
        check(IntegerN(), '[["eu", 7], ["us"], ["eu", "x"]]')
    assert str(refused.value) == (
        "key #2 of public.orders has 1 value(s), the primary key (region, n) has 2; "
        "key #3: key value 'x' is not a valid integer for column n of public.orders: bad"
    )


def test_a_few_bad_values_among_many_keys_cost_a_few_checks() -> None:
    source = IntegerN()
    keys: list[object] = [["eu", n] for n in range(1000)]
    keys[10], keys[700] = ["eu", "ten"], ["us", "-1"]
    with pytest.raises(InvalidRequest) as refused:
        check(source, keys)
    message = str(refused.value)
    assert message.startswith("key #11: key value 'ten' is not a valid integer"), message
    assert "; key #701: key value '-1' is not a valid integer" in message
    assert source.checks <= 2 + 2 * 2 * 10, source.checks  # halves down to each bad key


def test_good_keys_come_back_as_the_source_normalised_them() -> None:
    source = IntegerN()
    keys = check(source, [["eu", "7"], {"n": 7, "region": "eu"}, ["us", 1]])
    assert keys == (("eu", 7), ("us", 1))
    assert source.checks == 1
