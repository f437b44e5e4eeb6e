"""When a wait for a verify run ends, and what it reports, on a real Redis: a run counts as
finished once it failed, or is done with no repair asked, or with its repair recorded and every
dump of it finished; the outcome sums the counts over the run's tables and lists the repair's
dumps as they stand. What `DBLogVerifyTrigger` and `DBLogVerifySensor` decide on."""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.verify import ChunkVerdict, Difference
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import DumpState, StateStore, VerifyState
from airflow_provider_dblog.triggers.verify import VerifyOutcome, finished

pytestmark = pytest.mark.integration
ORDERS = TableRef("public", "orders")


@pytest.fixture
def store(redis_server: RedisInfo) -> StateStore:
    return StateStore(redis_server.client(), f"test-{uuid.uuid4().hex[:12]}")


def test_a_run_is_finished_once_nothing_is_left_for_a_process(store: StateStore) -> None:
    assert not finished(store, "v1", repair=False), "no such run"
    store.verifies.create("v1", {})
    assert not finished(store, "v1", repair=False), "running"
    verdict = ChunkVerdict(5, 1, (((1,), Difference.MISSING), ((9,), Difference.EXTRA)))
    store.verifies.chunk_done("v1", ORDERS, {"done": True}, verdict)
    store.verifies.finish("v1", VerifyState.DONE)
    assert finished(store, "v1", repair=False)
    assert not finished(store, "v1", repair=True), "its repair not recorded yet"

    store.dumps.create(DumpRequest("v1-repair-0", DumpKind.KEYS, (ORDERS,), ((1,),)))
    store.verifies.repair_started("v1", 1, ["v1-repair-0"])
    assert not finished(store, "v1", repair=True), "its dump pending"
    outcome = VerifyOutcome.of(store, "v1")
    assert (outcome.outcome, outcome.differing, outcome.repaired) == ("done", 2, False)
    assert outcome.counts == {"checked": 5, "in_flux": 1, "missing": 1, "extra": 1, "changed": 0}
    assert outcome.first_keys == ["public.orders missing [1]", "public.orders extra [9]"]

    store.dumps.mark("v1-repair-0", DumpState.RUNNING)
    store.dumps.mark("v1-repair-0", DumpState.DONE)
    assert finished(store, "v1", repair=True)
    repaired = VerifyOutcome.of(store, "v1")
    assert repaired.repaired and repaired.repair == {
        "removed": 1,
        "dumps": [{"dump_id": "v1-repair-0", "state": "done", "rows": 0}],
    }


def test_a_failed_run_is_finished_and_says_why(store: StateStore) -> None:
    store.verifies.create("v2", {})
    store.verifies.finish("v2", VerifyState.FAILED, "a chunk failed 20 times")
    assert finished(store, "v2", repair=True)
    outcome = VerifyOutcome.of(store, "v2")
    assert (outcome.outcome, outcome.reason) == ("failed", "a chunk failed 20 times")
    assert VerifyOutcome.of(store, "nope").outcome == "missing"
