"""The wheel installed into Airflow holds the runtime, not the throwaway servers or the demo:
pyproject's `packages.find` leaves them out, and `dblog demo`/`dblog dev-services` say in one
line that they run from a clone when their packages are not there."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from setuptools import find_packages

from airflow_provider_dblog.cli.common import CLONE_ONLY

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_the_wheels_packages_leave_out_the_dev_services_and_the_demo() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    find = setuptools["packages"]["find"]
    packages = set(find_packages(str(REPO), include=find["include"], exclude=find["exclude"]))
    assert {"airflow_provider_dblog.cli", "airflow_provider_dblog.tailer"} <= packages
    assert "airflow_provider_dblog.sources.postgres" in packages
    assert sorted(p for p in packages if p.startswith(CLONE_ONLY)) == []
    assert setuptools["include-package-data"] is False  # no excluded module back as data


BLOCKED = """
import importlib.abc, sys
from airflow_provider_dblog.cli.common import CLONE_ONLY

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith(CLONE_ONLY):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from airflow_provider_dblog.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    ("argv", "verb"),
    [(["demo"], "demo"), (["dev-services", "status", "--dir", "/nonexistent"], "dev-services")],
)
def test_without_the_clone_only_packages_the_verb_says_where_it_runs(
    argv: list[str], verb: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"dblog {verb}") and "runs from a clone" in lines[0]
    assert "bash scripts/setup.sh" in lines[0]
