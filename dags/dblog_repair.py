"""dblog_repair: re-send the current rows of given primary keys of one table, e.g. keys a
consumer reported wrong. An ad-hoc run: trigger it with the table and the keys.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from airflow_provider_dblog.operators.chain import DAG_DEFAULTS, TABLE_PATTERN, dump_chain

with DAG(
    dag_id="dblog_repair",
    description="DBLog repair: dump the given primary keys of one table",
    schedule=None,
    **DAG_DEFAULTS,
    params={
        "table": Param(
            type="string",
            pattern=TABLE_PATTERN,
            description="The table ('schema.table')",
        ),
        "keys": Param(
            type="array",
            minItems=1,
            description='Its primary keys: [1, 2, 3], or [["eu", 1]] for composite keys',
        ),
        "chunk_size": Param(1000, type="integer", minimum=1, maximum=1_000_000),
    },
) as dag:
    dump_chain(
        tables=["{{ params.table }}"],
        keys="{{ params['keys'] }}",
        chunk_size="{{ params.chunk_size }}",
    )
