"""### dblog_repair: re-send given rows of one table

Re-emits the current rows of the given primary keys of one table, e.g. keys a consumer
reported wrong. Trigger it from its form (Trigger), or from the REST API with
`{"conf": {"table": "public.orders", "keys": [["eu", 1]]}}`:

- **table**: `schema.table`, one of the captured tables.
- **keys**: as `dblog dump --keys` takes them: `17,42`, or JSON `[["eu", 1], ["us", 2]]`
  for a composite key (one list per key, in primary-key order).
- **chunk_size**: keys per chunk.

The run checks the request first (`check_request`: an unknown table or a key that does not
fit the table's primary key fails there, in words), waits for a healthy tailer, then runs
the dump on Spark (`dump`), whose XCom holds the rows and chunks and the Spark driver's log.
"""

from __future__ import annotations

from airflow.sdk import DAG

from airflow_provider_dblog.operators.chain import DAG_DEFAULTS, DBLOG_CONN_ID, dump_chain
from airflow_provider_dblog.operators.params import (
    ParamValue,
    captured_table_names,
    chunk_size_param,
    keys_param,
    table_param,
)

with DAG(
    dag_id="dblog_repair",
    description="DBLog repair: dump the given primary keys of one table",
    doc_md=__doc__,
    schedule=None,
    **DAG_DEFAULTS,
    params={
        "table": table_param(captured_table_names(DBLOG_CONN_ID)),
        "keys": keys_param(required=True),
        "chunk_size": chunk_size_param(1000),
    },
) as dag:
    dump_chain(
        tables=[ParamValue("table")],
        keys=ParamValue("keys"),
        chunk_size=ParamValue("chunk_size"),
    )
