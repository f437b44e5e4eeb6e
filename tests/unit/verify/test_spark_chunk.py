"""How a Spark verify's driver puts a side of a chunk together from its tasks' parts: the hashes
in the parts' key order whatever order the tasks ended in, the chunk read again when a part
found its window past open, and a server a task could not use raised as `dblog verify` would
meet it."""

from __future__ import annotations

import pytest

from airflow_provider_dblog.sources.base import ReplicaBehind, SourceError
from airflow_provider_dblog.state import StateStoreUnavailable
from airflow_provider_dblog.verify.spark_chunk import HashedPart, _combine


def test_the_parts_hashes_come_together_in_key_order() -> None:
    parts = [HashedPart(1, {(3,): "c", (4,): "d"}), HashedPart(0, {(1,): "a", (2,): "b"})]
    hashes = _combine(parts, "the source")
    assert hashes is not None
    assert list(hashes.items()) == [((1,), "a"), ((2,), "b"), ((3,), "c"), ((4,), "d")]


def test_a_part_that_found_its_window_past_open_reads_the_chunk_again() -> None:
    assert _combine([HashedPart(0, {(1,): "a"}), HashedPart(1, None)], "the source") is None


@pytest.mark.parametrize("error", [ReplicaBehind("behind"), StateStoreUnavailable("down")])
def test_a_server_away_is_raised_as_its_own_error(error: Exception) -> None:
    with pytest.raises(type(error), match="a Spark task could not reach the source: "):
        _combine([HashedPart(0, {(1,): "a"}), HashedPart(1, None, unavailable=error)], "the source")


def test_a_worker_refused_fails_the_run_naming_the_side() -> None:
    refused = HashedPart(0, None, refused="environment variable 'DSN' (dsn_env) is not set")
    with pytest.raises(SourceError, match="cannot read the sql_apply output: environment"):
        _combine([refused], "the sql_apply output")
