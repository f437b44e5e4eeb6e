"""DumpStore on a real Redis: requests, progress, status, counters, controls, driver beats."""

from __future__ import annotations

import json

import pytest
import redis

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest, TableProgress
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.state import (
    AlreadyExists,
    DumpControls,
    DumpState,
    StateStore,
    UnknownDump,
)
from tests.integration.state.support import T, wait_for

pytestmark = pytest.mark.integration


def test_dump_request_progress_and_status_round_trip(store: StateStore) -> None:
    keys_dump = DumpRequest(
        "d-keys",
        DumpKind.KEYS,
        (TableRef("shop", "lines"),),
        keys=((1, "a"), (2, "ü"), (3, (("x", 1),))),
        chunk_size=50,
        parallelism=2,
    )
    all_dump = DumpRequest("d-all", DumpKind.ALL, (T, TableRef("shop", "lines")))
    store.dumps.create(keys_dump, {TableRef("shop", "lines"): ["order_id", "line"]})
    store.dumps.create(all_dump)
    with pytest.raises(AlreadyExists):
        store.dumps.create(all_dump)

    stored = store.dumps.get("d-keys")
    assert stored is not None
    assert stored.request == keys_dump
    assert stored.key_columns == {TableRef("shop", "lines"): ("order_id", "line")}
    all_stored = store.dumps.get("d-all")
    assert all_stored is not None and all_stored.request == all_dump
    assert store.dumps.get("nope") is None
    assert store.dumps.ids() == ["d-keys", "d-all"]

    status = store.dumps.status("d-all")
    assert status is not None
    assert (status.state, status.chunks, status.rows, status.windows_retried) == (
        DumpState.PENDING, 0, 0, 0,
    )  # fmt: skip
    assert status.started_ms is None and status.finished_ms is None
    assert store.dumps.mark("d-all", DumpState.RUNNING)
    store.dumps.count("d-all", chunks=1, rows=1000)
    store.dumps.count("d-all", windows_retried=1)

    progress = TableProgress(
        T, started=True, max_key=(99, "z"), after=(41, "ä"), chunks_done=2, rows_done=500
    )
    store.dumps.chunk_done("d-all", progress)  # the progress and the counters at once
    store.dumps.save_progress("d-all", TableProgress(TableRef("shop", "lines")))
    loaded = store.dumps.load_progress("d-all")
    assert loaded == {
        T: progress,
        TableRef("shop", "lines"): TableProgress(TableRef("shop", "lines")),
    }
    assert store.dumps.load_progress("d-keys") == {}

    assert store.dumps.mark("d-all", DumpState.FAILED, "source went away")
    status = store.dumps.status("d-all")
    assert status is not None
    assert (status.state, status.reason, status.chunks, status.rows, status.windows_retried) == (
        DumpState.FAILED, "source went away", 3, 1500, 1,
    )  # fmt: skip
    assert status.started_ms is not None and status.finished_ms is not None
    assert status.created_ms <= status.started_ms <= status.finished_ms
    assert not store.dumps.mark("d-all", DumpState.RUNNING), "a finished dump stays finished"
    with pytest.raises(UnknownDump):
        store.dumps.mark("nope", DumpState.RUNNING)
    with pytest.raises(UnknownDump):
        store.dumps.count("nope", chunks=1)
    with pytest.raises(UnknownDump):
        store.dumps.chunk_done("nope", progress)
    assert store.dumps.load_progress("nope") == {}
    assert store.dumps.status("nope") is None


def test_counts_a_lost_write_took_come_back_with_the_next_save(
    client: redis.Redis, store: StateStore
) -> None:
    """A failover to a replica that missed the last writes takes a chunk's progress and its
    counts together; the dump goes on from what it holds, and its next saves (each table's
    again when it completes) make the counts its tables' sums again."""
    lines = TableRef("shop", "lines")
    store.dumps.create(DumpRequest("lossy", DumpKind.ALL, (lines, T)))
    store.dumps.mark("lossy", DumpState.RUNNING)
    store.dumps.chunk_done("lossy", TableProgress(lines, started=True, chunks_done=1, rows_done=10))
    keys = [store.dumps.keys.dump_progress("lossy"), store.dumps.keys.dump_status("lossy")]
    replica = {key: client.hgetall(key) for key in keys}
    done_lines = TableProgress(lines, started=True, done=True, chunks_done=2, rows_done=15)
    store.dumps.chunk_done("lossy", done_lines)
    store.dumps.chunk_done("lossy", TableProgress(T, started=True, chunks_done=1, rows_done=7))
    for key, fields in replica.items():  # promoted: the last two writes are gone
        client.delete(key)
        client.hset(key, mapping=fields)

    orders = TableProgress(T, started=True, done=True, chunks_done=2, rows_done=9)
    store.dumps.chunk_done("lossy", orders)
    status = store.dumps.status("lossy")
    assert status is not None and (status.chunks, status.rows) == (3, 19)
    store.dumps.save_progress("lossy", done_lines)
    store.dumps.save_progress("lossy", orders)
    status = store.dumps.status("lossy")
    assert status is not None and (status.chunks, status.rows) == (4, 24)
    assert store.dumps.load_progress("lossy") == {lines: done_lines, T: orders}


