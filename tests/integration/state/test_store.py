"""All of a source's state across a Redis restart and an outage; the source's name checked."""

from __future__ import annotations

import uuid

import pytest
import redis

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest, TableProgress
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import StateStore, StateStoreUnavailable
from tests.integration.state.support import T, as_stored, chunk_of, new_window, stored_chunk

pytestmark = pytest.mark.integration


def test_state_survives_a_redis_restart(redis_server: RedisInfo) -> None:
    source = f"test-{uuid.uuid4().hex[:12]}"
    with redis_server.client() as client:
        store = StateStore(client, source)
        token = store.tailer.acquire_lease("tailer-a", 60_000)
        assert token is not None
        window, lw, _ = new_window(store)
        rows = chunk_of(window, [{"id": 1, "v": "ü"}])
        assert store.windows.put_rows(window.window_id, rows)
        assert store.windows.open(window.window_id, token)
        store.tailer.save_checkpoint(77, token)
        request = DumpRequest("d", DumpKind.TABLE, (T,))
        store.dumps.create(request)
        store.dumps.save_progress("d", TableProgress(T, started=True, after=(5,)))

    redis_server.restart()

    with redis_server.client() as client:
        store = StateStore(client, source)  # Lua scripts are loaded again on first use
        assert store.windows.lookup_watermark(lw) == (window, "lw")
        assert stored_chunk(store, window.window_id) == as_stored(rows)
        assert store.tailer.load_checkpoint() == 77
        stored = store.dumps.get("d")
        assert stored is not None and stored.request == request
        assert store.dumps.load_progress("d") == {T: TableProgress(T, started=True, after=(5,))}
        assert store.tailer.acquire_lease("tailer-b", 1000) is None, "the lease survives too"
        assert store.windows.claim(window.window_id, token)
        assert store.windows.close(window.window_id, token)


def test_a_redis_that_goes_away_gives_a_clear_error(redis_server: RedisInfo) -> None:
    with redis_server.probe_client() as client:
        store = StateStore(client, f"test-{uuid.uuid4().hex[:12]}")
        redis_server.kill()
        try:
            with pytest.raises(StateStoreUnavailable, match=r"cannot be reached") as raised:
                store.tailer.load_checkpoint()
            assert redis_server.password not in str(raised.value)
            assert f"{redis_server.host}:{redis_server.port}" in str(raised.value)
            with pytest.raises(StateStoreUnavailable):
                store.windows.wait("w", 1)
            with pytest.raises(StateStoreUnavailable):
                store.tailer.acquire_lease("tailer-a", 1000)
        finally:
            redis_server.start()
        assert store.windows.lookup_watermark("anything") is None, "the store works again"


def test_source_names_are_checked(client: redis.Redis) -> None:
    for bad in ("", "a b", "a:b", "a{b}"):
        with pytest.raises(InvalidRequest):
            StateStore(client, bad)
