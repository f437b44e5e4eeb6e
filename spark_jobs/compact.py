"""Fold the change stream (the tailer's NDJSON files) into the lake: one Delta Lake table per
source table, holding per key the row with the highest position (`airflow_provider_dblog.lake`).

    python spark_jobs/compact.py --input EVENTS_DIR --output LAKE_DIR --config dblog.toml
        [--master local[2]] [--prune | --prune-before COMMIT,SEQ]

One run of `airflow_provider_dblog.compaction.run.compact`: Spark parses and folds a large
backlog on its executors, a run of fewer new bytes than `--local-below` folds in the driver and
starts no Spark job; the driver merges each touched table with delta-rs, one commit per table
(more for a run larger than `--batch-rows` keys of a table) carrying the table's progress, so a
crash leaves each table at its last commit. `LAKE_DIR/_compact_state.json` says where to start
reading next time.

A table the lake does not hold yet is created with the lake schema of the source's catalog
(`--config`), or else of the run's first schema event of the table (`--source-type` names the
type mapping then). With `--prune`, tombstones positioned before the horizon the state store
gives (the oldest lw of the direct windows whose rows are not committed yet, or the tailer's
checkpoint) are removed from every table after the run; `--prune-before` names a horizon
instead (see `LakeTable.prune_tombstones` for what it must be).

The Python workers run the driver's interpreter, whatever the master, unless PYSPARK_PYTHON
(or `spark.pyspark.python` given to spark-submit) names another: on a cluster, the nodes need
a Python of the driver's version with the third-party dependencies at that path, or name
theirs. The application ships the package to the executors itself
(`airflow_provider_dblog.spark_package`) unless given `--no-ship-package`. The input
directory must have the same path on the driver and on every worker (a shared file system);
only the driver writes the lake.

One compaction at a time per output directory: a run holds an exclusive lock on
`LAKE_DIR/_compact.lock` and a second one is refused (exit status 75, try again later). The
lake's other writers, direct dumps, commit beside it: delta-rs runs a commit that lost a race
again on the new version.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from airflow_provider_dblog.compaction.lazy_spark import LazySpark
from airflow_provider_dblog.compaction.run import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_LOCAL_BELOW,
    DEFAULT_MERGE_FILES_AT,
    CompactionLocked,
    CompactOptions,
    compact,
)
from airflow_provider_dblog.config import load_config
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.lake.schema import LakeSchemaError
from airflow_provider_dblog.sources.factory import DEFAULT_TYPE, DIALECTS

EXIT_LOCKED = 75  # EX_TEMPFAIL: another compaction runs, try again later
EXIT_USAGE = 2


def _position(text: str) -> Position:
    commit, _, seq = text.partition(",")
    return Position(int(commit), int(seq or 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, required=True, help="directory of NDJSON events")
    parser.add_argument("--output", type=Path, required=True, help="lake root directory")
    parser.add_argument("--config", type=Path, help="dblog TOML: the source's catalog")
    parser.add_argument(
        "--source-type",
        choices=tuple(DIALECTS),
        help="type mapping of tables created from schema events (default: the config's)",
    )
    prune = parser.add_mutually_exclusive_group()
    prune.add_argument(
        "--prune-before",
        type=_position,
        metavar="COMMIT,SEQ",
        help="remove tombstones positioned before this horizon after the run",
    )
    prune.add_argument(
        "--prune",
        action="store_true",
        help="remove tombstones before the horizon the state store gives (needs --config)",
    )
    parser.add_argument(
        "--batch-rows",
        type=int,
        default=DEFAULT_BATCH_ROWS,
        help="at most this many keys of a table per merge (commit)",
    )
    parser.add_argument(
        "--local-below",
        type=int,
        default=DEFAULT_LOCAL_BELOW,
        metavar="BYTES",
        help="fold a run with fewer new bytes in the driver, starting no Spark job",
    )
    parser.add_argument(
        "--merge-files-at",
        type=int,
        default=DEFAULT_MERGE_FILES_AT,
        metavar="FILES",
        help="a table with deletion vectors merges the files its writes added once this many "
        "gathered (0: never)",
    )
    parser.add_argument("--master", help="Spark master; spark-submit's when omitted")
    parser.add_argument(
        "--no-ship-package",
        dest="ship_package",
        action="store_false",
        help="the workers have airflow_provider_dblog installed: do not send it to them",
    )
    args = parser.parse_args(argv)
    if args.config is not None:
        options = CompactOptions.of_source(
            load_config(args.config),
            source_type=args.source_type,
            prune=args.prune,
            prune_before=args.prune_before,
            batch_rows=args.batch_rows,
            local_below=args.local_below,
            merge_files_at=args.merge_files_at,
        )
    elif args.prune:
        parser.error("--prune reads the horizon from the state store: pass --config")
    else:
        options = CompactOptions(
            None,
            args.source_type or DEFAULT_TYPE,
            args.prune_before,
            args.batch_rows,
            args.local_below,
            args.merge_files_at,
        )
    spark = LazySpark(args.master, args.ship_package)
    try:
        report = compact(spark, args.input, args.output, options)
    except CompactionLocked as exc:
        print(f"compact: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    except LakeSchemaError as exc:
        print(f"compact: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        spark.stop()
    print(json.dumps(report.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
