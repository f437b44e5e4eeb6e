"""The live view's pure parts: how far a table is, events per second from two heartbeats,
and the sampler that hands each viewer only the latest snapshot."""

from __future__ import annotations

import threading
from typing import Any

from airflow_provider_dblog.core.event import JsonValue, Op, TableRef
from airflow_provider_dblog.tailer.metrics import TailerStats
from airflow_provider_dblog.ui.server import Sampler
from airflow_provider_dblog.ui.snapshot import table_rates

T = TableRef("public", "t")


def test_rates_count_every_op_but_the_dropped_rows() -> None:
    before = {"public.t": {"c": 10, "u": 5, "r": 0, "dropped": 0}}
    after = {
        "public.t": {"c": 14, "u": 5, "r": 40, "dropped": 3},
        "public.new": {"c": 2},
    }
    assert table_rates(before, after, 2.0) == {"public.t": 22.0, "public.new": 1.0}
    assert table_rates(None, after, 2.0) == {}
    assert table_rates(before, after, 0) == {}


def test_the_heartbeat_carries_the_counts_per_table_the_view_reads() -> None:
    stats = TailerStats()
    stats.count("public", "t", Op.UPDATE, 3)
    stats.count("public", "t", Op.READ, 40)
    stats.count("s", "other", Op.CREATE)
    stats.chunk_rows_dropped[("public", "t")] = 2
    assert stats.metrics()["tables"] == {
        "public.t": {"u": 3, "r": 40, "dropped": 2},
        "s.other": {"c": 1},
    }


class CountingView:
    """A view whose snapshots are numbered; each waits until the test lets it be taken."""

    def __init__(self) -> None:
        self.taken = 0
        self.go = threading.Semaphore(0)

    def snapshot(self) -> dict[str, JsonValue]:
        self.go.acquire()
        self.taken += 1
        return {"n": self.taken}


def test_sampler_samples_only_while_watched_and_a_slow_viewer_gets_the_latest() -> None:
    view = CountingView()
    sampler = Sampler(view, interval_s=0.01)
    sampler.start()
    try:
        view.go.release()  # one snapshot allowed, but nobody watches: none is taken
        assert sampler.after(0, timeout_s=0.3) is None and view.taken == 0
        sampler.watching(+1)
        first = sampler.after(0, timeout_s=10)
        assert first == (1, b'{"n":1}')
        for _ in range(3):
            view.go.release()
        _wait(lambda: view.taken == 4)
        # A viewer still at snapshot 1 skips 2 and 3: it is handed the latest only.
        assert sampler.after(1, timeout_s=10) == (4, b'{"n":4}')
        sampler.watching(-1)
    finally:
        sampler.stop()
        view.go.release()
        sampler.join(10)
    assert not sampler.is_alive()


def _wait(condition: Any) -> None:
    done = threading.Event()
    for _ in range(1000):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("condition not met within 10s")
