"""One rule for a server whose programs are not installed: a skip on a developer's machine, a
failure in CI (`CI` set), where `scripts/setup.sh` must have installed them."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def installed(make: Callable[[], T]) -> T:
    """`make()`, or the skip / failure above when it raises FileNotFoundError."""
    try:
        return make()
    except FileNotFoundError as missing:
        if os.environ.get("CI"):
            pytest.fail(str(missing))
        pytest.skip(str(missing))
