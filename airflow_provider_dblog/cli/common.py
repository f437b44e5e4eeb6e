"""What every `dblog` command shares: the config file option, the objects built from it, and
the checks of option values (argparse refuses a bad one with exit status 2, naming the flag)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import Protocol, TypeVar

from airflow_provider_dblog.config import Config, load_config
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.state import StateStore

T = TypeVar("T")
DEFAULT_CONFIG = "dblog.toml"


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        "-c",
        default=os.environ.get("DBLOG_CONFIG", DEFAULT_CONFIG),
        help="the TOML configuration file (default: $DBLOG_CONFIG or %(default)s)",
    )


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def config_of(args: argparse.Namespace) -> Config:
    return load_config(args.config)


def store_of(config: Config) -> StateStore:
    return StateStore(config.redis_client(), config.source.name)


def option(parse: Callable[[str], T]) -> Callable[[str], T]:
    """`parse` (a rule of `core.values`) as an argparse type: its `InvalidRequest` becomes
    argparse's error, which names the flag and exits with status 2."""

    def checked(text: str) -> T:
        try:
            return parse(text)
        except InvalidRequest as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return checked


def one_line(text: str) -> str:
    """`text` on one line: its lines (a database error's statement, the caret under it, its
    hint) joined with " | "."""
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


def first_line(text: str, width: int = 100) -> str:
    """The first line of `text`, cut to `width` characters: a reason in a table's cell."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    head = lines[0]
    return head if len(head) <= width else head[: width - 1] + "…"


CLONE_ONLY = ("airflow_provider_dblog.demo", "airflow_provider_dblog.devservices")
"""The packages the wheel leaves out (pyproject's `packages.find`): they run from a clone."""


def from_a_clone(
    verb: str, run: Callable[[argparse.Namespace], int]
) -> Callable[[argparse.Namespace], int]:
    """`run` (the handler of `dblog <verb>`), or one line saying where it runs when the
    installed package leaves the demo and the throwaway servers out."""

    def checked(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith(CLONE_ONLY):
                raise
            print(
                f"dblog {verb} runs from a clone of the repository, not from the installed "
                "wheel: git clone it, then bash scripts/setup.sh && .venv/bin/dblog "
                f"{verb}",
                file=sys.stderr,
            )
            return 2

    return checked


class Controlled(Protocol):
    """The controls a run's store offers, a dump's and a verify run's alike."""

    def pause(self, run_id: str) -> bool: ...
    def resume(self, run_id: str) -> bool: ...
    def cancel(self, run_id: str) -> bool: ...
    def throttle(
        self,
        run_id: str,
        *,
        chunk_size: int | None = None,
        delay_ms: int | None = None,
        max_rows_per_s: float | None = None,
    ) -> bool: ...


def control(runs: Controlled, what: str, run_id: str, args: argparse.Namespace) -> int:
    """`args.action` (pause, resume, cancel, throttle) asked of the run `run_id` (a `what`:
    dump, verify); 1 and one line when it is finished or unknown."""
    if args.action == "throttle":
        pace = {k: getattr(args, k) for k in ("chunk_size", "delay_ms", "max_rows_per_s")}
        done, said = runs.throttle(run_id, **pace), "throttle updated"
    else:
        done = getattr(runs, args.action)(run_id)
        said = f"{args.action} requested"
    if not done:
        print(f"{what} {run_id} is finished or unknown", file=sys.stderr)
        return 1
    print(f"{what} {run_id}: {said}")
    return 0
