"""A dump that did not finish shows the Spark driver's last lines in its task's log, where a
person looks first, or says where the log is when it was written on another worker."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_provider_dblog.hooks.spark_launcher import driver_log_path, driver_log_tail
from airflow_provider_dblog.operators.dblog import DBLogDumpOperator
from airflow_provider_dblog.state import DumpState
from airflow_provider_dblog.triggers.outcome import STALLED, DumpOutcome

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def test_the_tail_is_the_last_lines_of_the_drivers_log() -> None:
    driver_log_path("d1").write_text("".join(f"line {n}\n" for n in range(5000)) + "boom\n")
    assert driver_log_tail("d1", lines=2) == "line 4999\nboom"
    assert len(driver_log_tail("d1") or "") < 64 << 10
    assert driver_log_tail("started-elsewhere") is None


@pytest.mark.parametrize(
    "outcome",
    [
        DumpOutcome("d2", "failed", DumpState.FAILED, "chunk 3 failed 5 times"),
        DumpOutcome("d2", STALLED, DumpState.RUNNING, ""),
    ],
)
def test_a_dump_that_did_not_finish_shows_the_drivers_last_lines(
    outcome: DumpOutcome, capsys: pytest.CaptureFixture[str]
) -> None:
    driver_log_path("d2").write_text("starting\nTraceback (most recent call last):\nOOM: heap\n")
    with pytest.raises(AirflowException, match="d2"):
        DBLogDumpOperator(task_id="dump", deferrable=True)._finish(outcome, context={})  # type: ignore[typeddict-item]
    shown = capsys.readouterr().out
    assert "the last lines of the Spark driver's log" in shown and "OOM: heap" in shown, shown
    assert str(driver_log_path("d2")) in shown


def test_a_log_written_on_another_worker_is_named_with_its_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    outcome = DumpOutcome("d3", "failed", DumpState.FAILED, "source gone")
    with pytest.raises(AirflowException, match="source gone"):
        DBLogDumpOperator(task_id="dump", deferrable=True)._finish(outcome, context={})  # type: ignore[typeddict-item]
    shown = capsys.readouterr().out
    assert "is not on this worker" in shown and str(driver_log_path("d3")) in shown, shown
