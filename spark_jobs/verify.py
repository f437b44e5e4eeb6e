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

import argparse
import logging
import sys
from collections.abc import Sequence

from pyspark.sql import SparkSession

from airflow_provider_dblog.config import load_config, parse_config
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.spark_package import ship_package, use_driver_python
from airflow_provider_dblog.state import VerifyState
from airflow_provider_dblog.verify.spark_run import run_spark_verify
from spark_jobs.dump import json_object

log = logging.getLogger("dblog.spark_verify")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify-id", required=True, help="a verify run stored in Redis")
    config = parser.add_mutually_exclusive_group(required=True)
    config.add_argument("--config", help="the dblog TOML file")
    config.add_argument(
        "--config-json",
        help="the TOML's sections as one JSON object (what an Airflow connection holds)",
    )
    parser.add_argument("--tasks", type=int, help="tasks per chunk (default: Spark's parallelism)")
    parser.add_argument("--window-timeout", type=float, default=60.0, help="seconds")
    parser.add_argument("--master", help="when run with python, not spark-submit: e.g. local[2]")
    parser.add_argument(
        "--no-ship-package",
        dest="ship_package",
        action="store_false",
        help="the workers have airflow_provider_dblog installed: do not send it to them",
    )
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
    use_driver_python()
    builder = SparkSession.builder.appName(f"dblog-verify-{args.verify_id}")
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    try:
        if args.ship_package:
            ship_package(spark.sparkContext)
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
