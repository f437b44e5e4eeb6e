"""dblog_repair: re-send the current rows of given primary keys of one table, e.g. keys a
consumer reported wrong. An ad-hoc run: trigger it with the table and the keys.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param

from airflow_provider_dblog.operators.chain import DEFAULT_ARGS, dump_chain

with DAG(
    dag_id="dblog_repair",
    description="DBLog repair: dump the given primary keys of one table",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    default_args=DEFAULT_ARGS,
    render_template_as_native_obj=True,
    tags=["dblog", "cdc"],
    params={
        "table": Param(
            type="string",
            pattern=r"^[^.\s]+(\.[^.\s]+)?$",
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
