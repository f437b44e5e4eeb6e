"""What the verify tests run against: a tailer applying into the SQL target, which a dump
filled, and a writer writing all along."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import StateStore
from tests.integration.dump.read_only_support import RO_PASSWORD_ENV, read_only_role
from tests.integration.e2e_support import (
    SourceDatabases,
    TailProcess,
    Writer,
    cli_env,
    run_cli,
    wait_until,
    write_config,
)

TARGET_DSN_ENV = "E2E_TARGET_DSN"


class _Parts(NamedTuple):
    config: Path
    env: dict[str, str]
    store: StateStore
    writer: Writer


class Deployment(_Parts):
    """The configuration file, the commands' environment, the state store and the writer (what
    a test unpacks), and the tailer's process (`tail`), for a test that kills it."""

    tail: TailProcess


@contextmanager
def running_deployment(
    dbs: SourceDatabases,
    redis_server: RedisInfo,
    tmp_path: Path,
    target_dsn: str,
    *,
    read_only: bool = False,
    seed_value: int = 5,
) -> Iterator[Deployment]:
    """The source read with written watermarks, or as a role that may write nothing (the
    watermarks are log positions)."""
    output = {"type": "sql_apply", "dsn_env": TARGET_DSN_ENV}
    tailer = {"heartbeat_s": 0.2, "window_ttl_s": 30, "lease_ttl_ms": 3000}
    env = cli_env(dbs, redis_server, **{TARGET_DSN_ENV: target_dsn})
    if read_only:
        role = read_only_role(dbs)
        env[RO_PASSWORD_ENV] = role.password
        config = write_config(
            *(tmp_path / "dblog.toml", dbs, redis_server, output, tailer),
            password_env=RO_PASSWORD_ENV,
            source=role.toml,
        )
    else:
        config = write_config(tmp_path / "dblog.toml", dbs, redis_server, output, tailer)
    store = StateStore(redis_server.client(), dbs.config.name)
    tail = TailProcess(config, "verify-tailer", env, tmp_path / "tail.log")
    writer = Writer(dbs, tmp_path, seed_value=seed_value, per_s=50)
    try:
        wait_until(lambda: store.tailer.health() is not None, 30, "the tailer beating")
        dumped = run_cli("dump", "-c", str(config), "--chunk-size", "200", env=env)
        assert dumped.returncode == 0, dumped.stderr[-2000:]
        writer.wait_for(10)
        deployment = Deployment(config, env, store, writer)
        deployment.tail = tail
        yield deployment
    finally:
        writer.kill()
        tail.stop()
