"""`dblog dev-services env`: the dev servers' addresses and passwords as `export` lines that a
shell's `eval` reads back exactly, printed into a pipe only, never onto a terminal."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from airflow_provider_dblog.cli import main
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.devservices.stack import STATE_FILE

pytestmark = pytest.mark.unit
PG_PASSWORD = "pg pw with 'quotes' and $dollars"


def recorded_stack(state_dir: Path) -> None:
    """A state file as `dev-services up` writes it (no server behind it)."""
    infos = {
        "postgres": PostgresInfo(
            data_dir=state_dir, log_file=state_dir / "pg.log", flavour="pg15", major=15,
            host="127.0.0.1", port=5433, user="dblog", password=PG_PASSWORD, dbname="dblog",
            socket_dir=state_dir,
        ),
        "mariadb": MariaDBInfo(
            data_dir=state_dir, log_file=state_dir / "m.log", host="127.0.0.1", port=3307,
            user="dblog", password="my-pw", dbname="dblog", socket=state_dir / "m.sock",
            server_id=1,
        ),
        "redis": RedisInfo(
            data_dir=state_dir, log_file=state_dir / "r.log", host="127.0.0.1", port=6380,
            password="redis-pw",
        ),
    }  # fmt: skip
    state = {n: {"info": i.to_json(), "pid": 1, "start_seconds": 0.1} for n, i in infos.items()}
    (state_dir / STATE_FILE).write_text(json.dumps(state))


def test_the_export_lines_set_each_variable_exactly_in_a_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded_stack(tmp_path)
    printed = io.StringIO()
    monkeypatch.setattr("sys.stdout", printed)
    assert main(["dev-services", "env", "--dir", str(tmp_path)]) == 0
    script = printed.getvalue() + 'printf "%s\\n" "$DBLOG_DEV_PG_PASSWORD" "$DBLOG_DEV_PG_DSN" '
    script += '"$DBLOG_DEV_MYSQL_DSN" "$DBLOG_DEV_REDIS_URL" "$DBLOG_DEV_REDIS_PASSWORD"'
    shell = subprocess.run(["bash"], input=script, capture_output=True, text=True, check=True)
    assert shell.stdout.splitlines() == [
        PG_PASSWORD,
        "host=127.0.0.1 port=5433 dbname=dblog user=dblog",
        "mysql://dblog@127.0.0.1:3307/dblog",
        "redis://127.0.0.1:6380/0",
        "redis-pw",
    ]


def test_onto_a_terminal_it_prints_no_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded_stack(tmp_path)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert main(["dev-services", "env", "--dir", str(tmp_path)]) == 2
    shown = capsys.readouterr()
    assert 'eval "$(dblog dev-services env)"' in shown.err
    assert "pw" not in shown.out + shown.err


def test_without_servers_it_says_how_to_start_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dev-services", "env", "--dir", str(tmp_path)]) == 1
    assert "dblog dev-services up" in capsys.readouterr().err
