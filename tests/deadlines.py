"""How long the tests' waits wait, on a machine that may be loaded.

A wait returns as soon as its condition holds, so its deadline costs a passing test nothing: it
only bounds how long a failing one takes to say so. CI machines are shared, and a deadline
written for a quiet one fails there on timing, not on behaviour. Every wait helper therefore
stretches its deadline by `DBLOG_TEST_PATIENCE` (4 unless set).
"""

from __future__ import annotations

import os

PATIENCE = float(os.environ.get("DBLOG_TEST_PATIENCE", "4"))


def deadline_s(seconds: float) -> float:
    """`seconds` as written in a test, stretched for a loaded machine."""
    return seconds * PATIENCE
