"""The `dblog` command line.

Each subcommand lives in its own module with a `register(subparsers)` function.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from airflow_provider_dblog.cli import dev_services


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dblog", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    dev_services.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
