"""### dblog_lake_maintenance: the lake tables' daily upkeep

`dblog lake maintain` as a scheduled DAG, on the lake of the `dblog` connection's configuration
(`[lake] root`): for each lake table, small files compacted (optimize), files no version
within the retention needs removed (vacuum), the Delta log checkpointed. Each table waits for a
running compaction to end (the compaction's lock, up to 15 minutes; the task is retried once
after half an hour if it does not). Its XCom (`maintain` task, `return_value`) holds what each
step did per table.

Schedule: `$DBLOG_LAKE_MAINTENANCE_SCHEDULE` (cron, default daily 04:00 UTC); catchup is off,
one run at a time. Triggered by hand, this form sets **tables** (empty: every lake table),
**retention_hours** (at least 1: time travel reaches back this far; a shorter retention could
remove files a running merge or reader needs) and **dry_run**.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, Param, task
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_dblog.operators.chain import DAG_DEFAULTS, DBLOG_CONN_ID
from airflow_provider_dblog.operators.params import captured_table_names

DEFAULT_RETENTION_HOURS = 168

log = logging.getLogger(__name__)


def tables_param(choices: list[str]) -> Param:
    """Optional lake tables: a multi-select of the captured tables if known, else text."""
    schema: dict[str, Any] = {"type": ["array", "null"], "items": {"type": "string"}}
    if choices:
        schema["examples"] = choices
    return Param(
        None,
        description_md="Lake tables to maintain (`schema.table`). Empty: every lake table.",
        **schema,
    )


with DAG(
    dag_id="dblog_lake_maintenance",
    description="DBLog lake: compact small files, vacuum unreferenced ones, checkpoint the log",
    doc_md=__doc__,
    schedule=os.environ.get("DBLOG_LAKE_MAINTENANCE_SCHEDULE", "0 4 * * *"),
    max_active_runs=1,
    **DAG_DEFAULTS,
    params={
        "tables": tables_param(captured_table_names(DBLOG_CONN_ID)),
        "retention_hours": Param(
            DEFAULT_RETENTION_HOURS,
            type="integer",
            description_md=(
                "The vacuum keeps the files removed from a table less than this many hours "
                "ago: at least 1. Time travel reaches back this far; older versions lose "
                "their files."
            ),
        ),
        "dry_run": Param(
            False,
            type="boolean",
            description_md="Change nothing: log how many files the vacuum would remove.",
        ),
    },
) as dag:

    @task(retries=1, retry_delay=timedelta(minutes=30))
    def maintain(params: Any = None) -> list[dict[str, Any]]:
        """Maintain the lake's tables through the hook's configuration; bad params fail at once."""
        from airflow_provider_dblog.compaction.maintenance import (
            MaintenanceOptions,
            maintain_lake,
        )
        from airflow_provider_dblog.core.event import TableRef
        from airflow_provider_dblog.hooks.dblog import DBLogHook
        from airflow_provider_dblog.lake.schema import LakeSchemaError

        root = DBLogHook(DBLOG_CONN_ID).config.lake_root
        if root is None:
            raise AirflowFailException("the dblog connection's configuration has no [lake] root")
        retention = params["retention_hours"]
        try:
            options = MaintenanceOptions(retention_hours=retention, dry_run=params["dry_run"])
            tables = [TableRef.parse(t) for t in params["tables"] or ()] or None
        except ValueError as exc:  # a retention below the floor, a malformed table name
            raise AirflowFailException(str(exc)) from None
        try:
            reports = maintain_lake(
                root, tables, options, done=lambda r: log.info("%s", r.describe(retention))
            )
        except LakeSchemaError as exc:  # a table the lake lacks
            raise AirflowFailException(str(exc)) from None
        return [r.to_json() for r in reports]

    maintain()
