"""How to reach the Redis state store: one Redis, or the primary Sentinel names; TLS; ACL user.

Every process that opens the store (tailer, dumps, Spark executors, the UI, Airflow's hook and
triggers) builds its client here, from `RedisSettings`: plain data (it is pickled to Spark
executors), passwords only by the name of the environment variable that holds them.

With `sentinels`, the client asks them for the primary of `service_name` before it connects,
and again after a connection fails or the server it reached answers READONLY (it was demoted):
a failover costs the callers one `StateStoreUnavailable` they already wait out, then they go on
with the promoted replica (redis-py's `SentinelConnectionPool`). TLS, when on, covers the
sentinels and the primary alike, verified against `ca_file` (the system's CAs without one) and
the server's host name; `cert_file` and `key_file` are the client's own certificate, for a
server that asks for one (`tls-auth-clients`).
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.state.client_certificate import (
    ClientCertificateRefused,
    UnknownSentinelService,
    refused_client_certificate,
)

DEFAULT_URL = "redis://127.0.0.1:6379/0"
SENTINEL_TIMEOUT_S = 5.0
"""How long a sentinel may take to answer before the next one is asked: an address that answers
nothing must not hold the client up for the kernel's TCP timeout."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYS = (
    "url",
    "password_env",
    "sentinels",
    "service_name",
    "sentinel_password_env",
    "username",
    "db",
    "tls",
    "ca_file",
    "cert_file",
    "key_file",
)


class RedisSettingsError(DBLogError):
    """A `[redis]` option is wrong; `key` names it."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key} {problem}")
        self.key = key
        self.problem = problem


@dataclass(frozen=True)
class RedisSettings:
    """Where the state store is and how to talk to it. Without `sentinels`, `url` says where
    (`rediss://` for TLS; a user and the database in it as usual); with them, `service_name`,
    `username`, `db` and `tls` do, and `url` is not used."""

    url: str = DEFAULT_URL
    password_env: str | None = None
    sentinels: tuple[tuple[str, int], ...] = ()
    service_name: str | None = None
    sentinel_password_env: str | None = None
    """The sentinels' own password (`requirepass` of the sentinels), if they have one."""
    username: str | None = None
    db: int = 0
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @property
    def uses_tls(self) -> bool:
        return self.tls or urlsplit(self.url).scheme == "rediss"

    @property
    def where(self) -> str:
        """The store's address without secrets: what errors and the hook's checks name."""
        if self.sentinels:
            at = ", ".join(f"{host}:{port}" for host, port in self.sentinels)
            return f"service {self.service_name} db {self.db} (sentinels {at})"
        parts = urlsplit(self.url)
        if parts.scheme == "unix":
            return f"unix:{parts.path}"
        db = int(parts.path.strip("/") or 0)
        return f"{parts.hostname or '127.0.0.1'}:{parts.port or 6379}/{db}"

    def client(
        self,
        *,
        password: str | None = None,
        sentinel_password: str | None = None,
        **options: Any,
    ) -> redis.Redis:
        """A client on the store (connecting at its first command). The passwords are for a
        caller that holds them already (an Airflow connection); otherwise `password_env` and
        `sentinel_password_env` name them. `options`: more redis-py connection options
        (timeouts, `decode_responses`)."""
        kwargs = self._kwargs(password, options)
        if not self.sentinels:
            return redis.Redis.from_url(self.url, **kwargs)
        assert self.service_name is not None
        sentinel = _Sentinel(
            list(self.sentinels), sentinel_kwargs=self._sentinel_kwargs(sentinel_password)
        )
        client: redis.Redis = sentinel.master_for(self.service_name, **kwargs)
        return client

    def async_client(
        self,
        *,
        password: str | None = None,
        sentinel_password: str | None = None,
        **options: Any,
    ) -> redis.asyncio.Redis:
        """`client()` on redis.asyncio, for Airflow's triggers."""
        kwargs = self._kwargs(password, options)
        if not self.sentinels:
            return redis.asyncio.Redis.from_url(self.url, **kwargs)
        assert self.service_name is not None
        sentinel = _AsyncSentinel(
            list(self.sentinels), sentinel_kwargs=self._sentinel_kwargs(sentinel_password)
        )
        client: redis.asyncio.Redis = sentinel.master_for(self.service_name, **kwargs)
        return client

    def _kwargs(self, password: str | None, options: Mapping[str, Any]) -> dict[str, Any]:
        if password is None and self.password_env:
            password = secret(self.password_env, "password_env")
        kwargs: dict[str, Any] = {"password": password, **self._tls_kwargs(), **options}
        if self.sentinels:
            kwargs.update(username=self.username, db=self.db)
            if self.tls:
                kwargs["ssl"] = True
        return kwargs

    def _sentinel_kwargs(self, password: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "socket_timeout": SENTINEL_TIMEOUT_S,
            "socket_connect_timeout": SENTINEL_TIMEOUT_S,
            # One try per sentinel: the next one is asked instead, and the client's own
            # retries ask them all again.
            "retry": Retry(NoBackoff(), 0),
            **self._tls_kwargs(),
        }
        if self.tls:
            kwargs["ssl"] = True
        if password is None and self.sentinel_password_env:
            password = secret(self.sentinel_password_env, "sentinel_password_env")
        if password is not None:
            kwargs["password"] = password
        return kwargs

    def _tls_kwargs(self) -> dict[str, Any]:
        if not self.uses_tls:
            return {}
        files = {
            "ssl_ca_certs": self.ca_file,
            "ssl_certfile": self.cert_file,
            "ssl_keyfile": self.key_file,
        }
        return {name: value for name, value in files.items() if value is not None}


