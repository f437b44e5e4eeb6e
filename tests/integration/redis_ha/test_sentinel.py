"""The state store behind Redis Sentinel: `dblog tail` and `dblog dump` find the primary through
the sentinels, follow a failover (the primary SIGKILLed mid-dump, the replica promoted) and
finish with an output equal to the source, which Airflow's hook and triggers then read from the
promoted replica; a sentinel that answers nothing and a service the
sentinels do not know are each one clear error.

The failover here loses no write (the replica has every write when the primary is killed): it
shows that every client follows the promotion. One that loses writes: test_lossy_failover.py."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_dblog.cli import main
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.process import LOOPBACK, free_port
from airflow_provider_dblog.devservices.redis_sentinel import SERVICE_NAME, RedisSentinelGroup
from airflow_provider_dblog.hooks.dblog import DBLogConnection
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.state import AsyncStateReader, DumpStatus, StateStore
from tests.integration.e2e_support import (
    DBLOG,
    REDIS_PASSWORD_ENV,
    Databases,
    TailProcess,
    Writer,
    backwards,
    drop_databases,
    make_databases,
    materialize,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
)
from tests.integration.redis_ha.support import answered, write_redis_config

pytestmark = pytest.mark.integration


def sentinel_lines(addresses: list[str], service: str = SERVICE_NAME) -> list[str]:
    return [
        "sentinels = [" + ", ".join(f'"{a}"' for a in addresses) + "]",
        f'service_name = "{service}"',
    ]


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, 240, target=False, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


def env_for(dbs: Databases, group: RedisSentinelGroup) -> dict[str, str]:
    return dict(os.environ, **{dbs.password_env: dbs.password, REDIS_PASSWORD_ENV: group.password})


def test_tail_and_dump_follow_a_failover_and_the_output_equals_the_source(
    dbs: Databases, redis_sentinels: RedisSentinelGroup, tmp_path: Path
) -> None:
    group = redis_sentinels
    addresses = [f"{host}:{port}" for host, port in group.addresses]
    events_dir = tmp_path / "events"
    config = write_redis_config(
        tmp_path / "dblog.toml",
        dbs,
        sentinel_lines(addresses),
        {"type": "ndjson", "directory": str(events_dir)},
        {"lease_ttl_ms": 5000, "heartbeat_s": 0.2, "window_ttl_s": 10, "reconnect_max_s": 2},
    )
    env = env_for(dbs, group)
    store = StateStore(group.settings().client(password=group.password), dbs.config.name)
    assert store.address.startswith(f"service {SERVICE_NAME} (sentinels 127.0.0.1:")
    tail = TailProcess(config, "tailer", env, tmp_path / "tail.log")
    writer: Writer | None = None
    dump: subprocess.Popen[bytes] | None = None
    first = group.primary()
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the tailer's first heartbeat")
        writer = Writer(dbs, tmp_path, seed_value=random.randrange(1000))
        writer.wait_for(20)
        with (tmp_path / "dump.log").open("wb") as log:
            dump = subprocess.Popen(
                [
                    *(DBLOG, "dump", "--config", str(config), "--dump-id", "failover"),
                    *("--chunk-size", "20", "--parallelism", "2", "--window-timeout", "5"),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

        def chunks() -> int:
            status = store.dumps.status("failover")
            return 0 if status is None else status.chunks

        wait_until(lambda: chunks() >= 8, 120, "the dump at 8 chunks")
        killed = group.kill_primary()
        group.wait_for_failover(killed)
        assert group.primary() is not first
        wait_until(lambda: answered(chunks), 60, "the promoted primary reached")
        after_failover = chunks()
        assert dump.wait(240) == 0, (tmp_path / "dump.log").read_text()[-3000:]
        transactions = writer.stop()
        wait_caught_up(dbs, timeout_s=120)
        assert tail.stop() == 0, (tmp_path / "tail.log").read_text()[-3000:]
    finally:
        if writer is not None:
            writer.kill()
        if dump is not None and dump.poll() is None:
            dump.kill()
        if tail.alive():
            tail.kill()
        group.heal()

    status = store.dumps.status("failover")
    assert status is not None and status.state == "done", status
    assert status.chunks > after_failover, "the dump went on on the promoted replica"
    assert transactions, "the writer wrote during the run"
    events = list(read_events(events_dir))
    assert backwards(events) == []
    assert state_differences(source_state(dbs.source), materialize(events)) == []
    tail_log = (tmp_path / "tail.log").read_text()
    assert f"service {SERVICE_NAME}" in tail_log, "the outage is logged, naming the service"
    assert group.password not in tail_log and dbs.password not in tail_log
    assert airflow_sees_the_dump_done(group, dbs.config.name)


def airflow_sees_the_dump_done(group: RedisSentinelGroup, source: str) -> bool:
    """The Airflow side after the failover: a `dblog` connection naming the sentinels (the
    hook's client) and the asyncio client of the triggers both reach the promoted primary."""
    from airflow.sdk import Connection

    extra = {
        "source_name": source,
        "config_path": "unused.toml",
        "sentinels": ",".join(f"{host}:{port}" for host, port in group.addresses),
        "service_name": SERVICE_NAME,
    }
    conn = Connection(
        conn_id="dblog_ha", conn_type="dblog", password=group.password, extra=json.dumps(extra)
    )
    settings = DBLogConnection.parse(conn, None)
    hook_store = StateStore(settings.redis_client(), source)

    async def status_for_triggers() -> DumpStatus | None:
        client = settings.async_redis_client()
        try:
            return await AsyncStateReader(client, source).dump_status("failover")
        finally:
            await client.aclose()

    by_hook, by_trigger = hook_store.dumps.status("failover"), asyncio.run(status_for_triggers())
    return by_hook is not None and by_trigger == by_hook and by_hook.state == "done"


def test_a_sentinel_that_answers_nothing_and_an_unknown_service_are_clear_errors(
    dbs: Databases,
    redis_sentinels: RedisSentinelGroup,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`dblog dump` in this process (the command line's `main`): sentinels that answer nothing
    are an outage, waited out within the dump's patience, then one line; sentinels that all
    answer but watch no such service are a configuration error, refused at once."""
    monkeypatch.setenv(REDIS_PASSWORD_ENV, redis_sentinels.password)
    silent = f"{LOOPBACK}:{free_port()}"
    output = {"type": "ndjson", "directory": str(tmp_path / "events")}
    addresses = [f"{host}:{port}" for host, port in redis_sentinels.addresses]
    cases = {
        "silent": (
            sentinel_lines([silent]),
            [f"sentinel {silent} does not answer (", "Connection refused"],
        ),
        "unknown": (
            sentinel_lines(addresses, "nosuch"),
            [f"sentinel {addresses[0]} watches no service 'nosuch' (it knows {SERVICE_NAME})"],
        ),
    }
    starts = {
        "silent": "the state store was unreachable for ",
        "unknown": "cannot be used: no sentinel names a primary for service 'nosuch'",
    }
    for name, (redis, wanted) in cases.items():
        config = write_redis_config(tmp_path / f"{name}.toml", dbs, redis, output)
        command = ["dump", "--config", str(config), "--source-patience", "1"]
        assert main(command) == 2, name
        stderr = capsys.readouterr().err
        assert stderr.count("dblog: error:") == 1 and "Traceback" not in stderr, stderr
        assert starts[name] in stderr, (name, stderr)
        assert ("nothing retries this" in stderr) == (name == "unknown"), stderr
        assert "no sentinel names a primary for service" in stderr
        for text in wanted:
            assert text in stderr, (name, text, stderr)
        assert redis_sentinels.password not in stderr
