"""The `dblog` command line: `DESCRIPTION` is what `dblog --help` tells a user; each
subcommand lives in its own module with a `register(subparsers)` function."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from airflow_provider_dblog.cli import interrupts
from airflow_provider_dblog.core.errors import DBLogError

DESCRIPTION = """\
Change data capture for PostgreSQL and MySQL/MariaDB, after Netflix's DBLog.

`dblog tail` follows the database's log and sends every committed change, in
commit order, to the output (NDJSON files, a Redis Stream, SQL tables or a Delta
lake). `dblog dump` re-sends the current rows of tables, of given primary keys
or of rows matching a filter through the same output, chunk by chunk, without
locking the tables or pausing the changes. Settings are in a TOML file
(--config, default $DBLOG_CONFIG or dblog.toml)."""

EPILOG = """\
To try it: `dblog demo` runs everything on local servers it starts. Each
command's options: `dblog COMMAND --help`."""


def build_parser() -> argparse.ArgumentParser:
    # Imported here: `main` handles Ctrl-C before these imports (seconds on a busy machine).
    from airflow_provider_dblog.cli import (
        demo,
        dev_services,
        dump,
        lake,
        prune,
        status,
        tail,
        ui,
        verify,
    )

    parser = argparse.ArgumentParser(
        prog="dblog",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    demo.register(subparsers)
    tail.register(subparsers)
    dump.register(subparsers)
    verify.register(subparsers)
    prune.register(subparsers)
    lake.register(subparsers)
    status.register(subparsers)
    ui.register(subparsers)
    dev_services.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; an error it refuses with is one line and exit status 2, a Ctrl-C one
    line and 130 (`interrupts`)."""
    words = list(sys.argv[1:] if argv is None else argv)
    with interrupts.handled() as interrupt:
        if words and not words[0].startswith("-"):  # the command, before it is parsed
            interrupt.command = f"dblog {words[0]}"
        try:
            return _run(build_parser().parse_args(words))
        except KeyboardInterrupt:
            return interrupt.end()


def _run(args: argparse.Namespace) -> int:
    from airflow_provider_dblog.cli.common import one_line  # loaded with the commands

    try:
        result: int = args.func(args)
    except DBLogError as exc:
        print(f"dblog: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
