"""The `dblog_lake_compaction` DAG as the DAG processor and the trigger form see it: every ten
minutes, one run at a time, one task, its one param optional and refused by name when not a
boolean."""

from __future__ import annotations

import copy

import pytest

from tests.unit.test_dags import dag_bag, is_required

pytestmark = pytest.mark.unit


def test_it_runs_every_ten_minutes_one_task_pruning_nothing_by_default() -> None:
    dag = dag_bag().dags["dblog_lake_compaction"]
    assert [t.task_id for t in dag.tasks] == ["compact"]
    assert dag.schedule == "*/10 * * * *" and dag.catchup is False and dag.max_active_runs == 1
    assert dag.doc_md and dag.doc_md.startswith("### dblog_lake_compaction:")
    assert set(dag.params.keys()) == {"prune"} and dag.params["prune"] is False
    assert is_required(dag.params.get_param("prune").schema)  # a checkbox: always sent


def test_params_schema_refuses_a_prune_that_is_not_a_boolean() -> None:
    from airflow.sdk.exceptions import ParamValidationError

    params = copy.deepcopy(dag_bag().dags["dblog_lake_compaction"].params)
    with pytest.raises(ParamValidationError, match="param prune:"):
        params.update({"prune": "yes"})
        params.validate()
