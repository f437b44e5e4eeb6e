"""The Redis state store on a real Redis: window life cycle and races, chunk rows, dump requests,
the tailer's checkpoint, lease and fencing, heartbeats, restarts and a Redis that goes away."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest, TableProgress
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.reconciler import ChunkRows, Window
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state_store import (
    AlreadyExists,
    AsyncStateReader,
    DumpControls,
    DumpState,
    FencedOut,
    StateStore,
    StateStoreUnavailable,
    UnknownDump,
    UnknownWindow,
    WindowState,
)

pytestmark = pytest.mark.integration

T = TableRef("public", "orders")
TTL_S = 600.0


@pytest.fixture(params=[False, True], ids=["bytes", "decoded"])
def client(redis_server: RedisInfo, request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    """Clients that return bytes and clients that decode: the store works with either."""
    with redis_server.client(decode_responses=request.param) as client:
        yield client


@pytest.fixture
def store(client: redis.Redis) -> StateStore:
    """A store on a source of its own: the Redis server is shared by the whole session."""
    return StateStore(client, f"test-{uuid.uuid4().hex[:12]}")


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s")
        time.sleep(0.02)


def new_window(store: StateStore, ttl_s: float = TTL_S) -> tuple[Window, str, str]:
    window = Window(uuid.uuid4().hex, "dump-1", T)
    lw, hw = str(uuid.uuid4()), str(uuid.uuid4())
    store.register_window(window, lw, hw, {"after": [41], "upto": [99], "seq": 3}, ttl_s)
    return window, lw, hw


def chunk_of(window: Window, rows: list[dict[str, object]]) -> ChunkRows:
    return ChunkRows(window.window_id, ("id",), rows, schema_version=2)


# --- windows -------------------------------------------------------------------------------


def test_window_lifecycle(store: StateStore, client: redis.Redis) -> None:
    token = store.acquire_lease("tailer-a", 10_000)
    assert token is not None
    window, lw, hw = new_window(store)
    assert store.lookup_watermark(lw) == (window, "lw")
    assert store.lookup_watermark(hw) == (window, "hw")
    status = store.window_state(window.window_id)
    assert status is not None
    assert (status.window, status.state, status.reason) == (window, WindowState.REGISTERED, "")
    assert status.chunk == {"after": [41], "upto": [99], "seq": 3}

    with pytest.raises(AlreadyExists):
        store.register_window(window, str(uuid.uuid4()), str(uuid.uuid4()), {}, TTL_S)
    with pytest.raises(AlreadyExists):  # a watermark value is never reused
        store.register_window(Window("other", "dump-1", T), lw, str(uuid.uuid4()), {}, TTL_S)

    rows = chunk_of(window, [{"id": 42, "v": "a"}, {"id": 43, "v": "b"}])
    assert store.put_chunk_rows(window.window_id, rows)
    assert store.open_window(window.window_id, token)
    assert not store.open_window(window.window_id, token), "lw is met once"
    assert store.claim_window(window.window_id, token)
    assert not store.abandon_window(window.window_id, "timeout"), "claimed: too late to abandon"
    assert store.get_chunk_rows(window.window_id) == rows
    assert store.wait_window(window.window_id, 0).state is WindowState.CLOSING
    assert store.close_window(window.window_id, token)
    assert not store.close_window(window.window_id, token)

    final = store.wait_window(window.window_id, 5)
    assert final.state is WindowState.CLOSED
    assert final.updated_ms >= final.registered_ms
    assert store.get_chunk_rows(window.window_id) is None, "rows are deleted when it ends"
    # What is left of the window expires; everything lives under the source's namespace.
    keys = [k if isinstance(k, str) else k.decode() for k in client.scan_iter(f"*{store.source}*")]
    assert keys and all(k.startswith(f"dblog:{{{store.source}}}:") for k in keys)
    assert all(0 < client.pttl(k) <= TTL_S * 1000 for k in keys if ":window:" in k or ":wm:" in k)


def test_windows_fail_and_are_abandoned(store: StateStore) -> None:
    token = store.acquire_lease("tailer-a", 10_000)
    assert token is not None
    failed, _, _ = new_window(store)
    assert store.fail_window(failed.window_id, "hw_without_lw", token)
    status = store.window_state(failed.window_id)
    assert status is not None and (status.state, status.reason) == (
        WindowState.FAILED,
        "hw_without_lw",
    )
    assert not store.open_window(failed.window_id, token)

    abandoned, _, _ = new_window(store)
    assert store.open_window(abandoned.window_id, token)
    assert store.abandon_window(abandoned.window_id, "no hw within 60s")
    assert not store.claim_window(abandoned.window_id, token), "an abandoned window is not emitted"
    assert not store.put_chunk_rows(abandoned.window_id, chunk_of(abandoned, [{"id": 1}]))
    assert store.get_chunk_rows(abandoned.window_id) is None
    status = store.wait_window(abandoned.window_id, 5)
    assert (status.state, status.reason) == (WindowState.ABANDONED, "no hw within 60s")

    assert store.window_state("never-registered") is None
    assert not store.open_window("never-registered", token)
    with pytest.raises(UnknownWindow):
        store.wait_window("never-registered", 1)
    with pytest.raises(UnknownWindow):
        store.put_chunk_rows("never-registered", ChunkRows("never-registered", ("id",), [], 1))


def test_wait_window_wakes_when_the_window_ends_and_times_out_otherwise(
    store: StateStore,
) -> None:
    token = store.acquire_lease("tailer-a", 10_000)
    assert token is not None
    window, _, _ = new_window(store)
    began = time.monotonic()
    status = store.wait_window(window.window_id, 0.3)
    assert status.state is WindowState.REGISTERED, "a timeout returns the current state"
    assert 0.3 <= time.monotonic() - began < 2

    def tailer() -> None:
        time.sleep(0.2)
        assert store.open_window(window.window_id, token)
        assert store.claim_window(window.window_id, token)
        assert store.close_window(window.window_id, token)

    waiters: list[float] = []

    def waiter() -> None:
        assert store.wait_window(window.window_id, 30).state is WindowState.CLOSED
        waiters.append(time.monotonic() - began)

    began = time.monotonic()
    threads = [threading.Thread(target=f) for f in (tailer, waiter, waiter)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(waiters) == 2, "every waiter wakes"
    print(f"waiters woke after {', '.join(f'{w:.3f}s' for w in waiters)} (close at ~0.2s)")


def race_claim_against_abandon(store: StateStore, window_id: str, token: int) -> dict[str, bool]:
    """The tailer meeting hw and the dump giving up, released at the same instant."""
    start = threading.Barrier(2)
    results: dict[str, bool] = {}

    def tailer() -> None:
        start.wait()
        results["tailer"] = store.claim_window(window_id, token)
        if results["tailer"]:
            assert store.close_window(window_id, token)

    def dump() -> None:
        start.wait()
        results["dump"] = store.abandon_window(window_id, "timeout")

    threads = [threading.Thread(target=tailer), threading.Thread(target=dump)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return results


def test_claim_and_abandon_race_has_exactly_one_winner(store: StateStore) -> None:
    token = store.acquire_lease("tailer-a", 60_000)
    assert token is not None
    wins = {"tailer": 0, "dump": 0}
    for _ in range(200):
        window, _, _ = new_window(store)
        assert store.open_window(window.window_id, token)
        results = race_claim_against_abandon(store, window.window_id, token)
        assert results["tailer"] != results["dump"], results
        winner = "tailer" if results["tailer"] else "dump"
        wins[winner] += 1
        final = store.wait_window(window.window_id, 5).state
        assert final is (WindowState.CLOSED if winner == "tailer" else WindowState.ABANDONED)
    print(f"race winners over 200 rounds: {wins}")


def test_stale_watermark_values_are_unknown(store: StateStore) -> None:
    assert store.lookup_watermark(str(uuid.uuid4())) is None
    window, lw, hw = new_window(store, ttl_s=0.3)
    assert store.lookup_watermark(lw) == (window, "lw")
    wait_for(lambda: store.lookup_watermark(lw) is None, 5, "the watermark of an expired window")
    assert store.lookup_watermark(hw) is None
    assert store.window_state(window.window_id) is None
    with pytest.raises(InvalidRequest):
        store.register_window(window, lw, lw, {}, TTL_S)


# --- chunk rows ------------------------------------------------------------------------------


def test_chunk_rows_round_trip_exactly(store: StateStore) -> None:
    window, _, _ = new_window(store)
    rows: list[dict[str, object]] = [
        {
            "id": i,
            "name": f"Zoë ✓ 漢字 🚀 {i}",
            "none": None,
            "flag": i % 2 == 0,
            "price": 0.1 + i,
            "big": 2**63 - i,
            "nested": {"a": [1, {"b": None}, "\u0000\n\"'"], "empty": {}, "list": []},
            "": "",
        }
        for i in range(2500)  # more than one page of rows
    ]
    chunk = ChunkRows(
        window.window_id, ("id", "name"), rows, schema_version=7, invisible_txids=frozenset({5, 9})
    )
    assert store.put_chunk_rows(window.window_id, chunk)
    assert store.get_chunk_rows(window.window_id) == chunk

    # A retried put replaces the rows; an empty chunk is a chunk.
    empty = ChunkRows(window.window_id, ("id",), [], schema_version=1)
    assert store.put_chunk_rows(window.window_id, empty)
    assert store.get_chunk_rows(window.window_id) == empty
    with pytest.raises(InvalidRequest):
        store.put_chunk_rows(window.window_id, ChunkRows("other", ("id",), [], 1))


def test_appended_parts_make_one_chunk(store: StateStore) -> None:
    """Spark tasks append their sub-ranges: rows and invisible txids are the union of the parts,
    a part appended twice (a retried task) counts once, and an ended window takes nothing."""
    window, _, _ = new_window(store)
    first = [{"id": i} for i in range(1500)]
    second = [{"id": i} for i in range(1500, 1600)]
    assert store.append_chunk_rows(window.window_id, 1, second, ("id",), frozenset({7})) == 100
    assert store.append_chunk_rows(window.window_id, 0, first, ("id",), frozenset({5, 7})) == 1500
    assert store.append_chunk_rows(window.window_id, 2, [], ("id",), frozenset()) == 0
    assert store.append_chunk_rows(window.window_id, 1, second[:3], ("id",), frozenset()) == 100
    back = store.get_chunk_rows(window.window_id)
    assert back is not None
    assert back.key_columns == ("id",) and back.schema_version == 0
    assert sorted(r["id"] for r in back.rows) == list(range(1600))
    assert back.invisible_txids == {5, 7}

    assert store.abandon_window(window.window_id)
    assert store.append_chunk_rows(window.window_id, 3, first, ("id",), frozenset()) is None
    assert store.get_chunk_rows(window.window_id) is None
    with pytest.raises(UnknownWindow):
        store.append_chunk_rows("never-registered", 0, [], ("id",), frozenset())


def test_50k_rows_are_stored_and_read_fast(store: StateStore) -> None:
    window, _, _ = new_window(store)
    rows: list[dict[str, object]] = [
        {"id": i, "customer": f"customer-{i}", "amount": i * 1.5, "note": None, "tags": ["a", "b"]}
        for i in range(50_000)
    ]
    chunk = chunk_of(window, rows)
    began = time.perf_counter()
    assert store.put_chunk_rows(window.window_id, chunk)
    put_s = time.perf_counter() - began
    began = time.perf_counter()
    back = store.get_chunk_rows(window.window_id)
    get_s = time.perf_counter() - began
    assert back == chunk
    print(f"50k rows: put {put_s:.3f}s, get {get_s:.3f}s")


# --- dumps -----------------------------------------------------------------------------------


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
    store.create_dump(keys_dump, {TableRef("shop", "lines"): ["order_id", "line"]})
    store.create_dump(all_dump)
    with pytest.raises(AlreadyExists):
        store.create_dump(all_dump)

    stored = store.get_dump("d-keys")
    assert stored is not None
    assert stored.request == keys_dump
    assert stored.key_columns == {TableRef("shop", "lines"): ("order_id", "line")}
    all_stored = store.get_dump("d-all")
    assert all_stored is not None and all_stored.request == all_dump
    assert store.get_dump("nope") is None
    assert store.list_dumps() == ["d-keys", "d-all"]

    status = store.dump_status("d-all")
    assert status is not None
    assert (status.state, status.chunks, status.rows, status.windows_retried) == (
        DumpState.PENDING, 0, 0, 0,
    )  # fmt: skip
    assert status.started_ms is None and status.finished_ms is None
    assert store.mark_dump("d-all", DumpState.RUNNING)
    store.count_dump("d-all", chunks=1, rows=1000)
    store.count_dump("d-all", chunks=1, rows=500, windows_retried=1)

    progress = TableProgress(T, started=True, max_key=(99, "z"), after=(41, "ä"), chunks_done=2)
    store.save_progress("d-all", progress)
    store.save_progress("d-all", TableProgress(TableRef("shop", "lines")))
    loaded = store.load_progress("d-all")
    assert loaded == {
        T: progress,
        TableRef("shop", "lines"): TableProgress(TableRef("shop", "lines")),
    }
    assert store.load_progress("d-keys") == {}

    assert store.mark_dump("d-all", DumpState.FAILED, "source went away")
    status = store.dump_status("d-all")
    assert status is not None
    assert (status.state, status.reason, status.chunks, status.rows, status.windows_retried) == (
        DumpState.FAILED, "source went away", 2, 1500, 1,
    )  # fmt: skip
    assert status.started_ms is not None and status.finished_ms is not None
    assert status.created_ms <= status.started_ms <= status.finished_ms
    assert not store.mark_dump("d-all", DumpState.RUNNING), "a finished dump stays finished"
    with pytest.raises(UnknownDump):
        store.mark_dump("nope", DumpState.RUNNING)
    with pytest.raises(UnknownDump):
        store.count_dump("nope", chunks=1)
    assert store.dump_status("nope") is None


def test_dump_controls_change_while_it_runs(store: StateStore) -> None:
    store.create_dump(DumpRequest("d", DumpKind.TABLE, (T,), chunk_size=500))
    assert store.controls("d") == DumpControls(False, False, 500, 0, None)
    assert store.mark_dump("d", DumpState.RUNNING)
    assert store.throttle_dump("d", chunk_size=100, delay_ms=250, max_rows_per_s=2000.5)
    assert store.pause_dump("d")
    assert store.controls("d") == DumpControls(True, False, 100, 250, 2000.5)
    assert store.mark_dump("d", DumpState.PAUSED)
    assert store.resume_dump("d")
    assert store.throttle_dump("d", max_rows_per_s=0)
    assert store.controls("d") == DumpControls(False, False, 100, 250, None)
    with pytest.raises(InvalidRequest):
        store.throttle_dump("d", chunk_size=0)
    with pytest.raises(InvalidRequest):
        store.throttle_dump("d")

    assert store.cancel_dump("d")
    controls = store.controls("d")
    assert controls is not None and controls.cancelled
    status = store.dump_status("d")
    assert status is not None and status.state is DumpState.PAUSED, "the dump itself stops"
    assert store.mark_dump("d", DumpState.CANCELLED, "cancelled by hand")
    assert not store.pause_dump("d"), "a finished dump takes no controls"
    assert store.controls("nope") is None
    with pytest.raises(UnknownDump):
        store.pause_dump("nope")

    # A dump cancelled before any process ran it ends at once; its process then finds it so.
    store.create_dump(DumpRequest("p", DumpKind.TABLE, (T,)))
    assert store.cancel_dump("p")
    status = store.dump_status("p")
    assert status is not None and status.state is DumpState.CANCELLED
    assert not store.mark_dump("p", DumpState.RUNNING)


# --- the tailer ------------------------------------------------------------------------------


def test_lease_fencing_refuses_the_old_leader(store: StateStore) -> None:
    first = store.acquire_lease("tailer-a", 300)
    assert first is not None
    assert store.acquire_lease("tailer-b", 300) is None
    assert store.acquire_lease("tailer-a", 300) is None, "held: renew it, do not acquire again"
    assert store.renew_lease("tailer-a", first, 300)
    assert not store.renew_lease("tailer-b", first, 300)
    store.save_checkpoint(1000, first)
    window, _, _ = new_window(store)
    assert store.open_window(window.window_id, first)

    # tailer-a stalls; its lease expires and tailer-b takes over.
    second: list[int] = []

    def taken_over() -> bool:
        token = store.acquire_lease("tailer-b", 10_000)
        if token is not None:
            second.append(token)
        return bool(second)

    wait_for(taken_over, 5, "tailer-b acquiring the expired lease")
    assert second[0] > first
    assert not store.renew_lease("tailer-a", first, 300)

    with pytest.raises(FencedOut):
        store.save_checkpoint(2000, first)
    assert store.load_checkpoint() == 1000
    for move in (store.claim_window, store.close_window):
        with pytest.raises(FencedOut):
            move(window.window_id, first)
    with pytest.raises(FencedOut):
        store.fail_window(window.window_id, "stale", first)
    status = store.window_state(window.window_id)
    assert status is not None and status.state is WindowState.OPEN

    store.save_checkpoint(2**64 - 1, second[0])
    assert store.load_checkpoint() == 2**64 - 1, "u64 commit positions survive"
    assert store.claim_window(window.window_id, second[0])

    assert not store.release_lease("tailer-a", first)
    assert store.release_lease("tailer-b", second[0])
    third = store.acquire_lease("tailer-a", 10_000)
    assert third is not None and third > second[0], "tokens only grow"
    with pytest.raises(FencedOut):
        store.close_window(window.window_id, second[0])


def test_heartbeat_and_health(store: StateStore) -> None:
    assert store.tailer_health() is None
    metrics = {"commit": 123456, "lag_ms": 40, "events_per_s": 812.5, "open_windows": 2}
    store.heartbeat("tailer-a", metrics, ttl_s=0.5)
    health = store.tailer_health()
    assert health is not None
    assert health["owner"] == "tailer-a" and health["metrics"] == metrics
    assert isinstance(health["age_ms"], int) and 0 <= health["age_ms"] < 1000
    wait_for(lambda: store.tailer_health() is None, 5, "the heartbeat expiring")


def test_a_failed_or_cancelled_dump_reopens_with_its_progress(store: StateStore) -> None:
    request = DumpRequest("again", DumpKind.TABLE, (T,), chunk_size=10)
    store.create_dump(request)
    store.mark_dump("again", DumpState.RUNNING)
    progress = TableProgress(T, chunks_done=3, rows_done=30, max_key=(99,))
    store.save_progress("again", progress)
    store.pause_dump("again")
    store.cancel_dump("again")
    store.mark_dump("again", DumpState.CANCELLED)
    assert store.mark_dump("again", DumpState.RUNNING) is False  # finished stays finished

    assert store.reopen_dump("again") is True
    status, controls = store.dump_status("again"), store.controls("again")
    assert status is not None and status.state is DumpState.PENDING and status.finished_ms is None
    assert controls is not None and not controls.cancelled and not controls.paused
    assert store.load_progress("again") == {T: progress}
    assert store.mark_dump("again", DumpState.DONE) is True
    assert store.reopen_dump("again") is False
    with pytest.raises(UnknownDump):
        store.reopen_dump("never")


def test_dump_driver_beats_and_expires(store: StateStore) -> None:
    assert store.dump_driver("d1") is None
    store.beat_dump("d1", "host:42", ttl_ms=300)
    assert store.dump_driver("d1") == "host:42"
    wait_for(lambda: store.dump_driver("d1") is None, 5, "the driver's beat expiring")


def test_async_reader_sees_what_the_store_wrote(store: StateStore, redis_server: RedisInfo) -> None:
    request = DumpRequest("seen", DumpKind.TABLE, (T,), chunk_size=10)
    store.create_dump(request)
    store.mark_dump("seen", DumpState.RUNNING)
    store.count_dump("seen", chunks=2, rows=20)
    store.beat_dump("seen", "host:7", ttl_ms=60_000)
    store.heartbeat("tailer-b", {"lag_ms": 12}, ttl_s=60)

    async def read() -> tuple[object, object, object, object]:
        client = redis.asyncio.Redis(
            host=redis_server.host, port=redis_server.port, password=redis_server.password
        )
        try:
            reader = AsyncStateReader(client, store.source)
            return (
                await reader.dump_status("seen"),
                await reader.dump_driver("seen"),
                await reader.tailer_health(),
                await reader.dump_status("missing"),
            )
        finally:
            await client.aclose()

    status, driver, health, missing = asyncio.run(read())
    assert status == store.dump_status("seen")
    assert driver == "host:7" and missing is None
    assert isinstance(health, dict) and health["owner"] == "tailer-b"
    assert health["metrics"] == {"lag_ms": 12}


# --- Redis restarts and outages --------------------------------------------------------------


def test_state_survives_a_redis_restart(redis_server: RedisInfo) -> None:
    source = f"test-{uuid.uuid4().hex[:12]}"
    with redis_server.client() as client:
        store = StateStore(client, source)
        token = store.acquire_lease("tailer-a", 60_000)
        assert token is not None
        window, lw, _ = new_window(store)
        rows = chunk_of(window, [{"id": 1, "v": "ü"}])
        assert store.put_chunk_rows(window.window_id, rows)
        assert store.open_window(window.window_id, token)
        store.save_checkpoint(77, token)
        request = DumpRequest("d", DumpKind.TABLE, (T,))
        store.create_dump(request)
        store.save_progress("d", TableProgress(T, started=True, after=(5,)))

    redis_server.restart()

    with redis_server.client() as client:
        store = StateStore(client, source)  # Lua scripts are loaded again on first use
        assert store.lookup_watermark(lw) == (window, "lw")
        assert store.get_chunk_rows(window.window_id) == rows
        assert store.load_checkpoint() == 77
        stored = store.get_dump("d")
        assert stored is not None and stored.request == request
        assert store.load_progress("d") == {T: TableProgress(T, started=True, after=(5,))}
        assert store.acquire_lease("tailer-b", 1000) is None, "the lease survives too"
        assert store.claim_window(window.window_id, token)
        assert store.close_window(window.window_id, token)


def test_a_redis_that_goes_away_gives_a_clear_error(redis_server: RedisInfo) -> None:
    with redis_server.probe_client() as client:
        store = StateStore(client, f"test-{uuid.uuid4().hex[:12]}")
        redis_server.kill()
        try:
            with pytest.raises(StateStoreUnavailable, match=r"cannot be reached") as raised:
                store.load_checkpoint()
            assert redis_server.password not in str(raised.value)
            assert f"{redis_server.host}:{redis_server.port}" in str(raised.value)
            with pytest.raises(StateStoreUnavailable):
                store.wait_window("w", 1)
            with pytest.raises(StateStoreUnavailable):
                store.acquire_lease("tailer-a", 1000)
        finally:
            redis_server.start()
        assert store.lookup_watermark("anything") is None, "the store works again"


def test_source_names_are_checked(client: redis.Redis) -> None:
    for bad in ("", "a b", "a:b", "a{b}"):
        with pytest.raises(InvalidRequest):
            StateStore(client, bad)
