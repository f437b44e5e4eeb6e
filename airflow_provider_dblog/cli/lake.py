"""`dblog lake maintain`: the upkeep of the lake's Delta tables under `[lake] root`.

Per table, each holding the lake's compaction lock (waiting up to `--lock-timeout` seconds for
a running compaction): the small files compacted (optimize), the files no version within the
retention needs removed (vacuum), the log checkpointed (see `compaction/maintenance.py`). With
none of `--optimize`, `--vacuum`, `--checkpoint`, all three run. One line per table says what
each step did. Exit status 75 when the compaction's lock stays held, as for a second
compaction; 2 for a retention below the floor, a table the lake lacks, or no `[lake] root`.
The maintenance code (and delta-rs) is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from airflow_provider_dblog.cli.common import add_config_option, config_of, option
from airflow_provider_dblog.core import values
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
