"""dblog_backfill: a scheduled full dump of the configured tables (all captured tables by
default), keeping derived stores whole even if something slipped past them.

Schedule: $DBLOG_BACKFILL_SCHEDULE (cron, default Sunday 03:00 UTC); catchup is off, so a
paused DAG that is switched on runs once, not once per missed week.
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Param

from airflow_provider_dblog.operators.chain import DAG_DEFAULTS, TABLE_PATTERN, dump_chain

with DAG(
    dag_id="dblog_backfill",
    description="Scheduled full DBLog dump of the captured tables",
    schedule=os.environ.get("DBLOG_BACKFILL_SCHEDULE", "0 3 * * 0"),
    max_active_runs=1,
    **DAG_DEFAULTS,
    params={
        "tables": Param(
            [],
            type="array",
            items={"type": "string", "pattern": TABLE_PATTERN},
            description="Tables to dump ('schema.table'); empty: every captured table",
        ),
        "chunk_size": Param(10_000, type="integer", minimum=1, maximum=1_000_000),
        "parallelism": Param(2, type="integer", minimum=1, maximum=64),
    },
) as dag:
    dump_chain(
        tables="{{ params.tables }}",
        chunk_size="{{ params.chunk_size }}",
        parallelism="{{ params.parallelism }}",
    )
