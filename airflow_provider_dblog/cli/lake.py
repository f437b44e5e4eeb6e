"""`dblog lake`: the lake's Delta tables under `[lake] root`.

`dblog lake compact` folds the tailer's NDJSON files (`[output] directory`) into the lake: one
run, its report printed as JSON; exit status 75 when another run holds the lake's lock. With
`--follow` it is a service beside the tailer (`compaction/follow.py`): it folds new events as
they come, looking every `--interval` seconds, while it holds the source's compaction lease
(another `--follow` stands by and takes over when it dies); it lets the lake's lock go between
runs so `dblog lake maintain` runs too, serves its metrics (freshness) with `--metrics-port`,
and exits 0 on SIGINT/SIGTERM, 1 with the cause on an error it cannot ride through. Either way
a backlog of `--local-below` bytes or more folds on Spark (`--master`; the driver's Python
runs the workers), a smaller one in this process.

`dblog lake maintain`: per table, each holding the lake's compaction lock (waiting up to
`--lock-timeout` seconds for a running compaction): the small files compacted (optimize), the
files no version within the retention needs removed (vacuum), the log checkpointed (see
`compaction/maintenance.py`). With none of `--optimize`, `--vacuum`, `--checkpoint`, all three
run. One line per table says what each step did. Exit status 75 when the compaction's lock
stays held, as for a second compaction; 2 for a retention below the floor, a table the lake
lacks, or no `[lake] root`.

`dblog lake enable-deletion-vectors`: per table, Delta's deletion vectors turned on (a
protocol upgrade: readers must support them), after which a write marks the rows it replaces
deleted instead of rewriting their files, and `maintain --optimize` folds the marks away
(`docs/adr/0009-deletion-vectors.md`). Tables created later start without: run it again.
Exit status 2 for a table the lake lacks or no `[lake] root`.

The compaction and maintenance code (and delta-rs, Spark) is imported only when a command
runs.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any

from airflow_provider_dblog.cli.common import (
    add_config_option,
    config_of,
    one_line,
    option,
    setup_logging,
)
from airflow_provider_dblog.core import values
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import TableRef

EXIT_LOCKED = 75  # EX_TEMPFAIL, as spark_jobs/compact.py exits when the lock is held
DEFAULT_RETENTION_HOURS = 168
DEFAULT_LOCK_TIMEOUT_S = 900.0
"""The defaults of `compaction.maintenance` (a unit test holds them together), spelled here so
that building the parser imports no Delta code."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "lake", help="the lake's Delta tables: maintenance", description=__doc__
    )
    actions = parser.add_subparsers(dest="action", required=True)
    maintain = actions.add_parser(
        "maintain",
        help="compact small files, vacuum unreferenced ones, checkpoint the log, per table",
    )
    add_config_option(maintain)
    maintain.add_argument(
        "--table",
        action="append",
        type=_table,
        help="a lake table, 'schema.table' (repeatable; default: every table under the root)",
    )
    maintain.add_argument("--optimize", action="store_true", help="compact small files")
    maintain.add_argument(
        "--vacuum", action="store_true", help="remove files no version within the retention needs"
    )
    maintain.add_argument(
        "--checkpoint", action="store_true", help="checkpoint the Delta log, drop expired entries"
    )
    maintain.add_argument(
        "--retention-hours",
        type=option(values.whole_number(0)),
        default=DEFAULT_RETENTION_HOURS,
        help="the vacuum keeps files removed less than this ago (default %(default)s, "
        "at least 1): time travel reaches back this far",
    )
    maintain.add_argument(
        "--dry-run",
        action="store_true",
        help="change nothing; list how many files the vacuum would remove",
    )
    maintain.add_argument(
        "--lock-timeout",
        type=option(values.finite_number(0)),
        default=DEFAULT_LOCK_TIMEOUT_S,
        help="seconds to wait for a running compaction (default %(default)s)",
    )
    maintain.set_defaults(func=_maintain)
    vectors = actions.add_parser(
        "enable-deletion-vectors",
        help="writes mark replaced rows deleted instead of rewriting files, per table",
    )
    add_config_option(vectors)
    vectors.add_argument(
        "--table",
        action="append",
        type=_table,
        help="a lake table, 'schema.table' (repeatable; default: every table under the root, "
        "and those created there later)",
    )
    vectors.set_defaults(func=_enable_deletion_vectors)
    _register_compact(actions)


