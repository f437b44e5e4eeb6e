"""What a Spark task says of the source or Redis reaches the driver's runner as the same kind
of error: a replica behind must stay `ReplicaBehind` (the chunk pauses), a source or Redis away
`SourceUnavailable` or `StateStoreUnavailable` (the runner waits within its patience), a refusal
`SourceError` (the dump fails)."""

from __future__ import annotations

import pickle

import pytest

from airflow_provider_dblog.dump.spark_chunk import raise_source_trouble
from airflow_provider_dblog.sources.base import ReplicaBehind, SourceError, SourceUnavailable
from airflow_provider_dblog.state import StateStoreRefusesWrites, StateStoreUnavailable


@pytest.mark.parametrize("kind", [ReplicaBehind, SourceUnavailable])
def test_the_task_error_keeps_its_kind_across_the_wire(kind: type[SourceUnavailable]) -> None:
    sent = pickle.loads(pickle.dumps(kind("behind by 4096 bytes")))  # as Spark returns it
    with pytest.raises(kind) as raised:
        raise_source_trouble([sent], [])
    assert type(raised.value) is kind
    assert str(raised.value) == "a Spark task could not read the source: behind by 4096 bytes"


def test_a_refusal_wins_over_an_outage() -> None:
    with pytest.raises(SourceError, match="cannot use the source: no such CA file") as raised:
        raise_source_trouble([SourceUnavailable("away")], ["no such CA file"])
    assert not isinstance(raised.value, SourceUnavailable)


@pytest.mark.parametrize("kind", [StateStoreUnavailable, StateStoreRefusesWrites])
def test_redis_away_in_a_task_stays_a_store_outage(kind: type[StateStoreUnavailable]) -> None:
    """Redis away in a task is waited for like the source, not a failed job (which spends one
    of the chunk's attempts)."""
    sent = pickle.loads(pickle.dumps(kind("Connection refused")))
    with pytest.raises(kind) as raised:
        raise_source_trouble([sent], [])
    assert type(raised.value) is kind
    assert str(raised.value) == "a Spark task could not reach the state store: Connection refused"
