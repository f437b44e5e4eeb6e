"""Runs one DAG of dags/ with `dag.test()` and prints its outcome as one JSON line.

    python -m tests.integration.dag_test_runner DAG_ID '{"param": "value"}'

Started by `airflow_support.dag_test` with a private AIRFLOW_HOME. A run refused before it
starts (params that fail their JSON schema) prints the error and the state "refused".
"""

from __future__ import annotations

import json
import os
import sys

from airflow.dag_processing.dagbag import DagBag


def main() -> None:
    dag_id, conf = sys.argv[1], json.loads(sys.argv[2])
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
    print("DBLOG-DAG-TEST-RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
