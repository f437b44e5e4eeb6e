"""What a reload of `dblog tail` (SIGHUP) takes: the captured tables, nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_dblog.cli.tail import check_reloadable
from airflow_provider_dblog.config import Config, ConfigError, load_config
from tests.unit.test_config import GOOD

pytestmark = pytest.mark.unit


def loaded(tmp_path: Path, text: str) -> Config:
    path = tmp_path / f"{abs(hash(text))}.toml"
    path.write_text(text)
    return load_config(path)


def test_the_tables_may_change(tmp_path: Path) -> None:
    fresh = GOOD.replace('tables = ["public.accounts", "orders"]', 'tables = ["orders", "items"]')
    check_reloadable(loaded(tmp_path, GOOD), loaded(tmp_path, fresh))


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ("dbname=shop", "dbname=other", r"\[source\] dsn"),
        ('name = "shop"', 'name = "other"', r"\[source\] name"),
        ('directory = "out"', 'directory = "elsewhere"', r"\[output\]"),
        ("window_ttl_s = 30", "window_ttl_s = 60", r"\[tailer\]"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/1", r"\[redis\]"),
    ],
)
def test_anything_else_is_refused_by_name(tmp_path: Path, old: str, new: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named + ".*restart dblog tail"):
        check_reloadable(loaded(tmp_path, GOOD), loaded(tmp_path, GOOD.replace(old, new)))
