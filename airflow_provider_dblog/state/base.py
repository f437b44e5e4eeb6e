"""What every state store shares: the client, the source's keys, the errors of an unreachable
Redis, the decoding of replies, and the Lua snippets the stores' scripts start with."""

from __future__ import annotations

import functools
import json
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import redis
import redis.sentinel
from redis.commands.core import Script
from redis.typing import EncodableT

from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import JsonValue
from airflow_provider_dblog.state.client_certificate import (
    ClientCertificateRefused,
    UnknownSentinelService,
    refused_client_certificate,
)
from airflow_provider_dblog.state.errors import (
    RedisCertificateRefused,
    StateStoreError,
    StateStoreRefusesWrites,
    StateStoreUnavailable,
)
from airflow_provider_dblog.state.keys import SourceKeys

NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
"""Lua: `now`, the Redis server's clock in ms, so the dump, the tailer and Airflow on different
hosts compare timestamps on one clock."""

BEAT = (
    NOW_MS
    + """
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'at_ms', now, 'metrics', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
)
"""Lua: a service's heartbeat. KEYS: the heartbeat hash. ARGV: owner, metrics JSON, ttl_ms."""

FENCE = """
if ARGV[1] ~= '' and redis.call('GET', KEYS[#KEYS]) ~= ARGV[1] then return -1 end
"""
"""Lua: the fencing check of every tailer write. ARGV[1] is the writer's token ('' = not a
tailer write), the last key the source's `tailer:token`; -1 when a newer token was handed out."""


def address_of(client: redis.Redis) -> str:
    """Where Redis is, without the password (a Sentinel service by its name and sentinels)."""
    pool = client.connection_pool
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        sentinels = ", ".join(address_of(s) for s in pool.sentinel_manager.sentinels)
        return f"service {pool.service_name} (sentinels {sentinels})"
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


class RedisStore:
    """A store of one concern of one source. Thread-safe as far as the redis client is
    (redis-py's connection pool is): the dump's threads and the tailer may share one."""

    def __init__(self, client: redis.Redis, source: str) -> None:
        self._r = client
        self.keys = SourceKeys(source)
        self._scripts: dict[str, Script] = {}

    @property
    def source(self) -> str:
        return self.keys.source

    @property
    def address(self) -> str:
        return address_of(self._r)

    def _eval(self, lua: str, keys: Sequence[str], args: Sequence[EncodableT] = ()) -> Any:
        """Run a script by its SHA, loading it on first use (and again after a Redis restart)."""
        script = self._scripts.get(lua)
        if script is None:
            script = self._scripts[lua] = self._r.register_script(lua)
        return script(keys=keys, args=args)


S = TypeVar("S", bound=RedisStore)
P = ParamSpec("P")
R = TypeVar("R")


def reachable(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Turn redis-py's connection failures into `StateStoreUnavailable`, and a Redis that
    refuses writes into `StateStoreRefusesWrites`, each naming the server and what to fix."""

    @functools.wraps(method)
    def wrapper(store: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(store, *args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise unreachable(store._r, exc) from exc
        except redis.ResponseError as exc:
            why = refused_write(exc)
            if why is None:
                raise
            raise StateStoreRefusesWrites(
                f"the Redis state store at {store.address} refuses writes: {why}"
            ) from exc

    return wrapper


def unreachable(client: redis.Redis, error: redis.RedisError) -> StateStoreError:
    """The error for a connection of `client` that failed with `error`: an outage to wait
    out, or `RedisCertificateRefused` when the server's TLS certificate did not verify or the
    server refused this client's (`client_certificate`: it shows as an EOF, so the server is
    asked). (redis-py raises its ConnectionError while handling the ssl module's error.)"""
    address = address_of(client)
    if isinstance(error, ClientCertificateRefused):
        return RedisCertificateRefused(
            f"the Redis state store at {address} cannot be used: {error}; check [redis] "
            "cert_file and key_file: a certificate signed by a CA the sentinels and servers "
            "trust, not expired: nothing retries this"
        )
    if isinstance(error, UnknownSentinelService):
        return StateStoreError(
            f"the Redis state store at {address} cannot be used: {error}; check [redis] "
            "service_name: nothing retries this"
        )
    cause = error.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return RedisCertificateRefused(
            f"the Redis state store at {address} cannot be used: its TLS certificate does not "
            f"verify ({cause.verify_message}); check [redis] ca_file and the host "
            "in url (with sentinels, the address they give): nothing retries this"
        )
    if isinstance(cause, ssl.SSLError) and (alert := refused_client_certificate(client)):
        return RedisCertificateRefused(
            f"the Redis state store at {address} cannot be used: the server refused this "
            f"client's TLS certificate ({alert}); check [redis] cert_file and key_file: a "
            "certificate signed by a CA the server trusts, not expired: nothing retries this"
        )
    return StateStoreUnavailable(f"the Redis state store at {address} cannot be reached: {error}")


def refused_write(error: redis.ResponseError) -> str | None:
    """Why Redis refused a write, with the fix, or None for any other error reply."""
    if isinstance(error, redis.exceptions.OutOfMemoryError):
        return (
            "it is full (used memory above maxmemory, policy noeviction); "
            "raise maxmemory or free memory"
        )
    if isinstance(error, redis.exceptions.ReadOnlyError):
        return (
            "it is a read-only replica (READONLY; a failover may have demoted it); "
            "point [redis] at the primary or use sentinels"
        )
    if str(error).startswith("MISCONF"):
        return (
            "it cannot save to disk (MISCONF: its last background save failed); "
            "fix its disk or persistence settings"
        )
    return None


def text(value: bytes | str) -> str:
    """Works whether or not the client decodes responses."""
    return value.decode() if isinstance(value, bytes) else value


def decode_hash(raw: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    return {text(k): text(v) for k, v in raw.items()}


def compact_json(value: JsonValue) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def ttl_ms(seconds: float) -> int:
    ms = round(seconds * 1000)
    if ms < 1:
        raise InvalidRequest(f"a TTL must be positive, got {seconds}s")
    return ms
