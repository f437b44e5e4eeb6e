"""`dblog status` and the live view render one model of a dump (its status and controls as
`DumpStatus.to_json` and `DumpControls.to_json` give them), of a verify run
(`VerifyStore.summary`) and of the compaction follower (`CompactorHealth.summary`), on a real
Redis."""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_dblog.cli.status import dump_detail, status_json, status_table
from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.verify import ChunkVerdict, Difference
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import DumpState, StateStore, VerifyState
from airflow_provider_dblog.ui.snapshot import LiveView

pytestmark = pytest.mark.integration

ORDERS = TableRef("shop", "orders")


def test_the_command_and_the_live_view_show_a_dump_alike(redis_server: RedisInfo) -> None:
    source = f"views-{uuid.uuid4().hex[:12]}"
    with redis_server.client() as client:
        store = StateStore(client, source)
        store.dumps.create(DumpRequest("seen", DumpKind.TABLE, (ORDERS,), chunk_size=400))
        assert store.dumps.mark("seen", DumpState.RUNNING)
        store.dumps.count("seen", chunks=3, rows=1200)
        assert store.dumps.throttle("seen", chunk_size=90, delay_ms=5, max_rows_per_s=300.0)

        listed = status_json(store)["dumps"]
        detail = dump_detail(store, "seen")
        view = LiveView(client, source).snapshot()
        assert view["error"] is None
        [shown] = view["dumps"]
    assert isinstance(listed, list) and isinstance(shown, dict)
    [dump] = listed
    assert isinstance(dump, dict)
    assert dump["state"] == "running" and (dump["chunks"], dump["rows"]) == (3, 1200)
    assert {k: shown[k] for k in dump} == dump
    assert {k: detail[k] for k in dump} == dump
    controls = {
        "paused": False,
        "cancelled": False,
        "chunk_size": 90,
        "delay_ms": 5,
        "max_rows_per_s": 300.0,
    }
    assert shown["controls"] == detail["controls"] == controls
    request = detail["request"]
    assert isinstance(request, dict) and request["chunk_size"] == 90  # the controls' own


def test_the_command_and_the_live_view_show_a_verify_run_alike(redis_server: RedisInfo) -> None:
    source = f"views-{uuid.uuid4().hex[:12]}"
    with redis_server.client() as client:
        store = StateStore(client, source)
        view = LiveView(client, source)
        assert view.snapshot()["verifies"] == []
        store.verifies.create("v-seen", {"tables": [str(ORDERS)], "chunk_size": 50})
        differs = ((7,), Difference.CHANGED), ((9,), Difference.EXTRA)
        verdicts = ChunkVerdict(50, 2, differs), ChunkVerdict(30, 0, ())
        store.verifies.chunk_done("v-seen", ORDERS, {"after": [80]}, *verdicts)
        running = view.snapshot()["verifies"]
        store.verifies.finish("v-seen", VerifyState.DONE)
        listed = status_json(store)["verifies"]
        [done] = view.snapshot()["verifies"]
        table = status_table(store)
    assert isinstance(running, list) and isinstance(done, dict)
    [shown] = running
    assert isinstance(shown, dict) and shown["state"] == "running"
    assert (shown["chunks"], shown["checked"], shown["in_flux"]) == (2, 80, 2)
    assert (shown["missing"], shown["extra"], shown["changed"]) == (0, 1, 1)
    assert listed == [done] and done["state"] == "done"
    assert {k: v for k, v in done.items() if k not in ("state", "finished_ms")} == {
        k: v for k, v in shown.items() if k not in ("state", "finished_ms")
    }
    assert "v-seen  done" in table


def test_the_command_and_the_live_view_show_the_compaction_alike(redis_server: RedisInfo) -> None:
    source = f"views-{uuid.uuid4().hex[:12]}"
    with redis_server.client() as client:
        store = StateStore(client, source)
        assert "compaction" not in status_table(store)  # no follower beats
        metrics = {"freshness_s": 2.5, "events": 7, "pending_bytes": 10, "state": "leading"}
        store.compactor.beat("host:1", metrics, 60)
        table = status_table(store)
        view = LiveView(client, source).snapshot()
    shown = view["compaction"]
    assert isinstance(shown, dict)
    assert {k: shown[k] for k in ("owner", "freshness_s", "events", "pending_bytes")} == {
        "owner": "host:1",
        "freshness_s": 2.5,
        "events": 7,
        "pending_bytes": 10,
    }
    assert "compaction: host:1, heartbeat" in table
    assert "freshness 2.5 s, 7 events folded, 10 bytes pending" in table
