"""`dblog dump`'s checks wait for a source or Redis they cannot reach, within the dump's
patience, then fail in one `DBLogError` saying what was away; anything else is not waited for."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from airflow_provider_dblog.cli.dump import _patiently
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.sources.base import SourceError, SourceUnavailable
from airflow_provider_dblog.state import StateStoreUnavailable


def failing(*errors: Exception) -> Callable[[], str]:
    """A call that raises `errors` in turn, then answers "checked"."""
    left = list(errors)

    def call() -> str:
        if left:
            raise left.pop(0)
        return "checked"

    return call


def test_a_source_or_redis_back_within_the_patience_is_waited_for() -> None:
    call = failing(SourceUnavailable("refused"), StateStoreUnavailable("refused"))
    assert _patiently(call, "dump d", patience_s=60) == "checked"


def test_past_the_patience_it_says_what_was_away_in_one_error() -> None:
    with pytest.raises(DBLogError) as raised:
        _patiently(failing(*[SourceUnavailable("port 5 refused")] * 3), "dump d", 0)
    said = str(raised.value)
    assert said.startswith("dump d cannot start: the source was unreachable for"), said
    assert said.endswith("last error: port 5 refused"), said


def test_a_refusal_is_not_waited_for() -> None:
    with pytest.raises(SourceError, match="refuses the login"):
        _patiently(failing(SourceError("refuses the login")), "dump d", patience_s=60)
