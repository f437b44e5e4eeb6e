"""The verify as a PySpark application: one stored verify run, each chunk's reads Spark jobs.

    spark-submit spark_jobs/verify.py --verify-id ID --config dblog.toml
    python spark_jobs/verify.py --verify-id ID --config dblog.toml --master 'local[2]'
    spark-submit spark_jobs/verify.py --verify-id ID --config-json '{"source": {...}, ...}'

One run of `airflow_provider_dblog.verify.spark_run.run_spark_verify`, on a run stored by `dblog
verify` or by Airflow's verify operator. The driver runs the same loop as `dblog verify`
(planning, controls, counts, retries, up to `parallelism` chunks in flight) and writes each
chunk's watermarks. Inside the chunk's inner window one Spark job reads and hashes the source's
key sub-ranges, a task each; once the target has applied the log through hw, a second job reads
the target's sub-ranges as hashes. Only hashes reach the driver, which compares them.

Each task opens the source, Redis and the target from the configuration: the workers need the
passwords' and the SQL target's `dsn_env` variables in their environment (never in Spark
properties, which the UI shows), or the lake's root and the event files at the driver's paths.
The package is shipped to the executors as `spark_jobs/dump.py` ships it.

Exit status: 0 when the run is done (differences or not: `dblog verify --verify-id ID` prints
its report), 2 on an error, 3 when it ended otherwise (cancelled, failed).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from airflow_provider_dblog.config import load_config, parse_config
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.state import VerifyState
from airflow_provider_dblog.verify.spark_run import run_spark_verify
from spark_jobs.dump import job_parser, json_object, spark_session

log = logging.getLogger("dblog.spark_verify")


def main(argv: Sequence[str] | None = None) -> int:
    parser = job_parser(__doc__, "--verify-id", "a verify run stored in Redis")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        if args.config is not None:
            loaded = load_config(args.config)
        else:
            loaded = parse_config(json_object(args.config_json), "--config-json")
    except DBLogError as exc:
        log.error("verify %s: %s", args.verify_id, exc)
        return 2
    spark = spark_session(f"dblog-verify-{args.verify_id}", args)
    try:
        state = run_spark_verify(
            spark.sparkContext,
            loaded,
            args.verify_id,
            tasks=args.tasks,
            window_timeout_s=args.window_timeout,
        )
    except DBLogError as exc:
        log.error("verify %s: %s", args.verify_id, exc)
        return 2
    finally:
        spark.stop()
    log.info("verify %s ended %s", args.verify_id, state)
    return 0 if state is VerifyState.DONE else 3


if __name__ == "__main__":
    sys.exit(main())
