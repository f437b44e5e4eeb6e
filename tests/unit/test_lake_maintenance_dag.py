"""The `dblog_lake_maintenance` DAG as the DAG processor and the trigger form see it: daily, one
task, its params optional with the maintenance's defaults, and bad input refused by name."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from airflow_provider_dblog.compaction import maintenance
from tests.unit.test_dags import dag_bag, is_required

pytestmark = pytest.mark.unit


def test_it_runs_daily_one_task_with_the_maintenance_s_defaults() -> None:
    dag = dag_bag().dags["dblog_lake_maintenance"]
    assert [t.task_id for t in dag.tasks] == ["maintain"]
    assert dag.schedule == "0 4 * * *" and dag.catchup is False and dag.max_active_runs == 1
    assert dag.doc_md and dag.doc_md.startswith("### dblog_lake_maintenance:")
    params = dag.params
    assert set(params.keys()) == {"tables", "retention_hours", "dry_run"}
    assert (params["tables"], params["dry_run"]) == (None, False)
    assert params["retention_hours"] == maintenance.DEFAULT_RETENTION_HOURS
    schema = params.get_param("retention_hours").schema
    assert "at least 1" in schema["description_md"]
    assert not {"minimum", "maximum"} & set(schema), "the form would clamp a typed 0 silently"
    assert not is_required(params.get_param("tables").schema)


@pytest.mark.parametrize(
    ("conf", "bad"),
    [
        ({"retention_hours": "a week"}, "retention_hours"),
        ({"retention_hours": 1.5}, "retention_hours"),
        ({"tables": "app.users"}, "tables"),
        ({"dry_run": "yes"}, "dry_run"),
    ],
)
def test_params_schema_refuses_bad_input_naming_the_param(conf: dict[str, Any], bad: str) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    params = copy.deepcopy(dag_bag().dags["dblog_lake_maintenance"].params)
    with pytest.raises(ParamValidationError, match=f"param {bad}:"):
        params.update(conf)
        params.validate()