def _register_compact(actions: argparse._SubParsersAction[Any]) -> None:
    compact = actions.add_parser(
        "compact", help="fold the tailer's event files into the lake: once, or --follow"
    )
    add_config_option(compact)
    compact.add_argument(
        "--follow",
        action="store_true",
        help="keep folding new events until stopped, one follower of the source at a time",
    )
    compact.add_argument(
        "--interval",
        type=option(values.finite_number(0, above=True)),
        default=DEFAULT_INTERVAL_S,
        help="--follow: seconds between looks for new events (default %(default)s)",
    )
    compact.add_argument(
        "--lease-ttl-ms",
        type=option(values.whole_number(100)),
        default=DEFAULT_LEASE_TTL_MS,
        help="--follow: a standby takes over this long after the folder died (default %(default)s)",
    )
    compact.add_argument(
        "--metrics-port",
        type=option(_port),
        help="--follow: serve Prometheus metrics on this TCP port (default: none)",
    )
    compact.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        help="--follow: the address the metrics endpoint binds to (default %(default)s)",
    )
    compact.add_argument("--owner", help="--follow: lease owner name (default: host:pid)")
    compact.add_argument(
        "--prune",
        action="store_true",
        help="after each run, remove tombstones before the horizon the state store gives",
    )
    compact.add_argument(
        "--local-below",
        type=option(values.whole_number(0)),
        default=DEFAULT_LOCAL_BELOW,
        metavar="BYTES",
        help="fold a run of fewer new bytes in this process, not on Spark (default %(default)s)",
    )
    compact.add_argument(
        "--merge-files-at",
        type=option(values.whole_number(0)),
        default=DEFAULT_MERGE_FILES_AT,
        metavar="FILES",
        help="a table with deletion vectors merges the files its writes added once this many "
        "gathered (0: never, leave it to `dblog lake maintain`; default %(default)s)",
    )
    compact.add_argument("--master", help="the Spark master of a large backlog's runs")
    compact.set_defaults(func=_compact)


DEFAULT_INTERVAL_S = 1.0
DEFAULT_LEASE_TTL_MS = 15_000
DEFAULT_LOCAL_BELOW = 64 * 1024 * 1024
DEFAULT_MERGE_FILES_AT = 32  # compaction.run's, without importing it to parse arguments


def _port(text: str) -> int:
    port = values.whole_number(1)(text)
    if port > 65535:
        raise InvalidRequest(f"a TCP port is 1-65535, got {port}")
    return port


def _table(text: str) -> TableRef:
    try:
        return TableRef.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _maintain(args: argparse.Namespace) -> int:
    from airflow_provider_dblog.compaction.maintenance import (
        MaintenanceOptions,
        maintain_lake,
    )
    from airflow_provider_dblog.compaction.run import CompactionLocked
    from airflow_provider_dblog.lake.schema import LakeSchemaError

    chosen = (args.optimize, args.vacuum, args.checkpoint)
    every = not any(chosen)
    options = MaintenanceOptions(  # refuses a retention below the floor, before any work
        optimize=every or args.optimize,
        vacuum=every or args.vacuum,
        checkpoint=every or args.checkpoint,
        retention_hours=args.retention_hours,
        dry_run=args.dry_run,
        lock_timeout_s=args.lock_timeout,
    )
    config = config_of(args)
    if config.lake_root is None:
        message = f"{args.config} has no [lake] root: no lake to maintain"
        print(f"dblog: error: {message}", file=sys.stderr)
        return 2
    try:
        reports = maintain_lake(
            config.lake_root,
            args.table,
            options,
            done=lambda r: print(r.describe(options.retention_hours), flush=True),
        )
    except CompactionLocked as exc:
        print(f"dblog: error: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    except LakeSchemaError as exc:
        print(f"dblog: error: {exc}", file=sys.stderr)
        return 2
    if not reports:
        print(f"no lake tables under {config.lake_root}: nothing to maintain")
    return 0


def _enable_deletion_vectors(args: argparse.Namespace) -> int:
    from airflow_provider_dblog.compaction.maintenance import enable_deletion_vectors
    from airflow_provider_dblog.lake.schema import LakeSchemaError

    config = config_of(args)
    if config.lake_root is None:
        print(f"dblog: error: {args.config} has no [lake] root: no lake tables", file=sys.stderr)
        return 2
    try:
        done = enable_deletion_vectors(config.lake_root, args.table)
    except LakeSchemaError as exc:
        print(f"dblog: error: {exc}", file=sys.stderr)
        return 2
    for table, changed in done:
        print(f"{table}: deletion vectors {'enabled' if changed else 'were enabled already'}")
    if args.table is None:
        print(f"tables created under {config.lake_root} from now on: deletion vectors enabled")
    return 0


def _compact(args: argparse.Namespace) -> int:
    from airflow_provider_dblog.compaction.follow import Follower, FollowFailed, FollowSettings
    from airflow_provider_dblog.compaction.lazy_spark import LazySpark
    from airflow_provider_dblog.compaction.run import (
        CompactionLocked,
        CompactOptions,
        compact,
        compaction_paths,
    )
    from airflow_provider_dblog.lake.schema import LakeSchemaError
    from airflow_provider_dblog.state import CompactorStore

    config = config_of(args)
    input_dir, output = compaction_paths(config)  # a ConfigError: exit 2, as every refusal

    def options() -> CompactOptions:
        return CompactOptions.of_source(
            config,
            prune=args.prune,
            local_below=args.local_below,
            merge_files_at=args.merge_files_at,
        )

    spark = LazySpark(args.master, ship=True)
    try:
        if not args.follow:
            print(json.dumps(compact(spark, input_dir, output, options()).to_json()))
            return 0
        setup_logging()
        settings = FollowSettings(
            args.interval, args.lease_ttl_ms, args.metrics_port, args.metrics_address
        )
        store = CompactorStore(config.redis_client(), config.source.name)
        follower = Follower(
            store, input_dir, output, options, spark, owner=args.owner, settings=settings
        )
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        follower.run(stop)
        return 0
    except CompactionLocked as exc:
        print(f"dblog: error: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    except LakeSchemaError as exc:
        print(f"dblog: error: {exc}", file=sys.stderr)
        return 2
    except FollowFailed as exc:
        print(f"dblog: error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
