"""### dblog_verify: is the target still equal to the source, and which rows are not?

Compares the target (the tailer's `sql_apply` output) with the source chunk by chunk between
watermarks, while writes go on (`dblog verify`, docs/verify.md), and repairs what differs when
asked. Its trigger form takes:

- **table** empty: every captured table; or one table.
- **after**, **upto**: with a table, verify only the keys above `after` and up to `upto`
  (`7`, or JSON `["eu", 7]` for a composite key); either or both.
- **where**: with a table, only the rows matching this condition in the source's SQL.
- **repair**: `none` (report only), `auto` (remove the target's extra keys and re-send the
  other differing ones with a key dump), or `approve`: like `auto`, but a repair of more
  keys than **approve_above** first waits for a person to approve it (task `approve`, in
  Airflow's Required actions, showing the counts and the first differing keys).
- **target**: `output` (the tailer's `sql_apply` output) or `lake` (the Delta tables the
  compaction folds the NDJSON output into).
- **chunk_size**: rows a chunk reads on each side; empty: 50,000. **parallelism**: chunks
  verified at once.
- **spark_conn_id**: empty: the verify runs in the worker; a Spark connection: each chunk's
  reads run in Spark tasks (the repair still runs in the worker).

`verify` checks the request first (an unknown table, a bad bound or filter fail it at once),
then runs and reports: its XCom holds the counts (checked, in flux, missing, extra, changed),
the first differing keys and a Markdown report. `decide` picks the next step; `repair`
repairs that same run and its XCom adds the repair (keys removed, each dump's rows). Both are
retried twice, a retry resuming the run; a cancelled run is not retried. A rejected approval
skips the repair. The worker (and on Spark, its workers) needs the `sql_apply` output's
`dsn_env` in its environment.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import DAG, Param, task

from airflow_provider_dblog.operators.chain import (
    DAG_DEFAULTS,
    DBLOG_CONN_ID,
    POLL_S,
    SPARK_CONN_ID,
)
from airflow_provider_dblog.operators.params import (
    ParamValue,
    captured_table_names,
    parallelism_param,
    where_param,
)
from airflow_provider_dblog.operators.verify import DAG_REPAIRS, DBLogVerifyOperator, next_step
from airflow_provider_dblog.verify.targets import TARGETS

VERIFIED = "ti.xcom_pull(task_ids='verify')"
"""The verify task's outcome, in a template."""
RETRIED: dict[str, Any] = {"retries": 2, "retry_delay": timedelta(seconds=30)}
"""The verify and repair tasks' retries, as the dump's: a retry resumes the same run (its id is
the task's). Besides the outages a run outlasts, Airflow can fail a deferred task whose trigger
fired before the scheduler heard that it deferred (the executor's late success of the deferring
attempt reads as a task killed externally: a known scheduler race), which a busy scheduler
meets with a fast trigger."""


def _table_param(choices: list[str]) -> Param:
    schema: dict[str, Any] = {"type": ["string", "null"]}
    if choices:
        schema["examples"] = choices
    return Param(
        None, description_md="One table (`schema.table`). Empty: every captured table.", **schema
    )


def _bound_param(which: str) -> Param:
    return Param(
        None,
        type=["string", "null"],
        description_md=f'With a table: verify only the keys {which}: `7`, or JSON `["eu", 7]` '
        "for a composite key. Empty: no bound.",
    )


with DAG(
    dag_id="dblog_verify",
    description="DBLog verify: compare the target with the source, repair what differs",
    doc_md=__doc__,
    schedule=None,
    **DAG_DEFAULTS,
    params={
        "table": _table_param(captured_table_names(DBLOG_CONN_ID)),
        "after": _bound_param("above this one"),
        "upto": _bound_param("up to this one"),
        "where": where_param(),
        "repair": Param(
            "none",
            enum=list(DAG_REPAIRS),
            description_md="`none`: report only. `auto`: repair what differs. `approve`: "
            "repair, after a person approved it when more keys than **approve_above** differ.",
        ),
        "approve_above": Param(
            100,
            type="integer",
            minimum=0,
            description_md="With `approve`: a repair of more differing keys than this waits "
            "for a person's approval.",
        ),
        "target": Param(
            "output",
            enum=list(TARGETS),
            description_md="`output`: the tailer's `sql_apply` output. `lake`: the Delta "
            "tables the compaction folds the NDJSON output into.",
        ),
        "chunk_size": Param(
            None,
            type=["integer", "null"],
            allOf=[{"minimum": 1}],
            description="Rows one chunk reads on each side, a whole number of at least 1. "
            "Empty: 50,000.",
        ),
        "parallelism": parallelism_param(1),
        "spark_conn_id": Param(
            None,
            type=["string", "null"],
            description_md="Empty: the verify runs in the worker. A Spark connection "
            f"(`{SPARK_CONN_ID}`, say): each chunk's reads run in Spark tasks.",
        ),
    },
) as dag:
    verify = DBLogVerifyOperator(
        task_id="verify",
        dblog_conn_id=DBLOG_CONN_ID,
        table=ParamValue("table"),
        after=ParamValue("after"),
        upto=ParamValue("upto"),
        where=ParamValue("where"),
        target=ParamValue("target"),
        chunk_size=ParamValue("chunk_size"),
        parallelism=ParamValue("parallelism"),
        spark_conn_id=ParamValue("spark_conn_id"),
        deferrable=True,
        poll_interval=POLL_S,
        **RETRIED,
    )

    @task.branch(task_id="decide")
    def decide(params: dict[str, Any], ti: Any = None) -> list[str]:
        step = next_step(ti.xcom_pull(task_ids="verify"), params["repair"], params["approve_above"])
        return {"approve": ["approve"], "repair": ["no_approval_needed"], None: []}[step]

    approve = ApprovalOperator(
        task_id="approve",
        subject=f"Repair {{{{ {VERIFIED}['differing'] }}}} differing keys?",
        body=f"{{{{ {VERIFIED}['report'] }}}}",
    )
    no_approval_needed = EmptyOperator(task_id="no_approval_needed")
    repair = DBLogVerifyOperator(
        task_id="repair",
        dblog_conn_id=DBLOG_CONN_ID,
        verify_id=f"{{{{ {VERIFIED}['verify_id'] }}}}",
        repair="auto",
        deferrable=True,
        poll_interval=POLL_S,
        trigger_rule="none_failed_min_one_success",
        **RETRIED,
    )
    verify >> decide() >> [approve, no_approval_needed] >> repair
