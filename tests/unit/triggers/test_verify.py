"""A verify run's outcome as the trigger sends it and the DAG decides on it: the payload
survives its trip through a trigger event, its report shows the counts and the first keys, and
the `dblog_verify` DAG's next step follows the repair asked and the threshold."""

from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_dblog.operators.verify import next_step
from airflow_provider_dblog.triggers.verify import DBLogVerifyTrigger, VerifyOutcome

OUTCOME = VerifyOutcome(
    "v1",
    "done",
    counts={"checked": 900, "in_flux": 7, "missing": 1, "extra": 1, "changed": 2},
    first_keys=["public.accounts missing [100002]", "public.orders changed ['zz', 1]"],
    repair={"removed": 1, "dumps": [{"dump_id": "v1-repair-0", "state": "done", "rows": 2}]},
)


def test_the_outcome_goes_through_a_trigger_event_unchanged() -> None:
    payload = json.loads(json.dumps(OUTCOME.to_event()))
    assert VerifyOutcome.from_event(payload) == OUTCOME
    assert payload["differing"] == 4
    assert OUTCOME.repaired
    unfinished = {"removed": 0, "dumps": [{"dump_id": "d", "state": "failed", "rows": 0}]}
    assert not VerifyOutcome("v1", "done", repair=unfinished).repaired


def test_the_report_shows_the_counts_the_first_keys_and_the_repair() -> None:
    report = OUTCOME.report()
    for shown in (
        "in flux: 7",
        "changed: 2",
        "The first 2 of 4 differing keys:",
        "- `public.orders changed ['zz', 1]`",
        "Repair: 1 extra keys removed; `v1-repair-0` (done, 2 rows).",
    ):
        assert shown in report, report


@pytest.mark.parametrize(
    ("repair", "approve_above", "differing", "step"),
    [
        ("none", 0, 4, None),
        ("auto", 0, 0, None),
        ("auto", 0, 4, "repair"),
        ("approve", 4, 4, "repair"),
        ("approve", 3, 4, "approve"),
        ("approve", 0, 0, None),
    ],
)
def test_the_dag_repairs_at_once_or_after_approval(
    repair: str, approve_above: int, differing: int, step: str | None
) -> None:
    assert next_step({"differing": differing}, repair, approve_above) == step


def test_an_unknown_repair_fails_the_step_without_retry() -> None:
    with pytest.raises(AirflowFailException, match="repair must be one of none, approve, auto"):
        next_step({"differing": 1}, "always", 0)


def test_the_trigger_serializes_ids_and_numbers_only() -> None:
    trigger = DBLogVerifyTrigger("dblog_default", "v1", repair=True, poll_interval=0.5)
    path, kwargs = trigger.serialize()
    assert path == "airflow_provider_dblog.triggers.verify.DBLogVerifyTrigger"
    assert DBLogVerifyTrigger(**kwargs).serialize() == (path, kwargs)
    assert kwargs == {
        "dblog_conn_id": "dblog_default",
        "verify_id": "v1",
        "repair": True,
        "poll_interval": 0.5,
        "runner_timeout_s": 120.0,
    }
