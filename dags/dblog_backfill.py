"""### dblog_backfill: a scheduled full dump

A full dump of the captured tables (or of the tables chosen) on a schedule, keeping derived
stores whole even if something slipped past them.

Schedule: `$DBLOG_BACKFILL_SCHEDULE` (cron, default Sunday 03:00 UTC); catchup is off, so a
paused DAG that is switched on runs once, not once per missed week. One run at a time.
Triggered by hand, this form sets **tables** (empty: every captured table), **chunk_size**
and **parallelism**.
"""

from __future__ import annotations

import os

from airflow.sdk import DAG

from airflow_provider_dblog.operators.chain import DAG_DEFAULTS, DBLOG_CONN_ID, dump_chain
from airflow_provider_dblog.operators.params import (
    ParamValue,
    captured_table_names,
    chunk_size_param,
    mode_param,
    parallelism_param,
    tables_param,
)

with DAG(
    dag_id="dblog_backfill",
    description="Scheduled full DBLog dump of the captured tables",
    doc_md=__doc__,
    schedule=os.environ.get("DBLOG_BACKFILL_SCHEDULE", "0 3 * * 0"),
    max_active_runs=1,
    **DAG_DEFAULTS,
    params={
        "tables": tables_param(captured_table_names(DBLOG_CONN_ID)),
        "chunk_size": chunk_size_param(),
        "parallelism": parallelism_param(2),
        "mode": mode_param(),
    },
) as dag:
    dump_chain(
        tables=ParamValue("tables"),
        chunk_size=ParamValue("chunk_size"),
        parallelism=ParamValue("parallelism"),
        mode=ParamValue("mode"),
    )
