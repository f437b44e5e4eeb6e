"""### dblog_dump: a DBLog dump on demand

Re-emits the current rows of the captured tables into the tailer's output, between
watermarks, without locking the tables or stalling the log. Its trigger form takes:

- **tables** empty: every captured table; or the tables chosen.
- **keys** empty: whole tables; or primary keys of the one table chosen, as
  `dblog dump --keys` takes them: `1,2,3`, or JSON `[["eu", 1], ["us", 2]]` for a
  composite key.
- **where** empty: no filter; or a condition in the source's SQL on the one table chosen
  (no keys): only the rows matching it when they are read are re-sent, e.g.
  `region = 'eu' AND updated >= '2026-11-23'`. A row that stops matching later is not
  deleted downstream.
- **chunk_size**: rows one chunk reads (with keys: how many of the keys); empty: 10,000
  sequenced, 100,000 direct. **parallelism**: chunks read at once.
- **mode**: sequenced (the tailer sends the rows through the ordered output, with the live
  changes) or direct (the dump writes them into a target that keeps the newest row per
  primary key); empty: the deployment's default.
- **read_only** on: nothing is written to the source database (the watermarks are positions
  in its log); sequenced only, and refused on MySQL.

Counts below 1, and keys that fit no table's key (a key with no value, keys unlike the
first), are refused when you press Trigger. The run checks the rest of the request
first (`check_request`: unknown tables, malformed keys, a filter the source refuses fail it
at once, every problem in one message, before anything is registered), waits for a healthy
tailer, then runs the dump on Spark (`dump`). The dump task's log shows the rows done, the
rate and the time left as it runs; its XCom holds the rows, chunks and retried chunks, and
where the Spark driver's log is; a retry resumes from the last completed chunk.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from airflow_provider_dblog.operators.chain import DAG_DEFAULTS, DBLOG_CONN_ID, dump_chain
from airflow_provider_dblog.operators.params import (
    ParamValue,
    captured_table_names,
    chunk_size_param,
    keys_param,
    mode_param,
    parallelism_param,
    read_only_param,
    tables_param,
    where_param,
)

with DAG(
    dag_id="dblog_dump",
    description="DBLog dump on demand: tables, keys or a filter, chunk size, parallelism",
    doc_md=__doc__,
    schedule=None,
    **DAG_DEFAULTS,
    params={
        "source": Param(
            DBLOG_CONN_ID,
            type="string",
            minLength=1,
            description="The dblog connection of the source (the table choices are its own)",
        ),
        "tables": tables_param(captured_table_names(DBLOG_CONN_ID)),
        "keys": keys_param(when_empty="whole tables, or the rows matching **where**"),
        "where": where_param(),
        "chunk_size": chunk_size_param(),
        "parallelism": parallelism_param(1),
        "mode": mode_param(),
        "read_only": read_only_param(),
    },
) as dag:
    dump_chain(
        dblog_conn_id=ParamValue("source"),
        tables=ParamValue("tables"),
        keys=ParamValue("keys"),
        where=ParamValue("where"),
        chunk_size=ParamValue("chunk_size"),
        parallelism=ParamValue("parallelism"),
        mode=ParamValue("mode"),
        read_only=ParamValue("read_only"),
    )
