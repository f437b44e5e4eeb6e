"""WindowStore on a real Redis: a window's life and its races, stale watermarks, chunk rows."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis

from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.reconciler import ChunkRows, Window
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import (
    AlreadyExists,
    MissingRows,
    StateStore,
    UnknownWindow,
    WindowState,
)
from tests.integration.state.support import (
    TTL_S,
    T,
    as_stored,
    chunk_of,
    new_window,
    stored_chunk,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_window_lifecycle(store: StateStore, client: redis.Redis) -> None:
    token = store.tailer.acquire_lease("tailer-a", 10_000)
    assert token is not None
    window, lw, hw = new_window(store)
    assert store.windows.lookup_watermark(lw) == (window, "lw")
    assert store.windows.lookup_watermark(hw) == (window, "hw")
    status = store.windows.state(window.window_id)
    assert status is not None
    assert (status.window, status.state, status.reason) == (window, WindowState.REGISTERED, "")
    assert status.chunk == {"after": [41], "upto": [99], "seq": 3}

    with pytest.raises(AlreadyExists):
        store.windows.register(window, str(uuid.uuid4()), str(uuid.uuid4()), {}, TTL_S)
    with pytest.raises(AlreadyExists):  # a watermark value is never reused
        store.windows.register(Window("other", "dump-1", T), lw, str(uuid.uuid4()), {}, TTL_S)

    rows = chunk_of(window, [{"id": 42, "v": "a"}, {"id": 43, "v": "b"}])
    assert store.windows.put_rows(window.window_id, rows)
    assert store.windows.open(window.window_id, token)
    assert not store.windows.open(window.window_id, token), "lw is met once"
    assert store.windows.claim(window.window_id, token)
    assert not store.windows.abandon(window.window_id, "timeout"), "claimed: too late to abandon"
    assert stored_chunk(store, window.window_id) == as_stored(rows)
    assert store.windows.wait(window.window_id, 0).state is WindowState.CLOSING
    assert store.windows.close(window.window_id, token)
    assert not store.windows.close(window.window_id, token)

    final = store.windows.wait(window.window_id, 5)
    assert final.state is WindowState.CLOSED
    assert final.updated_ms >= final.registered_ms
    assert stored_chunk(store, window.window_id) is None, "rows are deleted when it ends"
    # What is left of the window expires; everything lives under the source's namespace.
    keys = [k if isinstance(k, str) else k.decode() for k in client.scan_iter(f"*{store.source}*")]
    assert keys and all(k.startswith(f"dblog:{{{store.source}}}:") for k in keys)
    assert all(0 < client.pttl(k) <= TTL_S * 1000 for k in keys if ":window:" in k or ":wm:" in k)


def test_windows_fail_and_are_abandoned(store: StateStore) -> None:
    token = store.tailer.acquire_lease("tailer-a", 10_000)
    assert token is not None
    failed, _, _ = new_window(store)
    assert store.windows.fail(failed.window_id, "hw_without_lw", token)
    status = store.windows.state(failed.window_id)
    assert status is not None and (status.state, status.reason) == (
        WindowState.FAILED,
        "hw_without_lw",
    )
    assert not store.windows.open(failed.window_id, token)

    abandoned, _, _ = new_window(store)
    assert store.windows.open(abandoned.window_id, token)
    assert store.windows.abandon(abandoned.window_id, "no hw within 60s")
    assert not store.windows.claim(abandoned.window_id, token), "an abandoned window is not emitted"
    assert not store.windows.put_rows(abandoned.window_id, chunk_of(abandoned, [{"id": 1}]))
    assert stored_chunk(store, abandoned.window_id) is None
    status = store.windows.wait(abandoned.window_id, 5)
    assert (status.state, status.reason) == (WindowState.ABANDONED, "no hw within 60s")

    assert store.windows.state("never-registered") is None
    assert not store.windows.open("never-registered", token)
    with pytest.raises(UnknownWindow):
        store.windows.wait("never-registered", 1)
    with pytest.raises(UnknownWindow):
        store.windows.put_rows("never-registered", ChunkRows("never-registered", ("id",), [], 1))


def test_wait_window_wakes_when_the_window_ends_and_times_out_otherwise(
    store: StateStore, redis_server: RedisInfo
) -> None:
    token = store.tailer.acquire_lease("tailer-a", 10_000)
    assert token is not None
    window, _, _ = new_window(store)
    status = store.windows.wait(window.window_id, 0.3)
    assert status.state is WindowState.REGISTERED, "a timeout returns the current state"

    woken: list[WindowState] = []

    def waiter() -> None:
        woken.append(store.windows.wait(window.window_id, 30).state)

    admin = redis_server.client()
    blocked_before = int(admin.info("clients")["blocked_clients"])
    threads = [threading.Thread(target=waiter) for _ in range(2)]
    for thread in threads:
        thread.start()
    wait_for(
        lambda: int(admin.info("clients")["blocked_clients"]) >= blocked_before + 2,
        10,
        "both waiters blocked on the window",
    )
    assert woken == [], "nobody wakes before the window ends"
    assert store.windows.open(window.window_id, token)
    assert store.windows.claim(window.window_id, token)
    assert store.windows.close(window.window_id, token)
    for thread in threads:
        thread.join(30)
    assert woken == [WindowState.CLOSED, WindowState.CLOSED], "every waiter wakes"


def race_claim_against_abandon(store: StateStore, window_id: str, token: int) -> dict[str, bool]:
    """The tailer meeting hw and the dump giving up, released at the same instant."""
    start = threading.Barrier(2)
    results: dict[str, bool] = {}

    def tailer() -> None:
        start.wait()
        results["tailer"] = store.windows.claim(window_id, token)
        if results["tailer"]:
            assert store.windows.close(window_id, token)

    def dump() -> None:
        start.wait()
        results["dump"] = store.windows.abandon(window_id, "timeout")

    threads = [threading.Thread(target=tailer), threading.Thread(target=dump)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return results


def test_claim_and_abandon_race_has_exactly_one_winner(store: StateStore) -> None:
    token = store.tailer.acquire_lease("tailer-a", 60_000)
    assert token is not None
    wins = {"tailer": 0, "dump": 0}
    for _ in range(200):
        window, _, _ = new_window(store)
        assert store.windows.open(window.window_id, token)
        results = race_claim_against_abandon(store, window.window_id, token)
        assert results["tailer"] != results["dump"], results
        winner = "tailer" if results["tailer"] else "dump"
        wins[winner] += 1
        final = store.windows.wait(window.window_id, 5).state
        assert final is (WindowState.CLOSED if winner == "tailer" else WindowState.ABANDONED)
    print(f"race winners over 200 rounds: {wins}")


def test_stale_watermark_values_are_unknown(store: StateStore) -> None:
    assert store.windows.lookup_watermark(str(uuid.uuid4())) is None
    window, lw, hw = new_window(store, ttl_s=0.3)
    assert store.windows.lookup_watermark(lw) == (window, "lw")
    wait_for(
        lambda: store.windows.lookup_watermark(lw) is None, 5, "the watermark of an expired window"
    )
    assert store.windows.lookup_watermark(hw) is None
    assert store.windows.state(window.window_id) is None
    with pytest.raises(InvalidRequest):
        store.windows.register(window, lw, lw, {}, TTL_S)


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
    assert store.windows.put_rows(window.window_id, chunk)
    assert stored_chunk(store, window.window_id) == as_stored(chunk)

    # A retried put replaces the rows; an empty chunk is a chunk.
    empty = ChunkRows(window.window_id, ("id",), [], schema_version=1)
    assert store.windows.put_rows(window.window_id, empty)
    assert stored_chunk(store, window.window_id) == as_stored(empty)
    with pytest.raises(InvalidRequest):
        store.windows.put_rows(window.window_id, ChunkRows("other", ("id",), [], 1))


def test_appended_parts_make_one_chunk(store: StateStore) -> None:
    """Spark tasks append their sub-ranges: rows and invisible txids are the union of the parts,
    a part appended twice (a retried task) counts once, and an ended window takes nothing."""
    window, _, _ = new_window(store)
    first = [{"id": i} for i in range(1500)]
    second = [{"id": i} for i in range(1500, 1600)]
    assert store.windows.append_rows(window.window_id, 1, second, ("id",), frozenset({7})) == 100
    assert store.windows.append_rows(window.window_id, 0, first, ("id",), frozenset({5, 7})) == 1500
    assert store.windows.append_rows(window.window_id, 2, [], ("id",), frozenset()) == 0
    assert store.windows.append_rows(window.window_id, 1, second[:3], ("id",), frozenset()) == 100
    back = stored_chunk(store, window.window_id)
    assert back is not None
    assert back.key_columns == ("id",) and back.schema_version == 0
    assert sorted(r["id"] for r in back.rows) == list(range(1600))
    assert back.invisible_txids == {5, 7}
    stored = store.windows.stored_rows(window.window_id)
    assert stored is not None and stored.columns == {("id",)}, "one column list, empty part aside"
    assert store.windows.append_rows(window.window_id, 4, [{"id": 0, "v": 1}], ("id",), frozenset())
    stored = store.windows.stored_rows(window.window_id)
    assert stored is not None and stored.columns == {("id",), ("id", "v")}, "read across an ALTER"

    assert store.windows.abandon(window.window_id)
    assert store.windows.append_rows(window.window_id, 3, first, ("id",), frozenset()) is None
    assert stored_chunk(store, window.window_id) is None
    with pytest.raises(UnknownWindow):
        store.windows.append_rows("never-registered", 0, [], ("id",), frozenset())


def test_a_direct_read_stores_its_columns_without_rows(store: StateStore) -> None:
    """A direct read keeps its rows in the target and stores only its invisible transactions and
    the columns it read with: the tailer checks those at hw as it checks a sequenced chunk's."""
    window, _, _ = new_window(store)
    reads = ChunkRows(window.window_id, ("id",), [], 0, frozenset({4}))
    assert store.windows.put_rows(window.window_id, reads, ("id", "v"))
    stored = store.windows.stored_rows(window.window_id)
    assert stored is not None
    assert (stored.rows, stored.pages, stored.invisible_txids) == (0, 0, {4})
    assert stored.columns == {("id", "v")}

    parts, _, _ = new_window(store)
    for part, columns in enumerate([("id", "v"), ("id", "v", "w"), ()]):
        stored_rows = store.windows.append_rows(
            parts.window_id, part, [], ("id",), frozenset(), columns
        )
        assert stored_rows == 0
    stored = store.windows.stored_rows(parts.window_id)
    assert stored is not None and stored.rows == 0
    assert stored.columns == {("id", "v"), ("id", "v", "w")}, "parts read across an ALTER"


