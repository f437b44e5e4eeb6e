"""The DAGs of dags/ as the DAG processor sees them: they import, their tasks chain as the
provider's `dump_chain` builds them, and their params schemas refuse bad input by name."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

DAGS = Path(__file__).resolve().parents[3] / "dags"


def test_every_dag_imports_with_its_tasks_and_params() -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(DAGS))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {"dblog_backfill", "dblog_dump", "dblog_repair", "dblog_on_change"}
    expected_params = {
        "dblog_backfill": {"tables", "chunk_size", "parallelism"},
        "dblog_dump": {"source", "tables", "keys", "chunk_size", "parallelism"},
        "dblog_repair": {"table", "keys", "chunk_size"},
    }
    for dag_id, params in expected_params.items():
        dag = bag.dags[dag_id]
        assert {t.task_id for t in dag.tasks} == {"check_request", "wait_for_tailer", "dump"}
        assert dag.get_task("check_request").downstream_task_ids == {"wait_for_tailer"}
        assert dag.get_task("wait_for_tailer").downstream_task_ids == {"dump"}
        assert set(dag.params.keys()) == params
        assert dag.catchup is False
    assert bag.dags["dblog_backfill"].schedule == "0 3 * * 0"
    assert bag.dags["dblog_dump"].schedule is None and bag.dags["dblog_repair"].schedule is None


@pytest.mark.parametrize(
    ("dag_id", "conf", "bad"),
    [
        ("dblog_dump", {"chunk_size": 0}, "chunk_size"),
        ("dblog_dump", {"parallelism": "two"}, "parallelism"),
        ("dblog_dump", {"tables": ["not a table"]}, "tables"),
        ("dblog_repair", {"table": "public.accounts", "keys": []}, "keys"),
        ("dblog_repair", {"keys": [1]}, "table"),
    ],
)
def test_params_schema_refuses_bad_input_naming_the_param(
    dag_id: str, conf: dict[str, Any], bad: str
) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import ParamValidationError

    dag = DagBag(str(DAGS)).dags[dag_id]
    params = copy.deepcopy(dag.params)
    with pytest.raises(ParamValidationError, match=bad):
        params.update(conf)  # what a run's conf does to the DAG's params
        params.validate()
