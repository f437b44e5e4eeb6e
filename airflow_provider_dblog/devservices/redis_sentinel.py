"""A throwaway replicated Redis under Sentinel: a primary, a replica and three sentinels.

What the Sentinel tests and `dblog demo --redis-ha` run on. The sentinels watch the primary as
`SERVICE_NAME` with a quorum of two, call it down after `DOWN_AFTER_MS` without an answer and
promote the replica; `kill_primary()` makes that happen (SIGKILL, as a crash) and `heal()`
brings the killed server back, which the sentinels turn into a replica of the new primary.
`lag_replica()` before the kill makes the replica miss every write from then on, as a replica
that lags does: the failover then loses them.
Every server shares one password (a replica must reach whichever server is primary); it is in
0600 config files only, the sentinels' `auth-pass` included.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from airflow_provider_dblog.devservices.process import (
    LOOPBACK,
    ServerProcess,
    ServiceInfo,
)
from airflow_provider_dblog.devservices.redis import RedisInfo, RedisServer, listen_options
from airflow_provider_dblog.devservices.tls import ServerTLS
from airflow_provider_dblog.state.connection import RedisSettings

SERVICE_NAME = "dblog"
DOWN_AFTER_MS = 1000
"""How long the primary may not answer before a sentinel thinks it down: short, so that a test's
failover takes seconds (production keeps Sentinel's default of 30 s or so)."""
FAILOVER_TIMEOUT_MS = 10_000
READY_TIMEOUT_S = 60.0
LAG_LIMIT_MS = 120_000
"""The longest a lagging replica waits for the kill: then it applies the writes after all."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SentinelInfo(ServiceInfo):
    host: str
    port: int
    ca_file: str | None = None
    """The CA of the sentinel's certificate when it speaks TLS only; None without TLS."""

    def probe_client(self) -> redis.Redis:
        """A client that fails at once (no retries)."""
        tls: dict[str, Any] = {}
        if self.ca_file is not None:
            tls = {"ssl": True, "ssl_ca_certs": self.ca_file}
        return redis.Redis(
            self.host, self.port, socket_timeout=2, retry=Retry(NoBackoff(), 0), **tls
        )

    def answers(self) -> bool:
        try:
            with self.probe_client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False


class SentinelServer(ServerProcess):
    """One sentinel in `base_dir`, watching `primary` as `SERVICE_NAME` (sentinel.conf, which
    Sentinel rewrites as it learns the group, holds the password)."""

    name: ClassVar[str] = "redis-sentinel"

    def __init__(
        self,
        base_dir: Path | str,
        primary: RedisInfo,
        tls: ServerTLS | None = None,
        *,
        down_after_ms: int = DOWN_AFTER_MS,
    ) -> None:
        super().__init__(base_dir)
        self.tls = tls
        self.down_after_ms = down_after_ms
        """A sentinel that no failover is asked of can wait long: on a crowded machine a
        primary slow to answer for a second is not down."""
        binary = shutil.which("redis-sentinel") or shutil.which("redis-sentinel", path="/usr/bin")
        if binary is None:
            raise FileNotFoundError("redis-sentinel not found: run scripts/install-system-deps.sh")
        self.binary = binary
        self.primary = primary
        self.config_file = self.base_dir / "sentinel.conf"

    def _initialise(self) -> None:
        fd = os.open(self.config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as config:
            config.write(
                f"sentinel monitor {SERVICE_NAME} {self.primary.host} {self.primary.port} 2\n"
                f"sentinel auth-pass {SERVICE_NAME} {self.primary.password}\n"
                f"sentinel down-after-milliseconds {SERVICE_NAME} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE_NAME} {FAILOVER_TIMEOUT_MS}\n"
            )

    def _command(self) -> list[str]:
        return [
            self.binary,
            str(self.config_file),
            *listen_options(self.port, self.tls),
            "--bind", LOOPBACK,
            "--dir", str(self.base_dir),
            "--daemonize", "no",
            "--logfile", "",
        ]  # fmt: skip

    def _check(self) -> None:
        with self.info.probe_client() as client:
            client.ping()

    def _bootstrap(self) -> None:
        """Nothing to create: the sentinel learns the group from the primary."""

    @property
    def info(self) -> SentinelInfo:
        return SentinelInfo(
            host=LOOPBACK,
            port=self.port,
            ca_file=None if self.tls is None else str(self.tls.ca_file),
            data_dir=self.base_dir,
            log_file=self.log_file,
        )


class RedisSentinelGroup:
    """The primary, its replica and three sentinels in `base_dir`; a context manager, or
    `start()` and `stop()`. Ready once every sentinel knows the replica and the other two
    sentinels: only then can they agree on a failover. With `tls`, every server and sentinel
    speaks TLS only, replication and the sentinels' links included."""

    def __init__(self, base_dir: Path | str, tls: ServerTLS | None = None) -> None:
        for program in ("redis-server", "redis-sentinel"):
            if shutil.which(program) is None and shutil.which(program, path="/usr/bin") is None:
                raise FileNotFoundError(f"{program} not found: run scripts/install-system-deps.sh")
        self.base_dir = Path(base_dir).resolve()
        self.tls = tls
        self.servers: list[RedisServer] = []
        self.sentinels: list[SentinelServer] = []
        self._lagging: RedisServer | None = None

    def start(self) -> Self:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        try:
            primary = RedisServer(self.base_dir / "redis-a", tls=self.tls).start()
            self.servers = [primary]
            replica = RedisServer(
                self.base_dir / "redis-b", tls=self.tls, replica_of=primary.info
            ).start()
            self.servers.append(replica)
            for n in range(3):
                sentinel = SentinelServer(
                    self.base_dir / f"sentinel-{n}", primary.info, tls=self.tls
                )
                self.sentinels.append(sentinel.start())
            self._wait_until(self._ready, "the sentinels to know the replica and each other")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in [*self.sentinels, *self.servers]:
            server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def password(self) -> str:
        return self.servers[0].password

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        return tuple((LOOPBACK, s.port) for s in self.sentinels)

    def settings(self, password_env: str | None = None) -> RedisSettings:
        """How a client reaches the group's primary, its password in `password_env`."""
        return RedisSettings(
            sentinels=self.addresses,
            service_name=SERVICE_NAME,
            password_env=password_env,
            tls=self.tls is not None,
            ca_file=None if self.tls is None else str(self.tls.ca_file),
        )

    def primary(self) -> RedisServer:
        """The server the sentinels name primary now."""
        host, port = self._ask_sentinel()
        return next(s for s in self.servers if (LOOPBACK, s.port) == (host, port))

    def lag_replica(self) -> RedisServer:
        """Make the replica apply none of the primary's writes from now on, until
        `kill_primary()` loses them: `CLIENT PAUSE WRITE` on a replica holds its replication
        stream too (the writes wait unapplied in the link's buffer), while the link stays up
        and the replica answers the sentinels, which still count it a good replica to promote.
        Returns the lagging replica."""
        primary = self.primary()
        replica = next(s for s in self.servers if s is not primary and s.running)
        with replica.info.probe_client() as client:
            client.client_pause(LAG_LIMIT_MS, all=False)
        self._lagging = replica
        return replica

    def kill_primary(self) -> RedisServer:
        """SIGKILL the primary (a crash). Without `lag_replica()` first, once the replica has
        every write (writes paused, the replica's offset caught up): the failover loses
        nothing. After it, at once: the writes the replica held unapplied go with the link
        (waited for), then the replica is unpaused. The sentinels promote the replica.
        Returns the killed server; `heal()` brings it back."""
        primary = self.primary()
        lagging, self._lagging = self._lagging, None
        if lagging is not None:
            primary.kill()
            self._wait_until(
                lambda: not self._link_up(lagging),
                "the lagging replica to lose its link (and the writes it held)",
            )
            with lagging.info.probe_client() as client:
                client.client_unpause()
            return primary
        with primary.info.probe_client() as client:
            client.client_pause(FAILOVER_TIMEOUT_MS, all=False)
            offset = int(client.info("replication")["master_repl_offset"])
        replicas = [s for s in self.servers if s is not primary and s.running]
        self._wait_until(
            lambda: all(self.offset(r) >= offset for r in replicas),
            "the replica to receive every write",
        )
        primary.kill()
        return primary

    def wait_for_failover(self, old: RedisServer) -> None:
        """Until every sentinel names a primary other than `old` and no longer flags it down:
        what a client needs to find it. (A sentinel names the promoted replica while it still
        reconfigures the others, with the old primary's down flags, which clients refuse.)"""
        self._wait_until(lambda: self._failed_over(old), "the sentinels promoting the replica")

    def _failed_over(self, old: RedisServer) -> bool:
        try:
            for sentinel in self.sentinels:
                with self._sentinel_client(sentinel) as client:
                    master = client.sentinel_master(SERVICE_NAME)
                if master["port"] == old.port or master["is_sdown"] or master["is_odown"]:
                    return False
        except (redis.RedisError, KeyError):
            return False
        return True

    def heal(self) -> None:
        """Start every killed server again as a replica of the current primary (as the
        sentinels would make it, only sooner) and wait until the group is whole."""
        primary = self.primary()
        self._lagging = None
        for server in self.servers:
            if server.running:
                with server.info.probe_client() as client:
                    client.client_unpause()  # a replica left lagging by a failed test
            else:
                server.start()
                with server.info.probe_client() as client:
                    client.replicaof(LOOPBACK, primary.port)
        self._wait_until(self._ready, "the killed server to rejoin as a replica")

    def _ask_sentinel(self) -> tuple[str, int]:
        for sentinel in self.sentinels:
            try:
                with self._sentinel_client(sentinel) as client:
                    found = client.sentinel_get_master_addr_by_name(SERVICE_NAME)
            except redis.RedisError:
                continue
            if found:
                host, port = found
                return host.decode() if isinstance(host, bytes) else str(host), int(port)
        raise RuntimeError(f"no sentinel names a primary for {SERVICE_NAME}")

    def _ready(self) -> bool:
        try:
            host, port = self._ask_sentinel()
            for sentinel in self.sentinels:
                with self._sentinel_client(sentinel) as client:
                    master = client.sentinel_master(SERVICE_NAME)
                    replicas = client.sentinel_slaves(SERVICE_NAME)
                if (master["ip"], master["port"]) != (host, port):
                    return False
                if master["num-other-sentinels"] < 2:
                    return False
                live = [r for r in replicas if not (r["is_sdown"] or r["is_odown"])]
                if len(live) != len(self.servers) - 1:
                    return False
            replica_links = [self._link_up(s) for s in self.servers if s.port != port and s.running]
            return all(replica_links)
        except (redis.RedisError, RuntimeError, KeyError):
            return False

    @staticmethod
    def _link_up(server: RedisServer) -> bool:
        with server.info.probe_client() as client:
            replication = client.info("replication")
        state = (replication.get("role"), replication.get("master_link_status"))
        return state == ("slave", "up")

    @staticmethod
    def offset(server: RedisServer) -> int:
        """How much of the replication stream `server` has: a primary's offset, or what a
        replica applied."""
        with server.info.probe_client() as client:
            replication = client.info("replication")
        if replication["role"] == "master":
            return int(replication["master_repl_offset"])
        return int(replication.get("slave_repl_offset", -1))

    @staticmethod
    def _sentinel_client(sentinel: SentinelServer) -> redis.Redis:
        return sentinel.info.probe_client()

    @staticmethod
    def _wait_until(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {READY_TIMEOUT_S:.0f}s for {what}")
            time.sleep(0.1)
