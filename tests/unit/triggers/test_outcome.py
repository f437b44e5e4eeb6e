"""`DumpOutcome`: built from a dump's status, carried as a trigger event's small JSON payload
and read back the same, by the dump operator and sensor alike."""

from __future__ import annotations

import json

from airflow_provider_dblog.state import DumpState, DumpStatus
from airflow_provider_dblog.triggers.outcome import ENDED, MISSING, STALLED, DumpOutcome


def status(state: DumpState, reason: str = "") -> DumpStatus:
    return DumpStatus(
        state=state,
        reason=reason,
        chunks=4,
        rows=37,
        windows_retried=1,
        created_ms=1,
        started_ms=2,
        finished_ms=None,
        updated_ms=3,
    )


def test_a_finished_dump_ends_the_wait_with_its_state_and_counters() -> None:
    outcome = DumpOutcome.of("d", status(DumpState.FAILED, "chunk 2 failed 5 times"))
    assert outcome == DumpOutcome(
        "d", "failed", DumpState.FAILED, "chunk 2 failed 5 times", 4, 37, 1
    )
    assert not outcome.stalled


def test_a_missing_dump_has_no_state_and_says_so() -> None:
    assert DumpOutcome.of("d", None) == DumpOutcome("d", MISSING, None, "no such dump")
    ended = DumpOutcome.of("d", None, ENDED)
    assert (ended.outcome, ended.state) == (ENDED, None)


def test_a_stalled_wait_keeps_the_state_the_dump_was_left_in() -> None:
    outcome = DumpOutcome.of("d", status(DumpState.RUNNING), STALLED)
    assert outcome.stalled and outcome.state is DumpState.RUNNING


def test_the_event_payload_is_fixed_json_and_reads_back_the_same() -> None:
    for outcome in (
        DumpOutcome.of("d", status(DumpState.DONE)),
        DumpOutcome.of("d", status(DumpState.RUNNING), STALLED),
        DumpOutcome.of("d", None),
    ):
        payload = outcome.to_event()
        assert set(payload) == {
            "dump_id",
            "outcome",
            "state",
            "reason",
            "chunks",
            "rows",
            "windows_retried",
        }
        assert DumpOutcome.from_event(json.loads(json.dumps(payload))) == outcome
    assert DumpOutcome.of("d", status(DumpState.DONE)).to_event() == {
        "dump_id": "d",
        "outcome": "done",
        "state": "done",
        "reason": "",
        "chunks": 4,
        "rows": 37,
        "windows_retried": 1,
    }


def test_an_event_from_before_the_counters_were_always_sent_still_reads() -> None:
    old = {"dump_id": "d", "outcome": "missing", "state": None, "reason": "no such dump"}
    assert DumpOutcome.from_event(old) == DumpOutcome.of("d", None)
