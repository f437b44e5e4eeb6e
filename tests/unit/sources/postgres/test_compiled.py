"""The log reader's hot path runs compiled where setup compiled it, and as plain Python when
`DBLOG_PLAIN_PYTHON` asks (the test command runs the mapping's tests in both forms)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from airflow_provider_dblog.sources.postgres.compiled import PLAIN_PYTHON_ENV, running_compiled

pytestmark = pytest.mark.unit

FORM = (
    "from airflow_provider_dblog.sources.postgres import changes, compiled, replication, tuples\n"
    "print(compiled.running_compiled(), *(m.__file__.endswith('.py')"
    " for m in (changes, replication, tuples)))"
)


def test_the_form_asked_for_is_the_one_running() -> None:
    assert running_compiled() is not bool(os.environ.get(PLAIN_PYTHON_ENV))


def test_plain_python_is_imported_from_the_sources_when_asked() -> None:
    env = {**os.environ, PLAIN_PYTHON_ENV: "1"}
    out = subprocess.run(
        [sys.executable, "-c", FORM], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["False", "True", "True", "True"]
