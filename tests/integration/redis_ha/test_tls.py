"""The state store over TLS: `dblog tail` and `dblog dump` reach a Redis that speaks TLS only
(`rediss://`, the test CA's file, a client certificate) and the output equals the source; a
server certificate from another CA, one for another host name and a client certificate from
another CA are each refused with an error that says so. Sentinels and servers that all speak
TLS only (`tls = true`) name the primary, a client follows their failover, and one with another
CA is refused."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_dblog.cli import main
from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis_sentinel import (
    SERVICE_NAME,
    RedisSentinelGroup,
    SentinelServer,
)
from airflow_provider_dblog.devservices.tls import make_test_ca
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.state import AsyncStateReader, StateStore
from airflow_provider_dblog.state.client_certificate import ClientCertificateRefused
from airflow_provider_dblog.state.connection import RedisSettings, parse_redis_settings
from airflow_provider_dblog.state.errors import RedisCertificateRefused
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
from tests.integration.redis_ha.support import TlsRedis, answered, write_redis_config

pytestmark = pytest.mark.integration
ROWS = 100
"""Rows per table of the source, before capture."""


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, ROWS, target=False, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


def tls_lines(url: str, ca_file: Path, client: tuple[Path, Path] | None = None) -> list[str]:
    lines = [f'url = "{url}"', f'ca_file = "{ca_file}"']
    if client is not None:
        lines += [f'cert_file = "{client[0]}"', f'key_file = "{client[1]}"']
    return lines


def test_tail_and_dump_over_tls_reach_the_output(
    dbs: Databases, tls_redis: TlsRedis, tmp_path: Path
) -> None:
    info, ca = tls_redis.info, tls_redis.ca
    events_dir = tmp_path / "events"
    url = f"rediss://{info.host}:{info.port}/0"
    config = write_redis_config(
        tmp_path / "dblog.toml",
        dbs,
        tls_lines(url, ca.ca_file, ca.client_cert("dblog")),
        {"type": "ndjson", "directory": str(events_dir)},
        {"heartbeat_s": 0.2, "window_ttl_s": 10},
    )
    env = dict(os.environ, **{dbs.password_env: dbs.password, REDIS_PASSWORD_ENV: info.password})
    settings = RedisSettings(url=url, ca_file=str(ca.ca_file))
    store = StateStore(settings.client(password=info.password), dbs.config.name)
    tail = TailProcess(config, "tailer", env, tmp_path / "tail.log")
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the tailer's first heartbeat")
        done = run_cli(
            *("dump", "--config", str(config), "--dump-id", "tls", "--chunk-size", "50"), env=env
        )
        assert done.returncode == 0, done.stdout + done.stderr
        wait_until(
            lambda: len(materialize(read_events(events_dir))) == 3 * ROWS,
            60,
            "every dumped row in the output",
        )
        assert tail.stop() == 0, (tmp_path / "tail.log").read_text()[-3000:]
    finally:
        if tail.alive():
            tail.kill()
    status = store.dumps.status("tls")
    assert status is not None and status.state == "done", status
    events = list(read_events(events_dir))
    assert state_differences(source_state(dbs.source), materialize(events)) == []
    assert info.password not in (tmp_path / "tail.log").read_text()


def test_a_certificate_from_another_ca_or_for_another_host_is_refused(
    dbs: Databases,
    tls_redis: TlsRedis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each a configuration error, not an outage: `dblog dump` and `dblog tail` stop at once
    (exit status 2) instead of retrying, with one line saying why (`dblog dump` in this
    process, the tailer in its own)."""
    info, ca = tls_redis.info, tls_redis.ca
    other_ca = make_test_ca(tmp_path / "other-ca")
    url = f"rediss://{info.host}:{info.port}/0"
    cases = {
        "wrong-ca": (
            tls_lines(url, other_ca.ca_file),
            "its TLS certificate does not verify (",
            "check [redis] ca_file",
        ),
        "other-host": (
            tls_lines(f"rediss://localhost:{info.port}/0", ca.ca_file),
            "its TLS certificate does not verify (Hostname mismatch, certificate is not valid "
            "for 'localhost'",
            "check [redis] ca_file",
        ),
        "client-of-another-ca": (
            tls_lines(url, ca.ca_file, other_ca.client_cert("dblog")),
            "the server refused this client's TLS certificate (TLSV1_ALERT_UNKNOWN_CA)",
            "check [redis] cert_file and key_file",
        ),
    }
    monkeypatch.setenv(REDIS_PASSWORD_ENV, info.password)
    env = dict(os.environ)
    output = {"type": "ndjson", "directory": str(tmp_path / "events")}
    configs = {
        name: write_redis_config(tmp_path / f"{name}.toml", dbs, redis, output)
        for name, (redis, _, _) in cases.items()
    }
    tails = {  # all at once: each spends most of its time starting
        name: TailProcess(config, "tailer", env, tmp_path / f"{name}.log")
        for name, config in configs.items()
    }
    try:
        for name, (_, wanted, hint) in cases.items():
            assert main(["dump", "--config", str(configs[name])]) == 2, name
            stderr = capsys.readouterr().err
            assert stderr.startswith("dblog: error: the Redis state store at "), stderr
            assert wanted in stderr and hint in stderr, stderr
            assert info.password not in stderr
        for name, (_, wanted, _) in cases.items():
            assert tails[name].process.wait(60) == 2, name
            log = (tmp_path / f"{name}.log").read_text()
            assert wanted in log and info.password not in log, log[-2000:]
    finally:
        for tail in tails.values():
            if tail.alive():
                tail.kill()


