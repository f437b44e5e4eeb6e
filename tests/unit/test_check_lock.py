"""The lock check (`scripts/check_lock.py`): the repository's lock pins every requirement of
pyproject.toml within its range, and a lock that misses one or pins it outside is refused."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_lock.py"


def check_lock() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_lock", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PROJECT = {
    "name": "airflow-provider-dblog",
    "dependencies": ["redis[hiredis]>=5", "psycopg[binary]>=3.3"],
    "optional-dependencies": {"dev": ["airflow-provider-dblog[lake]", "mypy>=1.10"]},
}


def test_the_repositorys_lock_agrees_with_pyproject() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_lock_that_pins_every_requirement_in_range_passes(tmp_path: Path) -> None:
    lock = tmp_path / "lock.txt"
    lock.write_text("redis==8.2.0  # via x\npsycopg==3.3.9\nMyPy==2.4.1\n")
    module = check_lock()
    assert module.problems(PROJECT, module.pins(lock)) == []


def test_a_missing_pin_and_a_pin_out_of_range_are_both_named(tmp_path: Path) -> None:
    lock = tmp_path / "lock.txt"
    lock.write_text("redis==4.6.0\nmypy==2.4.1\n")
    module = check_lock()
    found = module.problems(PROJECT, module.pins(lock))
    assert found == [
        "redis==4.6.0 is pinned but pyproject.toml asks redis[hiredis]>=5",
        "psycopg is required by pyproject.toml but not pinned",
    ]
