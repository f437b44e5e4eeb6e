"""A throwaway Redis server as the DBLog state store: append-only file on, no RDB snapshots.

The password goes in a 0600 config file (never on the command line); everything else is on the
command line, so `ps` shows how the server runs. `restart()` keeps port, directory and AOF,
which is what the durability tests check.

Given `tls` (a certificate from `devservices.tls`), it listens for TLS only (`tls-port`, no
clear-text port), so a client that connects at all is encrypted. Given `replica_of`, it starts
as that server's replica (the Sentinel group of `redis_sentinel.py`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import ClassVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from airflow_provider_dblog.devservices.process import (
    LOOPBACK,
    ServerProcess,
    ServerStartError,
    ServiceInfo,
)
from airflow_provider_dblog.devservices.tls import ServerTLS


@dataclasses.dataclass(frozen=True, kw_only=True)
class RedisInfo(ServiceInfo):
    """How to reach a running Redis: `url` carries the password; `client()` makes a client."""

    host: str
    port: int
    password: str = dataclasses.field(repr=False)
    db: int = 0
    ca_file: str | None = None
    """The CA that signed the server's certificate when it speaks TLS only; None without TLS."""

    @property
    def scheme(self) -> str:
        return "redis" if self.ca_file is None else "rediss"

    @property
    def url(self) -> str:
        return f"{self.scheme}://:{self.password}@{self.host}:{self.port}/{self.db}"

    @property
    def redacted_url(self) -> str:
        return f"{self.scheme}://:***@{self.host}:{self.port}/{self.db}"

    def client(self, **kwargs: object) -> redis.Redis:
        if self.ca_file is not None:
            kwargs = {"ssl_ca_certs": self.ca_file, **kwargs}
        return redis.Redis.from_url(self.url, **kwargs)

    def probe_client(self) -> redis.Redis:
        """A client that fails at once (redis-py retries 3 times with backoff by default)."""
        return self.client(socket_connect_timeout=2, socket_timeout=2, retry=Retry(NoBackoff(), 0))

    def answers(self) -> bool:
        try:
            with self.probe_client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False


DURABILITY_OPTIONS = [
    "--appendonly", "yes",
    "--appendfsync", "everysec",
    "--save", "",
]  # fmt: skip
"""The state store's durability: every write in the append-only file, fsynced each second (a
crash loses at most the last second of writes; see docs/operations.md), no RDB snapshots.
docker/compose.yaml runs its Redis with these same options
(tests/unit/test_docker_compose.py checks)."""


def listen_options(port: int, tls: ServerTLS | None) -> list[str]:
    """Where a server (or sentinel) listens: `port` in clear text, or with `tls` TLS only on
    it, replication over TLS too. No client certificate is asked for: a replica would offer
    its server certificate, which is not one for a client."""
    if tls is None:
        return ["--port", str(port)]
    return [
        "--port", "0",
        "--tls-port", str(port),
        "--tls-cert-file", str(tls.cert_file),
        "--tls-key-file", str(tls.key_file),
        "--tls-ca-cert-file", str(tls.ca_file),
        "--tls-auth-clients", "no",
        "--tls-replication", "yes",
    ]  # fmt: skip


class RedisServer(ServerProcess):
    """Redis in `base_dir` (data/ holds the AOF, redis.conf the password, redis.log)."""

    name: ClassVar[str] = "redis"

    def __init__(
        self,
        base_dir: Path | str,
        *,
        port: int | None = None,
        tls: ServerTLS | None = None,
        replica_of: RedisInfo | None = None,
    ) -> None:
        super().__init__(base_dir, port=port)
        self.tls = tls
        self.replica_of = replica_of
        if replica_of is not None:  # one password for the group: a replica may be promoted
            self.password = replica_of.password
        binary = shutil.which("redis-server") or shutil.which("redis-server", path="/usr/bin")
        if binary is None:
            raise FileNotFoundError("redis-server not found: run scripts/install-system-deps.sh")
        self.binary = binary
        self.data_dir = self.base_dir / "data"
        self.config_file = self.base_dir / "redis.conf"

    def _initialise(self) -> None:
        if self.data_dir.exists():
            raise ServerStartError(f"{self.data_dir} already exists; remove it first")
        self.data_dir.mkdir()
        fd = os.open(self.config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as config:
            config.write(f"requirepass {self.password}\nmasterauth {self.password}\n")
            if self.replica_of is not None:
                config.write(f"replicaof {self.replica_of.host} {self.replica_of.port}\n")

    def _command(self) -> list[str]:
        return [
            self.binary,
            str(self.config_file),
            *listen_options(self.port, self.tls),
            "--bind", LOOPBACK,
            "--dir", str(self.data_dir),
            *DURABILITY_OPTIONS,
            "--daemonize", "no",
            "--logfile", "",
        ]  # fmt: skip

    def _check(self) -> None:
        # Raises while Redis loads its AOF ("LOADING ..."), which is what we want.
        with self.info.probe_client() as client:
            client.ping()

    def _bootstrap(self) -> None:
        """Nothing to create: the password is in the config file from the start."""

    @property
    def info(self) -> RedisInfo:
        return RedisInfo(
            host=LOOPBACK,
            port=self.port,
            password=self.password,
            ca_file=None if self.tls is None else str(self.tls.ca_file),
            data_dir=self.data_dir,
            log_file=self.log_file,
            server=self,
        )
