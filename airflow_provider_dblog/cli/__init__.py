"""The `dblog` command line.

Each subcommand lives in its own module with a `register(subparsers)` function.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from airflow_provider_dblog.cli import demo, dev_services, dump, lake, prune, status, tail, ui
from airflow_provider_dblog.cli.common import one_line
from airflow_provider_dblog.core.errors import DBLogError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dblog", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    demo.register(subparsers)
    tail.register(subparsers)
    dump.register(subparsers)
    prune.register(subparsers)
    lake.register(subparsers)
    status.register(subparsers)
    ui.register(subparsers)
    dev_services.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
    except DBLogError as exc:
        print(f"dblog: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
