"""A verify request survives the store: keys of every shape come back as the tuples the
source normalised, bounds and filter included."""

from __future__ import annotations

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.verify.request import VerifyRequest

ORDERS = TableRef("public", "orders")


def test_a_request_comes_back_from_its_json_as_it_was() -> None:
    request = VerifyRequest(
        "v1",
        (ORDERS,),
        {ORDERS: ("region", "n")},
        "output",
        500,
        keys=(("eu", 1), ("us", 2)),
        where="amount > 1",
        after=None,
        upto=("zz", 9),
        read_only=True,
        parallelism=4,
    )
    assert VerifyRequest.from_json("v1", request.to_json()) == request
    assert request.describe() == (
        "public.orders (2 keys) (key <= ['zz', 9]) where amount > 1 against output"
    )


def test_a_request_of_every_table_has_no_keys_and_no_bounds() -> None:
    request = VerifyRequest("v2", (ORDERS,), {ORDERS: ("region", "n")}, "output", 10)
    back = VerifyRequest.from_json("v2", request.to_json())
    assert (back.keys, back.after, back.upto, back.where) == (None, None, None, None)


def test_a_request_stored_without_parallelism_runs_one_chunk_at_a_time() -> None:
    request = VerifyRequest("v3", (ORDERS,), {ORDERS: ("region", "n")}, "output", 10)
    stored = {k: v for k, v in request.to_json().items() if k != "parallelism"}
    assert VerifyRequest.from_json("v3", stored).parallelism == 1
