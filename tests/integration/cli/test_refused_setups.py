"""What no retry can change stops `dblog tail` and `dblog dump` at once, on either source: a
login the server refuses (a wrong password), a captured table that does not exist, and on
MariaDB a binlog the tailer cannot read (not ROW, or not FULL images). Each run
exits 2 with one line, `dblog: error: ...`, naming the problem; it logs no outage (nothing is
retried), prints no traceback and no password, and registers no dump."""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import StateStore
from tests.integration.e2e_support import (
    SOURCES,
    SourceDatabases,
    capturing,
    cli_env,
    drop_databases,
    make_mysql_databases,
    make_source,
    run_cli,
    write_config,
)

pytestmark = pytest.mark.integration
SERVER_SAYS = {"postgres": "password authentication failed", "mysql": "Access denied"}


@pytest.fixture(params=SOURCES)
def dbs(request: pytest.FixtureRequest) -> Iterator[SourceDatabases]:
    databases = make_source(request, 0, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


def refused(args: list[str], env: dict[str, str], *secrets_: str) -> str:
    """`dblog ARGS`'s one error line, once it has checked the run ended as a refusal must."""
    done = run_cli(*args, env=env)
    said = done.stdout + done.stderr
    assert done.returncode == 2, (args, said)
    assert "Traceback" not in said and "unavailable" not in said, (args, said)
    for secret in secrets_:
        assert secret not in said, (args, "a password was printed")
    errors = [line for line in said.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("dblog: error: "), (args, said)
    return errors[0]


def test_a_wrong_password_stops_tail_and_dump_in_one_line(
    dbs: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(tmp_path / "events")},
        {"reconnect_max_s": 1},
    )
    wrong = "wrong-" + secrets.token_hex(8)
    env = dict(cli_env(dbs, redis_server), **{dbs.password_env: wrong})
    for command in ("tail", "dump"):
        line = refused([command, "-c", str(config)], env, wrong, dbs.password)
        assert "refuses the login" in line and SERVER_SAYS[dbs.kind] in line, line
        assert dbs.password_env in line, f"{line}: where the password came from"
    assert StateStore(redis_server.client(), dbs.config.name).dumps.ids() == []


def test_a_captured_table_that_does_not_exist_stops_tail_and_dump_in_one_line(
    dbs: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    gone = capturing(dbs, "accounts", "gone")
    config = write_config(
        tmp_path / "dblog.toml",
        gone,
        redis_server,
        {"type": "ndjson", "directory": str(tmp_path / "events")},
        {"reconnect_max_s": 1},
    )
    env = cli_env(dbs, redis_server)
    for command in ("tail", "dump"):
        line = refused([command, "-c", str(config)], env, dbs.password)
        assert f"{dbs.table('gone')}" in line and "does not exist" in line, line
    assert StateStore(redis_server.client(), dbs.config.name).dumps.ids() == []


@pytest.mark.parametrize(
    ("variable", "value", "usable"),
    [("binlog_format", "MIXED", "ROW"), ("binlog_row_image", "MINIMAL", "FULL")],
)
def test_a_mariadb_binlog_the_tailer_cannot_read_stops_tail_in_one_line(
    mariadb: MariaDBInfo,
    redis_server: RedisInfo,
    tmp_path: Path,
    variable: str,
    value: str,
    usable: str,
) -> None:
    """The line names the variable, its value and the statement that fixes it. The server is
    the worker's own, shared by its tests one at a time: the setting is put back after."""
    dbs = make_mysql_databases(mariadb, 0, seed_value=random.randrange(1 << 30))
    try:
        config = write_config(
            tmp_path / "dblog.toml",
            dbs,
            redis_server,
            {"type": "ndjson", "directory": str(tmp_path / "events")},
            {"reconnect_max_s": 1},
        )
        dbs.admin(f"SET GLOBAL {variable} = '{value}'")
        try:
            line = refused(["tail", "-c", str(config)], cli_env(dbs, redis_server), dbs.password)
        finally:
            dbs.admin(f"SET GLOBAL {variable} = '{usable}'")
    finally:
        drop_databases(dbs)
    assert f"{variable} is {value}" in line, line
    assert f"SET GLOBAL {variable} = '{usable}'" in line, line