def test_a_store_over_tls_sentinels_follows_a_failover_and_refuses_another_ca(
    tls_sentinels: RedisSentinelGroup, tmp_path: Path
) -> None:
    group = tls_sentinels
    assert group.tls is not None
    settings = parse_redis_settings(
        {
            "sentinels": [f"{host}:{port}" for host, port in group.addresses],
            "service_name": SERVICE_NAME,
            "tls": True,
            "ca_file": str(group.tls.ca_file),
        }
    )
    store = StateStore(settings.client(password=group.password), "tls_ha")
    request = DumpRequest("tls-ha", DumpKind.ALL, (TableRef("public", "t"),))
    store.dumps.create(request)
    first = group.primary()
    killed = group.kill_primary()
    group.wait_for_failover(killed)
    assert group.primary() is not first

    wait_until(
        lambda: answered(lambda: store.dumps.pause("tls-ha")),
        30,
        "a write through the same client on the promoted replica",
    )
    controls = store.dumps.controls("tls-ha")
    assert controls is not None and controls.paused
    assert store.dumps.get("tls-ha") is not None

    other_ca = make_test_ca(tmp_path / "other-ca")
    wrong = dataclasses.replace(settings, ca_file=str(other_ca.ca_file))
    with pytest.raises(RedisCertificateRefused, match="its TLS certificate does not verify"):
        StateStore(wrong.client(password=group.password), "tls_ha").dumps.get("tls-ha")


NO_FAILOVER_MS = 600_000
"""A lone sentinel's patience: with no failover to test, a primary that a loaded machine keeps
from answering for a second must not be called down."""


class CertificateCheckingSentinel(SentinelServer):
    """A sentinel that checks a client certificate offered to it against its CA (the group's
    do not: a sentinel offers its server certificate when it connects to another)."""

    def _command(self) -> list[str]:
        return [*super()._command(), "--tls-auth-clients", "optional"]


def test_a_sentinel_that_refuses_the_client_certificate_is_named(
    tls_redis: TlsRedis, tmp_path: Path
) -> None:
    """A sentinel refuses a client certificate of another CA as the server closing the
    connection (TLS 1.3): a configuration error naming the sentinel and the server's alert,
    not "no sentinel names a primary". A certificate of its own CA gets through."""
    info, ca = tls_redis.info, tls_redis.ca
    tls = ca.server_tls(["127.0.0.1"])
    other_ca = make_test_ca(tmp_path / "other-ca")
    checking = CertificateCheckingSentinel(
        tmp_path / "sentinel", info, tls=tls, down_after_ms=NO_FAILOVER_MS
    )
    with checking as sentinel:

        def settings_of(client_cert: tuple[Path, Path]) -> RedisSettings:
            return parse_redis_settings(
                {
                    "sentinels": [f"127.0.0.1:{sentinel.port}"],
                    "service_name": SERVICE_NAME,
                    "tls": True,
                    "ca_file": str(ca.ca_file),
                    "cert_file": str(client_cert[0]),
                    "key_file": str(client_cert[1]),
                }
            )

        def store(client_cert: tuple[Path, Path]) -> StateStore:
            return StateStore(settings_of(client_cert).client(password=info.password), "checked")

        async def status_for_triggers(client_cert: tuple[Path, Path]) -> None:
            client = settings_of(client_cert).async_client(password=info.password)
            try:
                await AsyncStateReader(client, "checked").dump_status("none")
            finally:
                await client.aclose()

        assert store(ca.client_cert("dblog")).dumps.get("none") is None
        asyncio.run(status_for_triggers(ca.client_cert("dblog")))
        with pytest.raises(RedisCertificateRefused) as refused:
            store(other_ca.client_cert("dblog")).dumps.get("none")
        with pytest.raises(ClientCertificateRefused, match=r"^sentinel 127\.0\.0\.1:\d+ refused"):
            asyncio.run(status_for_triggers(other_ca.client_cert("dblog")))
    message = str(refused.value)
    assert f"sentinel 127.0.0.1:{sentinel.port} refused this client's TLS certificate " in message
    assert "(TLSV1_ALERT_UNKNOWN_CA)" in message and "check [redis] cert_file" in message
    assert info.password not in message
