"""What every `dblog` command shares: the config file option, the objects built from it, and
the checks of option values (argparse refuses a bad one with exit status 2, naming the flag)."""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
from collections.abc import Callable

from airflow_provider_dblog.config import Config, load_config
from airflow_provider_dblog.state import StateStore

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


DUMP_ID = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
"""What a dump id may be: the ids `dblog dump` and the Airflow operators make, and any a person
types that can live in a Redis key and on a command line without quoting."""


def dump_id(text: str) -> str:
    if not DUMP_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a dump id: 1 to 200 letters, digits, '_', '.', ':' or '-'"
        )
    return text


_INTEGER = re.compile(r"[+-]?[0-9]+")
"""A whole number as people write it: ASCII digits only (Python's int() also takes "1_000"
and other scripts' digits)."""


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least `minimum`."""

    def parse(text: str) -> int:
        if not _INTEGER.fullmatch(text.strip()):
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def finite_number(minimum: float, *, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number, at least `minimum` (or above it), in ASCII (no
    digit separators)."""

    def parse(text: str) -> float:
        try:
            if not text.isascii() or "_" in text:
                raise ValueError(text)
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if value < minimum or (above and value == minimum):
            raise argparse.ArgumentTypeError(
                f"{value:g} must be {'above' if above else 'at least'} {minimum:g}"
            )
        return value

    return parse


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
