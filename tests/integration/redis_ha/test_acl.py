"""Least-privilege ACL users (state/acl.py): `dblog tail`, `dblog dump` (of a read-only source,
then a direct one into the lake), the compaction follower and the UI each run as their own
Redis user with the rules of their role, the dumps complete, the output equals the source and
the follower folds it into the lake; the UI's user renders its snapshot and controls dumps but
cannot write a window, the dump's and the compaction's cannot touch the tailer's lease or
token, and none reaches another source's keys."""

from __future__ import annotations

import os
import random
import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
from airflow_provider_dblog.state.verifies import VerifyState
from airflow_provider_dblog.ui.snapshot import LiveView
from tests.integration.compaction.test_spark_compact import read_lake
from tests.integration.e2e_support import (
    DBLOG,
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

    lake = tmp_path / "lake"

    def config_and_env(
        role: str, name: str | None = None, **options: Any
    ) -> tuple[Path, dict[str, str]]:
        user, password = users[role]
        config = write_redis_config(
            tmp_path / f"{name or role}.toml",
            dbs,
            [f'url = "redis://{user}@{at}"'],
            {"type": "ndjson", "directory": str(tmp_path / "events")},
            {"heartbeat_s": 0.2, "window_ttl_s": 10},
            **options,
        )
        return config, dict(
            os.environ, **{dbs.password_env: dbs.password, REDIS_PASSWORD_ENV: password}
        )

    tail_config, tail_env = config_and_env("tailer")
    read_only_config, dump_env = config_and_env("dump", source=("read_only = true",))
    direct_config, _ = config_and_env("dump", "direct", lake=lake)
    compact_config, compact_env = config_and_env("compactor", lake=lake)
    ui_store = StateStore(client("ui"), dbs.config.name)
    tail = TailProcess(tail_config, "tailer", tail_env, tmp_path / "tail.log")
    with (tmp_path / "compact.log").open("wb") as out:
        follower = subprocess.Popen(
            [
                *(DBLOG, "lake", "compact", "--follow", "--prune", "--interval", "0.2"),
                *("--owner", "compactor", "--config", str(compact_config)),
            ],
            env=compact_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: ui_store.tailer.health() is not None, 60, "the tailer's heartbeat")
        for dump_id, config in (("acl", read_only_config), ("acl-direct", direct_config)):
            done = run_cli("dump", "--config", str(config), "--dump-id", dump_id, env=dump_env)
            assert done.returncode == 0, done.stdout + done.stderr
        wait_until(
            lambda: len(materialize(read_events(tmp_path / "events"))) == 3 * ROWS,
            60,
            "every row of the read-only dump in the output",
        )
        wait_until(lambda: _folded(ui_store) == 3 * ROWS, 60, "the follower folding them")
        snapshot = LiveView(client("ui"), dbs.config.name).snapshot()
        verifies = StateStore(client("dump"), dbs.config.name).verifies  # verify runs as dump
        verifies.create("acl-verify", {"tables": [str(t) for t in dbs.tables]})
        assert verifies.claim("acl-verify", "acl:1", 60_000) is None  # its one runner
        verifies.release("acl-verify", "acl:1")
        assert verifies.runner("acl-verify") is None
        verifies.finish("acl-verify", VerifyState.DONE)
        verified = verifies.status("acl-verify")
        assert verified is not None and verified.state is VerifyState.DONE, verified
        assert tail.stop() == 0, (tmp_path / "tail.log").read_text()[-3000:]
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(30) == 0, (tmp_path / "compact.log").read_text()[-3000:]
    finally:
        if tail.alive():
            tail.kill()
        if follower.poll() is None:
            follower.kill()
    assert "NOPERM" not in (tmp_path / "tail.log").read_text()
    assert "NOPERM" not in (tmp_path / "compact.log").read_text()
    for table in dbs.tables:  # the direct dump's rows, and the same rows folded again
        assert read_lake(lake, str(table)).num_rows == ROWS, table
    assert (
        state_differences(source_state(dbs.source), materialize(read_events(tmp_path / "events")))
        == []
    )

    assert snapshot["error"] is None, snapshot
    dumps = {d["dump_id"] for d in snapshot["dumps"]}  # type: ignore[index, union-attr]
    assert dumps == {"acl", "acl-direct"}, snapshot["dumps"]
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
    for write in (
        lambda c: c.set(keys.tailer_token, 1 << 40),
        lambda c: c.hset(keys.window("w1"), "state", "closed"),
        lambda c: c.hset(keys.dump_status("acl"), "state", "failed"),
    ):
        with pytest.raises(NoPermissionError):
            write(client("compactor"))
    other = SourceKeys("another_source")
    for role in ROLES:
        with pytest.raises(NoPermissionError):
            client(role).get(other.tailer_token)
    with pytest.raises(NoPermissionError):
        client("tailer").flushall()


def _folded(store: StateStore) -> int:
    """The events the compaction follower folded, as its heartbeat says."""
    health = store.compactor.health()
    return 0 if health is None else int(health.metrics["events"])  # type: ignore[arg-type]
