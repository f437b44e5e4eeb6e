"""Runs DAGs of dags/ with `dag.test()` and prints each outcome as one JSON line.

    python -m tests.integration.dag_test_runner '[["DAG_ID", {"param": "value"}], ...]'

Started by `airflow_support.dag_tests` with a private AIRFLOW_HOME. Several runs share one
process, so Airflow starts once. Each run begins with a start line on stdout and stderr, so
the caller can tell which output belongs to which run. A run refused before it starts (params
that fail their JSON schema) prints the error and the state "refused".
"""

from __future__ import annotations

import json
import os
import sys

from airflow.dag_processing.dagbag import DagBag

START_MARK = "DBLOG-DAG-TEST-START"
RESULT_MARK = "DBLOG-DAG-TEST-RESULT "


def main() -> None:
    runs = json.loads(sys.argv[1])
    for dag_id, conf in runs:
        print(START_MARK, flush=True)
        print(START_MARK, file=sys.stderr, flush=True)
        # Each run parses the DAGs afresh, as a task process does: a task's params are merged
        # into the DAG's own `Param` objects (`process_params`), so a run of a DAG object used
        # before would inherit the values of params that its conf leaves out.
        bag = DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
        assert not bag.import_errors, bag.import_errors
        dag = bag.get_dag(dag_id)
        try:
            run = dag.test(run_conf=conf)
        except Exception as exc:  # a run refused before it starts, e.g. by its params' schema
            print(f"refused: {type(exc).__name__}: {exc}", file=sys.stderr)
            result = {"state": "refused", "tasks": {}}
        else:
            tasks = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
            result = {"state": str(run.state), "tasks": tasks}
        print(RESULT_MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
