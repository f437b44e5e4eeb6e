"""The dump as a PySpark application: one stored dump request, each chunk one Spark job.

    spark-submit spark_jobs/dump.py --dump-id ID --config dblog.toml
    python spark_jobs/dump.py --dump-id ID --config dblog.toml --master 'local[2]'
    spark-submit spark_jobs/dump.py --dump-id ID --config-json '{"source": {...}, ...}'

`--config-json` is what Airflow passes for a connection that holds the configuration itself
(no TOML file on the worker): the TOML's sections as JSON, checked by the same loader.

One run of `airflow_provider_dblog.dump.spark_run.run_spark_dump`. The driver runs the same loop
as `dblog dump` (planning, controls, progress, retries, up to `parallelism` windows in flight).
For each chunk it registers the window, writes lw, splits the chunk into key sub-ranges with
split keys the database finds through the primary-key index (a key chunk: its key list in
slices), and runs one Spark job of one task per sub-range; each task opens its own source
connection and reads its sub-range. Then the driver writes hw, waits for the tailer to record
the window and stores progress. Rows never pass through the driver, only counts come back:
- a dump (`mode = "sequenced"`): each task appends its rows straight into the window in Redis,
  and the tailer emits them (`dump/spark_chunk.py`);
- a direct dump (`mode = "direct"`): each task stages its rows into the direct target and
  stores only the read's transactions in Redis; once the tailer recorded the window the driver
  commits the chunk's staged parts once, the keys the window changed dropped
  (`dump/spark_direct.py`). No row is kept in Spark between jobs.
A run of the same request after a kill resumes from the last completed chunk; a window the
killed run left open expires in the tailer. A task that finds the source gone (a restart, a
failover) says so instead of failing: the driver retries the chunk with new watermarks until the
source is back, for up to `--source-patience` seconds.

Credentials never travel in argv or Spark properties: each task reads the passwords from the
environment variables the TOML names (`password_env`). Local executors inherit the driver's
environment; on a cluster, set those variables on the workers (their spark-env.sh, or the
container's secrets), never with `spark.executorEnv.*`, which the UI shows.

The Python workers run the driver's interpreter, whatever the master, unless PYSPARK_PYTHON
(or `spark.pyspark.python` given to spark-submit) names another. On a cluster, the nodes need
a Python of the driver's version with msgspec, `redis` and the source's driver installed
(`psycopg[binary]` for PostgreSQL, PyMySQL for MySQL/MariaDB: nothing here names a source
type, each task reads through `source.chunk_source()`) at that path, or name theirs; and the
password variables in their environment. This package need not be installed there: the
application ships it to the executors itself, as a zip (`airflow_provider_dblog.spark_package`),
unless given `--no-ship-package` or the zip is already among its `--py-files`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from pyspark.sql import SparkSession

from airflow_provider_dblog.config import ConfigError, load_config, parse_config
from airflow_provider_dblog.dump.retry import SOURCE_PATIENCE_S
from airflow_provider_dblog.dump.runner import DumpFailed
from airflow_provider_dblog.dump.spark_run import run_spark_dump
from airflow_provider_dblog.spark_package import ship_package, use_driver_python
from airflow_provider_dblog.state import DumpState
from airflow_provider_dblog.targets import direct_target_for

log = logging.getLogger("dblog.spark_dump")


def main(argv: Sequence[str] | None = None) -> int:
    parser = job_parser(__doc__, "--dump-id", "a dump request stored in Redis")
    parser.add_argument(
        "--source-patience",
        type=float,
        default=SOURCE_PATIENCE_S,
        help="seconds to wait for a source or Redis that went away before failing",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.config is not None:
        config = load_config(args.config)
    else:
        config = parse_config(json_object(args.config_json), "--config-json")
    spark = spark_session(f"dblog-dump-{args.dump_id}", args)
    try:
        state = run_spark_dump(
            spark.sparkContext,
            config,
            args.dump_id,
            direct_target_for,
            tasks=args.tasks,
            window_timeout_s=args.window_timeout,
            source_patience_s=args.source_patience,
        )
    except DumpFailed as exc:
        log.error("dump %s failed: %s", args.dump_id, exc)
        return 1
    finally:
        spark.stop()
    log.info("dump %s ended %s", args.dump_id, state)
    return 0 if state is DumpState.DONE else 3


def job_parser(doc: str | None, id_option: str, id_help: str) -> argparse.ArgumentParser:
    """The options a stored run's Spark application takes (the verify application's too): the
    run's id, the configuration, tasks per chunk, the window timeout, where Spark runs."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument(id_option, required=True, help=id_help)
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
    return parser


def spark_session(name: str, args: argparse.Namespace) -> SparkSession:
    """The application's session (`--master`), the package shipped to its workers unless
    `--no-ship-package`."""
    use_driver_python()
    builder = SparkSession.builder.appName(name)
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    if args.ship_package:
        ship_package(spark.sparkContext)
    return spark


def json_object(text: str) -> dict[str, Any]:
    """`--config-json`'s object (the verify application reads it too)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--config-json is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("--config-json must be a JSON object of the TOML's sections")
    return data


if __name__ == "__main__":
    sys.exit(main())
