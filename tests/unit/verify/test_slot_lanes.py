"""A verify slot's lanes: chunks in flight on one slot's connections, whose calls take turns, and
of which two at most read rows at once."""

from __future__ import annotations

import threading
from typing import Any, cast

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.verify import RowsRead
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.verify.reader import RowsTarget, TargetReader
from airflow_provider_dblog.verify.runner import Slot

TABLE = TableRef("public", "accounts")


class Connection:
    """Stands for a source or a target: counts the calls inside it at once."""

    read_only = False

    def __init__(self) -> None:
        self.inside = 0
        self.most_inside = 0
        self.closed = 0
        self.entered = threading.Event()
        self.leave = threading.Event()

    def read_rows(self, chunk: Chunk) -> RowsRead:
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        self.entered.set()
        assert self.leave.wait(30), "the test never let the call end"
        self.inside -= 1
        return RowsRead([{"id": chunk.seq}], ("id",))

    def close(self) -> None:
        self.closed += 1


def slot() -> tuple[Slot, Connection, Connection]:
    source, target = Connection(), Connection()
    return Slot(cast(ChunkSource, source), cast(TargetReader, target)), source, target


def test_one_lane_is_the_slot_itself() -> None:
    whole, _, _ = slot()
    assert whole.lanes(1) == [whole]


def test_lanes_share_the_connections_one_call_at_a_time() -> None:
    whole, _, target = slot()
    first, second = whole.lanes(2)
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda lane=lane, seq=seq: results.append(
            cast(RowsTarget, lane.target).read_rows(Chunk(TABLE, seq))
        ))
        for seq, lane in enumerate((first, second))
    ]  # fmt: skip
    threads[0].start()
    assert target.entered.wait(30)
    threads[1].start()
    turn = cast(Any, first.target)._turn
    assert turn is cast(Any, second.target)._turn
    assert turn.locked() and not turn.acquire(blocking=False), "the second call waits its turn"
    target.leave.set()
    for thread in threads:
        thread.join(30)
    assert sorted(r.rows[0]["id"] for r in results) == [0, 1]
    assert target.most_inside == 1


def test_a_lane_answers_as_its_slot_and_closes_with_it() -> None:
    whole, source, target = slot()
    lanes = whole.lanes(2)
    assert all(lane.source.read_only is False for lane in lanes)
    assert all(isinstance(lane.target, RowsTarget) for lane in lanes), "read as rows"
    whole.close()
    assert (source.closed, target.closed) == (1, 1)


def test_of_four_lanes_two_at_most_read_rows_at_once() -> None:
    whole, _, _ = slot()
    lanes = whole.lanes(4)
    gate = cast(threading.BoundedSemaphore, lanes[0].rows_gate)
    assert all(lane.rows_gate is gate for lane in lanes)
    with lanes[0].rows_gate, lanes[1].rows_gate:
        assert not gate.acquire(blocking=False), "a third chunk waits to read rows"
    assert gate.acquire(blocking=False)
    gate.release()
    assert whole.lanes(2)[0].rows_gate is whole.rows_gate, "two lanes: no gate"
