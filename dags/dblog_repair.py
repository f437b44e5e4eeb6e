"""### dblog_repair: re-send given rows of one table

Re-emits the current rows of one table that a consumer reported wrong: the rows of the given
primary keys, or the rows matching a filter (a subset a bug touched, without listing its
keys). Trigger it from its form (Trigger), or from the REST API with
`{"conf": {"table": "public.orders", "keys": [["eu", 1]]}}` or
`{"conf": {"table": "public.orders", "where": "region = 'eu' AND n > 100"}}`:

- **table**: `schema.table`, one of the captured tables.
- **keys**: as `dblog dump --keys` takes them: `17,42`, or JSON `[["eu", 1], ["us", 2]]`
  for a composite key (one list per key, in primary-key order).
- **where**: instead of keys, a condition in the source's SQL on the table's own columns:
  the rows matching it when they are read are re-sent; a row that stops matching later is
  not deleted downstream (its change travels in the log). Give keys or where, not both.
- **chunk_size**: rows one chunk reads: with keys, how many of the keys (a row each); with a
  filter, rows of the table (those matching it are sent). Empty: 10,000 (100,000 in a
  deployment with a lake).
- **read_only** on: nothing is written to the source database (the watermarks are positions
  in its log); refused on MySQL.

A chunk size below 1, and keys that fit no table's key (a key with no value, keys unlike
the first: `[["eu", 1], ["us"]]`), are refused when you press Trigger. The run then checks
the rest of the request first (`check_request`): an unknown table, keys that do not fit the
table's primary key, a filter the source refuses (a syntax error, an unknown column, another
table, a function with side effects), or neither keys nor a filter fail it at once, every
problem in one message. It waits for a healthy tailer, then runs the dump on Spark (`dump`);
its log shows the rows done, the rate and the time left as the dump runs, its XCom holds the
rows and chunks and where the Spark driver's log is, and its Details tab links to the dump in
`dblog ui` when the connection has a `ui_url`.
"""

from __future__ import annotations

from airflow.sdk import DAG

from airflow_provider_dblog.operators.chain import DAG_DEFAULTS, DBLOG_CONN_ID, dump_chain
from airflow_provider_dblog.operators.params import (
    REPAIR_CHUNK_SIZE_HELP,
    ParamValue,
    captured_table_names,
    chunk_size_param,
    keys_param,
    read_only_param,
    table_param,
    where_param,
)

with DAG(
    dag_id="dblog_repair",
    description="DBLog repair: dump given primary keys, or rows matching a filter, of one table",
    doc_md=__doc__,
    schedule=None,
    **DAG_DEFAULTS,
    params={
        "table": table_param(captured_table_names(DBLOG_CONN_ID)),
        "keys": keys_param(when_empty="the rows matching **where** (give one of the two)"),
        "where": where_param(),
        "chunk_size": chunk_size_param(REPAIR_CHUNK_SIZE_HELP),
        "read_only": read_only_param(),
    },
) as dag:
    dump_chain(
        tables=[ParamValue("table")],
        keys=ParamValue("keys"),
        where=ParamValue("where"),
        chunk_size=ParamValue("chunk_size"),
        read_only=ParamValue("read_only"),
        subset_only=True,
    )
