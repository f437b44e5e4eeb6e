"""Least-privilege ACL users (state/acl.py): `dblog tail`, `dblog dump` and the UI each run as
their own Redis user with the rules of their role, the dump completes and the output equals the
source; the UI's user renders its snapshot and controls dumps but cannot write a window, the
dump's cannot touch the tailer's lease or token, and none reaches another source's keys."""

from __future__ import annotations

import os
import random
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import NoPermissionError

from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.process import generate_password
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.state.acl import ROLES, acl_rules
from airflow_provider_dblog.state.connection import RedisSettings
from airflow_provider_dblog.state.keys import SourceKeys
from airflow_provider_dblog.ui.snapshot import LiveView
from tests.integration.e2e_support import (
    REDIS_PASSWORD_ENV,
    Databases,
    TailProcess,
    drop_databases,
    make_databases,
    materialize,
    run_cli,
    source_state,
    state_differences,
    wait_until,
)
from tests.integration.redis_ha.support import write_redis_config

pytestmark = pytest.mark.integration
ROWS = 100
"""Rows per table of the source, before capture."""


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, ROWS, target=False, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


@pytest.fixture
def users(dbs: Databases, redis_server: RedisInfo) -> Iterator[dict[str, tuple[str, str]]]:
    """An ACL user of each role for this test's source: role -> (user, password)."""
    suffix = secrets.token_hex(3)
    made = {role: (f"dblog-{role}-{suffix}", generate_password()) for role in ROLES}
    with redis_server.client() as admin:
        for role, (user, password) in made.items():
            admin.execute_command(
                "ACL", "SETUSER", user, *acl_rules(role, dbs.config.name), f">{password}"
            )
        yield made
        admin.execute_command("ACL", "DELUSER", *(user for user, _ in made.values()))


def test_each_component_runs_as_its_role_and_the_ui_cannot_write_windows(
    dbs: Databases, redis_server: RedisInfo, users: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    at = f"{redis_server.host}:{redis_server.port}/0"

    def client(role: str) -> redis.Redis:
        user, password = users[role]
        return RedisSettings(url=f"redis://{user}@{at}").client(password=password)

    def config_and_env(role: str) -> tuple[Path, dict[str, str]]:
        user, password = users[role]
        config = write_redis_config(
            tmp_path / f"{role}.toml",
            dbs,
            [f'url = "redis://{user}@{at}"'],
            {"type": "ndjson", "directory": str(tmp_path / "events")},
            {"heartbeat_s": 0.2, "window_ttl_s": 10},
        )
        return config, dict(
            os.environ, **{dbs.password_env: dbs.password, REDIS_PASSWORD_ENV: password}
        )

    tail_config, tail_env = config_and_env("tailer")
    dump_config, dump_env = config_and_env("dump")
    ui_store = StateStore(client("ui"), dbs.config.name)
    tail = TailProcess(tail_config, "tailer", tail_env, tmp_path / "tail.log")
    try:
        wait_until(lambda: ui_store.tailer.health() is not None, 60, "the tailer's heartbeat")
        done = run_cli(*("dump", "--config", str(dump_config), "--dump-id", "acl"), env=dump_env)
        assert done.returncode == 0, done.stdout + done.stderr
        wait_until(
            lambda: len(materialize(read_events(tmp_path / "events"))) == 3 * ROWS,
            60,
            "every dumped row in the output",
        )
        snapshot = LiveView(client("ui"), dbs.config.name).snapshot()
        assert tail.stop() == 0, (tmp_path / "tail.log").read_text()[-3000:]
    finally:
        if tail.alive():
            tail.kill()
    assert "NOPERM" not in (tmp_path / "tail.log").read_text()
    assert (
        state_differences(source_state(dbs.source), materialize(read_events(tmp_path / "events")))
        == []
    )

    assert snapshot["error"] is None, snapshot
    assert [d["dump_id"] for d in snapshot["dumps"]] == ["acl"], snapshot["dumps"]  # type: ignore[index, union-attr]
    assert snapshot["windows"], "the UI's user read the dump's windows"
    assert ui_store.dumps.pause("acl") is False, "the control script runs; the dump is done"

    keys = SourceKeys(dbs.config.name)
    with pytest.raises(NoPermissionError):
        ui_store.windows.abandon("w1")
    with pytest.raises(NoPermissionError):
        client("ui").hset(keys.window("w1"), "state", "closed")
    with pytest.raises(NoPermissionError):
        client("dump").set(keys.tailer_token, 1 << 40)
    with pytest.raises(NoPermissionError):
        client("dump").hset(keys.tailer_lease, "owner", "intruder")
    other = SourceKeys("another_source")
    for role in ROLES:
        with pytest.raises(NoPermissionError):
            client(role).get(other.tailer_token)
    with pytest.raises(NoPermissionError):
        client("tailer").flushall()