def test_dump_controls_change_while_it_runs(store: StateStore) -> None:
    store.dumps.create(DumpRequest("d", DumpKind.TABLE, (T,), chunk_size=500))
    assert store.dumps.controls("d") == DumpControls(False, False, 500, 0, None)
    assert store.dumps.mark("d", DumpState.RUNNING)
    assert store.dumps.throttle("d", chunk_size=100, delay_ms=250, max_rows_per_s=2000.5)
    assert store.dumps.pause("d")
    assert store.dumps.controls("d") == DumpControls(True, False, 100, 250, 2000.5)
    assert store.dumps.mark("d", DumpState.PAUSED)
    assert store.dumps.resume("d")
    assert store.dumps.throttle("d", max_rows_per_s=0)
    assert store.dumps.controls("d") == DumpControls(False, False, 100, 250, None)
    with pytest.raises(InvalidRequest):
        store.dumps.throttle("d", chunk_size=0)
    with pytest.raises(InvalidRequest):
        store.dumps.throttle("d")

    assert store.dumps.cancel("d")
    controls = store.dumps.controls("d")
    assert controls is not None and controls.cancelled
    status = store.dumps.status("d")
    assert status is not None and status.state is DumpState.PAUSED, "the dump itself stops"
    assert store.dumps.mark("d", DumpState.CANCELLED, "cancelled by hand")
    assert not store.dumps.pause("d"), "a finished dump takes no controls"
    assert store.dumps.controls("nope") is None
    with pytest.raises(UnknownDump):
        store.dumps.pause("nope")

    # A dump cancelled before any process ran it ends at once; its process then finds it so.
    store.dumps.create(DumpRequest("p", DumpKind.TABLE, (T,)))
    assert store.dumps.cancel("p")
    status = store.dumps.status("p")
    assert status is not None and status.state is DumpState.CANCELLED
    assert not store.dumps.mark("p", DumpState.RUNNING)


def test_a_failed_or_cancelled_dump_reopens_with_its_progress(store: StateStore) -> None:
    request = DumpRequest("again", DumpKind.TABLE, (T,), chunk_size=10)
    store.dumps.create(request)
    store.dumps.mark("again", DumpState.RUNNING)
    progress = TableProgress(T, chunks_done=3, rows_done=30, max_key=(99,))
    store.dumps.save_progress("again", progress)
    store.dumps.pause("again")
    store.dumps.cancel("again")
    store.dumps.mark("again", DumpState.CANCELLED)
    assert store.dumps.mark("again", DumpState.RUNNING) is False  # finished stays finished

    assert store.dumps.reopen("again") is True
    status, controls = store.dumps.status("again"), store.dumps.controls("again")
    assert status is not None and status.state is DumpState.PENDING and status.finished_ms is None
    assert controls is not None and not controls.cancelled and not controls.paused
    assert store.dumps.load_progress("again") == {T: progress}
    assert store.dumps.mark("again", DumpState.DONE) is True
    assert store.dumps.reopen("again") is False
    with pytest.raises(UnknownDump):
        store.dumps.reopen("never")


def test_dump_driver_beats_and_expires(store: StateStore) -> None:
    assert store.dumps.driver("d1") is None
    store.dumps.beat("d1", "host:42", ttl_ms=300)
    assert store.dumps.driver("d1") == "host:42"
    wait_for(lambda: store.dumps.driver("d1") is None, 5, "the driver's beat expiring")


def test_a_driver_that_stops_running_the_dump_is_no_longer_its_driver(store: StateStore) -> None:
    store.dumps.beat("d1", "host:42", ttl_ms=60_000)
    store.dumps.unbeat("d1", "host:7")  # not its beat: left alone
    assert store.dumps.driver("d1") == "host:42"
    store.dumps.unbeat("d1", "host:42")
    assert store.dumps.driver("d1") is None


def test_airflow_s_origin_of_a_dump_is_kept_beside_it(store: StateStore) -> None:
    assert store.dumps.origin("d1") is None
    origin = {"dag_id": "dblog_dump", "run_id": "manual__1", "run_url": "http://a/dags/x"}
    store.dumps.record_origin("d1", origin)
    assert store.dumps.origin("d1") == origin


def test_a_dump_stored_with_its_chunk_size_in_the_request_resumes_at_the_controls(
    store: StateStore,
) -> None:
    """The chunk size is stored in the controls only; a dump whose request holds one too (as
    stored before) reads the controls', which a throttle changes."""
    store.dumps.create(DumpRequest("kept", DumpKind.TABLE, (T,), chunk_size=500))
    client: redis.Redis = store.dumps._r
    key = store.dumps.keys.dump("kept")
    data = json.loads(client.get(key))
    assert "chunk_size" not in data["request"]
    data["request"]["chunk_size"] = 500  # as the request was stored before
    client.set(key, json.dumps(data))
    assert store.dumps.throttle("kept", chunk_size=120)
    stored = store.dumps.get("kept")
    assert stored is not None and stored.request.chunk_size == 120
    client.delete(store.dumps.keys.dump_controls("kept"))
    stored = store.dumps.get("kept")
    assert stored is not None and stored.request.chunk_size == 500
