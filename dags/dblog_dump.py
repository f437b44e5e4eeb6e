"""dblog_dump: a dump triggered by hand from the UI's params form: all captured tables, some
tables, or primary keys of one table, with its chunk size and parallelism.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from airflow_provider_dblog.operators.chain import (
    DAG_DEFAULTS,
    DBLOG_CONN_ID,
    TABLE_PATTERN,
    dump_chain,
)

with DAG(
    dag_id="dblog_dump",
    description="DBLog dump on demand: tables or keys, chunk size, parallelism",
    schedule=None,
    **DAG_DEFAULTS,
    params={
        "source": Param(
            DBLOG_CONN_ID,
            type="string",
            minLength=1,
            description="The dblog connection of the source",
        ),
        "tables": Param(
            [],
            type="array",
            items={"type": "string", "pattern": TABLE_PATTERN},
            description="Tables ('schema.table'); empty: every captured table",
        ),
        "keys": Param(
            [],
            type="array",
            description=(
                'Optional primary keys of the one table given: [1, 2] or [["eu", 1]] for '
                "composite keys; empty: whole tables"
            ),
        ),
        "chunk_size": Param(1000, type="integer", minimum=1, maximum=1_000_000),
        "parallelism": Param(1, type="integer", minimum=1, maximum=64),
    },
) as dag:
    dump_chain(
        dblog_conn_id="{{ params.source }}",
        tables="{{ params.tables }}",
        keys="{{ params['keys'] }}",
        chunk_size="{{ params.chunk_size }}",
        parallelism="{{ params.parallelism }}",
    )