def test_wide_rows_are_paged_by_their_bytes(store: StateStore) -> None:
    """A page holds up to 1000 rows but ends once it passes about a MiB, so the tailer, which
    holds a page at a time, holds about that much whatever the width of the rows."""
    window, _, _ = new_window(store)
    rows: list[dict[str, object]] = [{"id": i, "pad": "x" * 3000} for i in range(1200)]
    assert store.windows.put_rows(window.window_id, chunk_of(window, rows))
    stored = store.windows.stored_rows(window.window_id)
    assert stored is not None and stored.rows == 1200
    sizes = [len(page) for page in store.windows.row_slices(stored)]
    assert sum(sizes) == 1200 and len(sizes) == stored.pages > 3
    assert max(sizes) < 400, sizes


def test_50k_rows_are_stored_and_read_fast(store: StateStore) -> None:
    window, _, _ = new_window(store)
    rows: list[dict[str, object]] = [
        {"id": i, "customer": f"customer-{i}", "amount": i * 1.5, "note": None, "tags": ["a", "b"]}
        for i in range(50_000)
    ]
    chunk = chunk_of(window, rows)
    began = time.perf_counter()
    assert store.windows.put_rows(window.window_id, chunk)
    put_s = time.perf_counter() - began
    began = time.perf_counter()
    back = stored_chunk(store, window.window_id)
    get_s = time.perf_counter() - began
    assert back == as_stored(chunk)
    print(f"50k rows: put {put_s:.3f}s, get {get_s:.3f}s")


def test_rows_stored_in_another_format_are_never_read(
    store: StateStore, client: redis.Redis
) -> None:
    """Rows a dump of an earlier dblog stored (JSON arrays, no `format`) are refused, not read
    as encoded pages: the tailer fails the window and the chunk is read again."""
    window, _, _ = new_window(store)
    keys = store.windows.keys
    meta = keys.window_rows_meta(window.window_id)
    client.hset(meta, mapping={"key_columns": '["id"]', "rows": 1, "invisible_txids": "[]"})
    client.rpush(keys.window_rows(window.window_id), '[{"id":1}]')
    with pytest.raises(MissingRows, match="another dblog version"):
        store.windows.stored_rows(window.window_id)
