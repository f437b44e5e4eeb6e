"""The rules for values a person types, shared by the `dblog` command line and the live view's
controls, so one mistake gets one message wherever it is made. Each raises `InvalidRequest`;
the command line turns it into argparse's error (`cli.common.option`), which names the flag."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from airflow_provider_dblog.core.errors import InvalidRequest

DUMP_ID = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
"""What a dump id may be: the ids `dblog dump` and the Airflow operators make, and any a person
types that can live in a Redis key and on a command line without quoting."""


def dump_id(text: str) -> str:
    if not DUMP_ID.fullmatch(text):
        raise InvalidRequest(
            f"{text!r} is not a dump id: 1 to 200 letters, digits, '_', '.', ':' or '-'"
        )
    return text


_INTEGER = re.compile(r"[+-]?[0-9]+")
"""A whole number as people write it: ASCII digits only (Python's int() also takes "1_000"
and other scripts' digits)."""


def whole_number(minimum: int) -> Callable[[str], int]:
    """A parser of a whole number of at least `minimum`."""

    def parse(text: str) -> int:
        if not _INTEGER.fullmatch(text.strip()):
            raise InvalidRequest(f"{text!r} is not a whole number")
        value = int(text)
        if value < minimum:
            raise InvalidRequest(f"must be at least {minimum}, got {value}")
        return value

    return parse


def finite_number(minimum: float, *, above: bool = False) -> Callable[[str], float]:
    """A parser of a finite number, at least `minimum` (or above it), in ASCII (no digit
    separators)."""

    def parse(text: str) -> float:
        try:
            if not text.isascii() or "_" in text:
                raise ValueError(text)
            value = float(text)
        except ValueError:
            raise InvalidRequest(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise InvalidRequest(f"{text!r} is not a finite number")
        if value < minimum or (above and value == minimum):
            raise InvalidRequest(
                f"{value:g} must be {'above' if above else 'at least'} {minimum:g}"
            )
        return value

    return parse
