"""### dblog_lake_compaction: the lake folded in batches

`dblog lake compact` as a scheduled DAG, for deployments that fold in batches rather than run
`dblog lake compact --follow` beside the tailer: each run folds the events the tailer wrote
since the last one (`[output] directory` of the `dblog` connection's configuration) into the
lake (`[lake] root`), new tables taking the source catalog's schema. A backlog of 64 MiB or
more folds on Spark (the worker's default master), a smaller one in the task's process.

When another compaction holds the lake's lock (a follower's run, `dblog lake maintain`, a run
started by hand) the run is skipped: the next one folds what this one would have. So is every
run of a deployment whose configuration has no `[lake] root`; one whose output is not NDJSON
fails. Its XCom (`compact` task, `return_value`) is the run's report: events folded, rows per
table, the position reached.

Schedule: `$DBLOG_LAKE_COMPACTION_SCHEDULE` (cron, default every 10 minutes); catchup is off,
one run at a time. Triggered by hand, this form sets **prune**: after the run, remove the
tombstones positioned before the horizon the state store gives.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import DAG, Param, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_provider_dblog.operators.chain import DAG_DEFAULTS, DBLOG_CONN_ID

with DAG(
    dag_id="dblog_lake_compaction",
    description="DBLog lake: fold the tailer's new events into the Delta tables",
    doc_md=__doc__,
    schedule=os.environ.get("DBLOG_LAKE_COMPACTION_SCHEDULE", "*/10 * * * *"),
    max_active_runs=1,
    **DAG_DEFAULTS,
    params={
        "prune": Param(
            False,
            type="boolean",
            description_md=(
                "After the run, remove the tombstones (deleted keys) positioned before the "
                "horizon the state store gives: the oldest uncommitted direct window, or the "
                "tailer's checkpoint."
            ),
        ),
    },
) as dag:

    @task
    def compact(params: Any = None) -> dict[str, Any]:
        """One compaction run through the hook's configuration; a held lock skips it."""
        from airflow_provider_dblog.compaction.lazy_spark import LazySpark
        from airflow_provider_dblog.compaction.run import (
            CompactionLocked,
            CompactOptions,
            compaction_paths,
        )
        from airflow_provider_dblog.compaction.run import compact as run_compaction
        from airflow_provider_dblog.config import ConfigError
        from airflow_provider_dblog.hooks.dblog import DBLogHook
        from airflow_provider_dblog.lake.schema import LakeSchemaError

        config = DBLogHook(DBLOG_CONN_ID).config
        if config.lake_root is None:  # a deployment without a lake: nothing to fold
            raise AirflowSkipException("the dblog connection's configuration has no [lake] root")
        try:
            input_dir, lake = compaction_paths(config)
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None
        options = CompactOptions.of_source(config, prune=params["prune"])
        spark = LazySpark(None, ship=True)
        try:
            report = run_compaction(spark, input_dir, lake, options)
        except CompactionLocked as exc:
            raise AirflowSkipException(str(exc)) from None
        except LakeSchemaError as exc:  # a table to rebuild: retrying will not help
            raise AirflowFailException(str(exc)) from None
        finally:
            spark.stop()
        return report.to_json()

    compact()
