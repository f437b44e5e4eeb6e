"""The dump keeps a chunk in every slot: a slot freed by a chunk that ended takes the next
chunk at once, while a slower chunk started with it is still in flight; the progress saved
moves only past chunks that ended in order (real Redis; the chunks' reads are stand-ins that
report their rows, as `run_chunk` does once the tailer closed a window)."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import pytest

from airflow_provider_dblog.core.dump_plan import (
    Chunk,
    DumpKind,
    DumpRequest,
    TablePlanner,
    TableProgress,
)
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.chunk import ChunkOutcome
from airflow_provider_dblog.dump.runner import ChunkSlots, run_table
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.state import DumpState, StateStore

TABLE = TableRef("public", "t")
KEYS = tuple((k,) for k in range(1, 9))
WAIT_S = 10.0


class Reads:
    """Chunk 0 ends only once chunk 3 started: with a slot refilled only when a whole round
    of three ended, chunk 3 never starts first and chunk 0 gives up."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most_running = 0
        self.chunk_3_started = threading.Event()
        self.order: list[tuple[str, int]] = []

    def __call__(self, chunk: Chunk, source: ChunkSource) -> ChunkOutcome:
        with self.lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            self.order.append(("start", chunk.seq))
        if chunk.seq == 3:
            self.chunk_3_started.set()
        if chunk.seq == 0 and not self.chunk_3_started.wait(WAIT_S):
            raise AssertionError("chunk 3 did not start while chunk 0 was in flight")
        assert chunk.keys is not None
        with self.lock:
            self.running -= 1
            self.order.append(("end", chunk.seq))
        return ChunkOutcome(True, len(chunk.keys), chunk.keys[-1])


@pytest.fixture
def store(redis_server: RedisInfo) -> StateStore:
    return StateStore(redis_server.client(), f"test-{uuid.uuid4().hex[:12]}")


def test_a_freed_slot_takes_the_next_chunk_and_progress_moves_in_order(
    store: StateStore,
) -> None:
    request = DumpRequest("slots", DumpKind.KEYS, (TABLE,), keys=KEYS, chunk_size=1, parallelism=3)
    store.dumps.create(request)
    planner = TablePlanner(TableProgress(TABLE), 1, KEYS)
    reads = Reads()
    saved: list[tuple[bool, int]] = []  # (chunk 0 had ended, the durable key index)

    def on_progress(_: str, progress: TableProgress) -> None:
        saved.append((("end", 0) in reads.order, progress.key_index))

    sources = [cast(ChunkSource, object()) for _ in range(3)]  # a keys dump plans on none
    with ThreadPoolExecutor(3) as pool:
        ended = run_table(
            store,
            "slots",
            planner,
            ChunkSlots(pool, sources, reads),
            1.0,
            on_progress,
            None,
        )
    assert ended is None and planner.done
    assert reads.most_running <= 3
    assert reads.order.index(("start", 3)) < reads.order.index(("end", 0)), reads.order
    # A chunk that ended before chunk 0 (one had to, to free a slot for chunk 3) moved no
    # durable progress: a dump killed then resumes at chunk 0.
    before_0 = [index for ended_0, index in saved if not ended_0]
    assert before_0 and set(before_0) == {0}, saved
    indexes = [index for _, index in saved]
    assert indexes == sorted(indexes) and indexes[-1] == len(KEYS), saved
    durable = store.dumps.load_progress("slots")[TABLE]
    assert (durable.done, durable.key_index) == (True, len(KEYS))
    status = store.dumps.status("slots")
    assert status is not None and (status.state, status.rows) == (DumpState.RUNNING, len(KEYS))