class _Sentinel(redis.sentinel.Sentinel):
    """redis-py's Sentinel, whose error when no sentinel names a primary says why each one
    did not (redis-py's names them by the repr of their connection pools)."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        try:
            found: tuple[str, int] = super().discover_master(service_name)
            return found
        except redis.sentinel.MasterNotFoundError:
            answers: list[Any] = []
            for sentinel in self.sentinels:
                try:
                    answers.append(sentinel.sentinel_masters())
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    answers.append(exc)
        raise no_primary_error(service_name, self.sentinels, answers)


class _AsyncSentinel(redis.asyncio.sentinel.Sentinel):
    """`_Sentinel` on redis.asyncio."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        try:
            found: tuple[str, int] = await super().discover_master(service_name)
            return found
        except redis.asyncio.sentinel.MasterNotFoundError:
            answers: list[Any] = []
            for sentinel in self.sentinels:
                try:
                    answers.append(await sentinel.sentinel_masters())
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    answers.append(exc)
        # In a thread: asking a sentinel about our client certificate blocks (up to seconds).
        raise await asyncio.to_thread(no_primary_error, service_name, self.sentinels, answers)


def no_primary_error(
    service_name: str, sentinels: Sequence[Any], answers: Sequence[Any]
) -> redis.ConnectionError:
    """The error when no sentinel named a primary: a `MasterNotFoundError` saying why, unless a
    sentinel's TLS certificate did not verify or it refused this client's: then that sentinel's
    own error, whose context is the ssl module's error, or `ClientCertificateRefused` (asked of
    the sentinel, as a refusal reads as an EOF), so that the stores report a configuration
    error instead of an outage (`state.base.unreachable`). Raised outside an `except`, the
    sentinel's error keeps its context."""
    for answer in answers:
        if isinstance(answer, redis.ConnectionError) and isinstance(
            answer.__context__, ssl.SSLCertVerificationError
        ):
            return answer
    for sentinel, answer in zip(sentinels, answers, strict=True):
        if isinstance(answer, redis.ConnectionError) and (
            alert := refused_client_certificate(sentinel)
        ):
            return ClientCertificateRefused(
                f"sentinel {_address(sentinel)} refused this client's TLS certificate ({alert})"
            )
    why = no_primary(service_name, sentinels, answers)
    if answers and all(isinstance(a, dict) and service_name not in a for a in answers):
        return UnknownSentinelService(why)
    return redis.sentinel.MasterNotFoundError(why)


def _address(sentinel: Any) -> str:
    kwargs = sentinel.connection_pool.connection_kwargs
    return f"{kwargs.get('host')}:{kwargs.get('port')}"


def no_primary(service_name: str, sentinels: Sequence[Any], answers: Sequence[Any]) -> str:
    """Why no sentinel named a primary: each one's answer to SENTINEL MASTERS (or its error)."""
    reasons = []
    for sentinel, answer in zip(sentinels, answers, strict=True):
        at = _address(sentinel)
        if isinstance(answer, Exception):
            reasons.append(f"sentinel {at} does not answer ({answer})")
        elif service_name not in answer:
            known = ", ".join(sorted(answer)) or "none"
            reasons.append(f"sentinel {at} watches no service {service_name!r} (it knows {known})")
        else:
            reasons.append(f"sentinel {at} sees the primary down: a failover may be under way")
    return f"no sentinel names a primary for service {service_name!r}: " + "; ".join(reasons)


