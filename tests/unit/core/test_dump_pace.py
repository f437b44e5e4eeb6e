"""The pace shared by `dblog dump` and `dblog ui`: measured from where the watcher first saw
the table, slowing down while the table stalls (when asked until now), with an ETA only when
the share done and the pace are known."""

from __future__ import annotations

from airflow_provider_dblog.core.dump_pace import TablePace, clock_text, eta_s
from airflow_provider_dblog.core.dump_plan import TableProgress
from airflow_provider_dblog.core.event import TableRef

T = TableRef("public", "t")


def _at(after: int, rows: int, *, done: bool = False) -> TableProgress:
    return TableProgress(
        T, started=True, done=done, max_key=(1000,), after=(after,), rows_done=rows
    )


def test_the_pace_counts_only_the_rows_seen_being_read() -> None:
    pace = TablePace(since_s=10.0, rows_at_start=500)  # a resumed dump: 500 rows before
    assert pace.rows_per_s() is None and pace.rows_per_s(10.0) is None
    pace.step(_at(500, 500), 10.0)
    pace.step(_at(600, 600), 12.0)
    pace.step(_at(600, 600), 14.0)  # no move: the last step stays at 12 s
    assert pace.first == (500, 500)
    assert pace.rows_per_s() == 50.0
    assert pace.rows_per_s(until_s=20.0) == 10.0  # a stalled table's pace falls


def test_eta_is_the_rows_left_at_the_pace() -> None:
    assert eta_s(_at(250, 250), 0.25, 50.0) == 15.0
    assert eta_s(_at(250, 250), None, 50.0) is None
    assert eta_s(_at(250, 250), 0.25, None) is None
    assert eta_s(_at(1000, 1000, done=True), 1.0, 50.0) is None
    assert [clock_text(s) for s in (9, 725, 3723)] == ["0:09", "12:05", "1:02:03"]
