"""A dump request as Redis stores it: what `DumpStore.create` writes is what a resume, the
Spark driver and the live view read back (`stored_dump_from`), every field of it; its chunk
size is the controls' (the one place it is stored)."""

from __future__ import annotations

import json

import pytest

from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.state.dumps import _request_to_json, stored_dump_from

ORDERS = TableRef("public", "orders")


def stored(request: DumpRequest) -> str:
    return json.dumps({"request": _request_to_json(request), "key_columns": {}})


@pytest.mark.parametrize("read_only", [True, False])
def test_a_request_reads_back_whole_read_only_or_not(read_only: bool) -> None:
    request = DumpRequest(
        "d", DumpKind.TABLE, (ORDERS,), chunk_size=7, parallelism=2, mode=DumpMode.SEQUENCED,
        where="n > 1", read_only=read_only,
    )  # fmt: skip
    back = stored_dump_from(stored(request), b"7")
    assert back is not None and back.request == request
    assert back.request.read_only is read_only


def test_a_request_stored_before_read_only_existed_reads_back_writing() -> None:
    data = json.loads(stored(DumpRequest("old", DumpKind.TABLE, (ORDERS,), read_only=True)))
    del data["request"]["read_only"]
    back = stored_dump_from(json.dumps(data), b"1000")
    assert back is not None and back.request.read_only is False


def test_the_chunk_size_is_stored_in_the_controls_only() -> None:
    request = DumpRequest("d", DumpKind.TABLE, (ORDERS,), chunk_size=7)
    assert "chunk_size" not in json.loads(stored(request))["request"]
    back = stored_dump_from(stored(request), b"300")  # a throttle changed it
    assert back is not None and back.request.chunk_size == 300


def test_a_request_stored_with_its_chunk_size_reads_the_controls_first() -> None:
    data = json.loads(stored(DumpRequest("old", DumpKind.TABLE, (ORDERS,))))
    data["request"]["chunk_size"] = 50
    back = stored_dump_from(json.dumps(data), "80")
    assert back is not None and back.request.chunk_size == 80
    alone = stored_dump_from(json.dumps(data), None)
    assert alone is not None and alone.request.chunk_size == 50


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_read_only_is_a_bool_or_refused_by_name(value: object) -> None:
    with pytest.raises(InvalidRequest, match=r"^read_only must be true or false"):
        DumpRequest("d", DumpKind.TABLE, (ORDERS,), read_only=value)  # type: ignore[arg-type]