def secret(env: str, key: str) -> str:
    value = os.environ.get(env)
    if value is None:
        raise RedisSettingsError(key, f"names environment variable {env}, which is not set")
    return value


def parse_address(text: object) -> tuple[str, int]:
    """`host:port` (`[::1]:26379` for IPv6) as (host, port); ValueError saying what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not text")
    host, colon, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port")
    return host, int(port)


def parse_redis_settings(section: Mapping[str, Any]) -> RedisSettings:
    """The `[redis]` section checked; `RedisSettingsError` names the first bad key."""
    unknown = sorted(set(section) - set(_KEYS))
    if unknown:
        raise RedisSettingsError(", ".join(unknown), f"unknown; known: {', '.join(sorted(_KEYS))}")
    password_env = _env_name(section, "password_env")
    sentinel_password_env = _env_name(section, "sentinel_password_env")
    tls = section.get("tls", False)
    if not isinstance(tls, bool):
        raise RedisSettingsError("tls", f"must be true or false, got {tls!r}")
    ca_file, cert_file, key_file = (_file(section, k) for k in ("ca_file", "cert_file", "key_file"))
    files = {"ca_file": ca_file, "cert_file": cert_file, "key_file": key_file}
    if (cert_file is None) != (key_file is None):
        raise RedisSettingsError("cert_file", "and key_file go together: give both or neither")
    if "sentinels" not in section:
        for key in ("service_name", "sentinel_password_env", "username", "db", "tls"):
            if key in section:
                raise RedisSettingsError(
                    key, "is for sentinels only; without them the url says it (rediss:// for TLS)"
                )
        url = _url(section.get("url", DEFAULT_URL))
        if urlsplit(url).scheme != "rediss" and any(files.values()):
            raise RedisSettingsError("ca_file", "is for TLS: a rediss:// url turns it on")
        return RedisSettings(
            url=url,
            password_env=password_env,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
        )
    if "url" in section:
        raise RedisSettingsError(
            "url", "is not used with sentinels: give service_name, username, db and tls instead"
        )
    sentinels = section["sentinels"]
    if not isinstance(sentinels, list) or not sentinels:
        raise RedisSettingsError("sentinels", f"must be a list of host:port, got {sentinels!r}")
    try:
        addresses = tuple(parse_address(entry) for entry in sentinels)
    except ValueError as exc:
        raise RedisSettingsError("sentinels", f"must be a list of host:port: {exc}") from None
    service_name = section.get("service_name")
    if not isinstance(service_name, str) or not service_name.strip():
        raise RedisSettingsError(
            "service_name", f"must name the primary the sentinels watch, got {service_name!r}"
        )
    username = section.get("username")
    if username is not None and (not isinstance(username, str) or not username):
        raise RedisSettingsError("username", f"must be an ACL user name, got {username!r}")
    db = section.get("db", 0)
    if not isinstance(db, int) or isinstance(db, bool) or db < 0:
        raise RedisSettingsError("db", f"must be a database number (0 or more), got {db!r}")
    if any(files.values()) and not tls:
        raise RedisSettingsError("ca_file", "is for TLS: set tls = true")
    return RedisSettings(
        password_env=password_env,
        sentinels=addresses,
        service_name=service_name,
        sentinel_password_env=sentinel_password_env,
        username=username,
        db=db,
        tls=tls,
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
    )


def _url(url: object) -> str:
    try:
        if not isinstance(url, str):
            raise ValueError("it is not text")
        redis.ConnectionPool.from_url(url)  # parses only: connects to nothing
        parts = urlsplit(url)
        if parts.scheme != "unix" and not parts.path.strip("/").isdigit() and parts.path.strip("/"):
            raise ValueError("the database after the port must be a number")
    except ValueError as exc:
        raise RedisSettingsError(
            "url", f"is not a Redis URL (redis://[user@]host:port/db): {url!r}: {exc}"
        ) from None
    if parts.password:
        raise RedisSettingsError(
            "url", "holds a password: put it in an environment variable named by password_env"
        )
    return url


def _env_name(section: Mapping[str, Any], key: str) -> str | None:
    value = section.get(key)
    if value is not None and not (isinstance(value, str) and _ENV_NAME.fullmatch(value)):
        raise RedisSettingsError(key, f"must name an environment variable: {value!r}")
    return value


def _file(section: Mapping[str, Any], key: str) -> str | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise RedisSettingsError(key, f"must be a file path, got {value!r}")
    if not Path(value).is_file():
        raise RedisSettingsError(key, f"is {value!r}, which is not a readable file")
    return value
