"""The DBLog hook: one Airflow connection for one DBLog deployment (one source).

The connection (type `dblog`) is the Redis state store where dumps are requested, controlled
and followed: host, port, login (an ACL user), password and schema (the Redis database number),
or, with the `sentinels` extra, the primary the sentinels name `service_name` (its host and port
unused; `sentinel_password` if the sentinels have one); `ssl` turns TLS on, verified against
`ca_file`, with the client certificate `cert_file` and `key_file` if given. Its extras
hold the rest of the deployment's configuration: the TOML's `[source]`, `[output]` and,
optionally, `[tailer]` and `[lake]` sections as JSON objects (`source`, `output`, `tailer`,
`lake`), checked by the TOML's own loader, so that no worker needs a file. Or, instead, they
name the source (`source_name`, as in events and Redis keys) and the deployment's TOML file
(`config_path`, the same file the tailer reads), which is checked to name the same source and
Redis. The source's password comes from `source_password`, or from the password of another
connection (`source_conn_id`, e.g. an existing postgres or mysql connection); both stay in
Airflow's secrets. They reach the Spark dump only through the environment variables the
configuration names (`password_env`; `SECRET_ENV_DEFAULTS` for a connection whose extra names
none), never argv or properties.

Nothing here touches the network until a method is called.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import quote

import redis.asyncio
from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from airflow_provider_dblog.config import Config, ConfigError, load_config, parse_config
from airflow_provider_dblog.core.dump_plan import DumpRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.dump.request import build_request
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import AsyncStateReader, DumpStatus, StateStore, TailerHealth
from airflow_provider_dblog.state.connection import (
    RedisSettings,
    RedisSettingsError,
    parse_redis_settings,
)


def connection_extras(conn: Any) -> dict[str, Any]:
    """The connection's extras by field name; forms of older UIs store them prefixed
    (`extra__dblog__source_name`). A field left blank is left out: empty text, null, or an
    empty JSON object (a section's field in the form, untouched).

    Read from the raw JSON, not `extra_dejson`, which hands every extra value to the secrets
    masker on each read: the masker warns "Skipping masking for a secret as it's too short" at
    a value under five characters (a source named `shop`) before it checks that the value's
    name is secret, and it cannot be told apart from a short password. The one secret here,
    `source_password`, is masked by name where it is read."""
    prefix = f"extra__{DBLogHook.conn_type}__"
    try:
        extra = json.loads(conn.extra or "{}")
    except ValueError:
        raise ConfigError(f"connection {conn.conn_id!r}: its extra is not JSON") from None
    if not isinstance(extra, dict):
        raise ConfigError(f"connection {conn.conn_id!r}: its extra is not a JSON object")
    return {k.removeprefix(prefix): v for k, v in extra.items() if v not in ("", None, {})}


CONFIG_SECTIONS = ("source", "output", "tailer", "lake")
"""The TOML's sections that a connection's extra holds, as JSON objects, instead of a
`config_path`; its `[redis]` is the connection's own host, port, login and schema."""

SECRET_ENV_DEFAULTS = {
    "source": "DBLOG_SOURCE_PASSWORD",
    "redis": "DBLOG_REDIS_PASSWORD",
    "sentinel": "DBLOG_SENTINEL_PASSWORD",
}
"""The environment variables that carry a connection's passwords to the Spark dump when its
extra holds the configuration (a `source` extra may name its own `password_env`)."""


@dataclass(frozen=True)
class DBLogConnection:
    """What a `dblog` connection holds, read once. `redis` is where the store is, built and
    checked as the TOML's `[redis]` is (state/connection.py); the passwords stay here.

    The configuration is either in the extra (`config_data`: its sections, checked as soon as
    the connection is read) or in the TOML file at `config_path`, never both."""

    conn_id: str
    redis: RedisSettings
    password: str | None = field(repr=False)
    sentinel_password: str | None = field(repr=False)
    source_name: str
    config_path: str | None
    config_data: dict[str, Any] | None = field(repr=False)
    source_password: str | None = field(repr=False)

    @classmethod
    def parse(cls, conn: Any, source_password: str | None) -> DBLogConnection:
        extra = connection_extras(conn)
        where = f"connection {conn.conn_id!r}"
        schema = conn.schema or "0"
        if not str(schema).isdigit():
            raise ConfigError(f"{where}: schema is the Redis database number, got {schema!r}")
        redis_section = _redis_section(conn, int(schema), extra)
        try:
            settings = parse_redis_settings(redis_section)
        except RedisSettingsError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        config_data = _config_data(conn, extra, redis_section)
        if config_data is None:
            missing = [name for name in ("source_name", "config_path") if not extra.get(name)]
            if missing == ["source_name", "config_path"]:
                raise ConfigError(
                    f"{where} holds no DBLog configuration: give its source and output extras "
                    "(the TOML's [source] and [output] as JSON objects), or a config_path and "
                    "a source_name"
                )
            if missing:
                raise ConfigError(f"{where} needs {' and '.join(missing)} in its extras")
            source_name = extra["source_name"]
        else:
            source_name = parse_config(config_data, where).source.name
            if extra.get("source_name", source_name) != source_name:
                raise ConfigError(
                    f"{where} has source_name {extra['source_name']!r} but its source extra "
                    f"names {source_name!r}: leave source_name out"
                )
        if extra.get("sentinel_password"):
            mask_secret(str(extra["sentinel_password"]), "sentinel_password")
        return cls(
            conn_id=conn.conn_id,
            redis=settings,
            password=conn.password or None,
            sentinel_password=extra.get("sentinel_password") or None,
            source_name=source_name,
            config_path=extra.get("config_path"),
            config_data=config_data,
            source_password=source_password,
        )

    def read_config(self) -> Config:
        """The deployment's configuration: the extra's, or the TOML's checked to describe the
        same source and Redis as the connection (the Spark dump reads the TOML: both must
        point at one store)."""
        where = f"connection {self.conn_id!r}"
        if self.config_data is not None:
            return parse_config(self.config_data, where)
        assert self.config_path is not None
        config = load_config(self.config_path)
        if config.source.name != self.source_name:
            raise ConfigError(
                f"{where} names source {self.source_name!r} but "
                f"{self.config_path} configures source {config.source.name!r}"
            )
        if config.redis.where != self.redis.where:
            raise ConfigError(
                f"{where} points at Redis {self.redis.where} but "
                f"{self.config_path} at {config.redis.where}: the dump would report elsewhere"
            )
        return config

    def redis_client(self) -> Redis:
        return self.redis.client(
            password=self.password, sentinel_password=self.sentinel_password, **_TIMEOUTS
        )

    def async_redis_client(self) -> AsyncRedis:
        return self.redis.async_client(
            password=self.password, sentinel_password=self.sentinel_password, **_TIMEOUTS
        )


def _config_data(
    conn: Any, extra: dict[str, Any], redis_section: dict[str, Any]
) -> dict[str, Any] | None:
    """The configuration's sections from the extra, None if it holds none (a `config_path`
    connection). The passwords' variables are the defaults unless `source` names its own."""
    where = f"connection {conn.conn_id!r}"
    if "redis" in extra:
        raise ConfigError(
            f"{where}: its Redis is the connection's host, port, login, password and schema "
            "(or its sentinels), not a redis extra"
        )
    data = {name: extra[name] for name in CONFIG_SECTIONS if name in extra}
    if not data:
        return None
    if extra.get("config_path"):
        raise ConfigError(
            f"{where} has both a config_path and the extras {', '.join(data)}: keep the "
            "configuration in one place"
        )
    source = data.get("source")
    source_secret = extra.get("source_password") or extra.get("source_conn_id")
    if isinstance(source, dict) and "password_env" not in source and source_secret:
        data["source"] = {**source, "password_env": SECRET_ENV_DEFAULTS["source"]}
    redis_section = dict(redis_section)
    if conn.password:
        redis_section["password_env"] = SECRET_ENV_DEFAULTS["redis"]
    if extra.get("sentinel_password"):
        redis_section["sentinel_password_env"] = SECRET_ENV_DEFAULTS["sentinel"]
    return {**data, "redis": redis_section}


_TIMEOUTS = {"socket_timeout": 30, "socket_connect_timeout": 10}


def _redis_section(conn: Any, db: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The connection as a TOML `[redis]` section: host, port, login and schema, or the
    `sentinels` extra (comma-separated host:port) with `service_name`; TLS by the `ssl` extra;
    the certificate files by their extras."""
    tls = str(extra.get("ssl", "false")).lower() in ("true", "1", "yes")
    files = {k: extra[k] for k in ("ca_file", "cert_file", "key_file") if extra.get(k)}
    if extra.get("sentinels"):
        sentinels = [a.strip() for a in str(extra["sentinels"]).split(",") if a.strip()]
        section = {"sentinels": sentinels, "service_name": extra.get("service_name"), "db": db}
        if conn.login:
            section["username"] = conn.login
        return {**section, "tls": tls, **files}
    user = f"{quote(conn.login, safe='')}@" if conn.login else ""
    scheme = "rediss" if tls else "redis"
    return {"url": f"{scheme}://{user}{conn.host or '127.0.0.1'}:{conn.port or 6379}/{db}", **files}


class DBLogHook(BaseHook):
    """Requests, follows and controls dumps of one DBLog source through its Redis state store.

    Its connection form is declared in `get_provider_info` (`conn-fields`), as Airflow 3.2+
    wants, so the UI renders it without importing this module.

    :param dblog_conn_id: a connection of type `dblog`.
    """

    conn_name_attr = "dblog_conn_id"
    default_conn_name = "dblog_default"
    conn_type = "dblog"
    hook_name = "DBLog"

    def __init__(self, dblog_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dblog_conn_id = dblog_conn_id

    # -- the connection ------------------------------------------------------------------------

    @cached_property
    def settings(self) -> DBLogConnection:
        conn = self.get_connection(self.dblog_conn_id)
        return DBLogConnection.parse(conn, self._source_password(connection_extras(conn)))

    def _source_password(self, extra: dict[str, Any]) -> str | None:
        if extra.get("source_password"):
            mask_secret(str(extra["source_password"]), "source_password")
            return str(extra["source_password"])
        if extra.get("source_conn_id"):
            return self.get_connection(extra["source_conn_id"]).password or None
        return None

    @cached_property
    def config(self) -> Config:
        """The deployment's configuration, from the connection (`DBLogConnection.read_config`)."""
        return self.settings.read_config()

    def secret_env(self) -> dict[str, str]:
        """The passwords under the environment variable names the configuration gives them: the
        Spark dump's (driver and local executors) only way to them. Never log or template it."""
        config, settings = self.config, self.settings
        env = {}
        if config.redis.password_env and settings.password:
            env[config.redis.password_env] = settings.password
        if config.redis.sentinel_password_env and settings.sentinel_password:
            env[config.redis.sentinel_password_env] = settings.sentinel_password
        if config.source.password_env and settings.source_password:
            env[config.source.password_env] = settings.source_password
        return env

    def export_secrets(self) -> None:
        """Put `secret_env()` into this process's environment (a task process), for the source
        reads done here and for the `spark-submit` it starts, which inherits it."""
        os.environ.update(self.secret_env())

    def get_conn(self) -> StateStore:
        return StateStore(self.settings.redis_client(), self.settings.source_name)

    @cached_property
    def store(self) -> StateStore:
        return self.get_conn()

    def test_connection(self) -> tuple[bool, str]:
        """Check the configuration, then reach Redis; what the UI's Test button shows: the
        first problem, in the words the commands use for it.

        The UI tests a copy of the form under a random connection id (Airflow's
        `POST /connections/test`), never under the id the user gave: a message says "this
        connection" instead of naming that random id."""
        try:
            config = self.config
            store = self.get_conn()
            health = store.tailer.health()
        except Exception as exc:
            return False, str(exc).replace(f"connection {self.dblog_conn_id!r}", "this connection")
        tailer = "no tailer heartbeat" if health is None else f"tailer {health.owner} alive"
        tables = ", ".join(str(t) for t in config.source.tables)
        return (
            True,
            f"Redis at {store.address} reached; source {config.source.name} ({tables}); {tailer}",
        )

    # -- dumps -----------------------------------------------------------------------------------

    def build_request(
        self,
        dump_id: str,
        *,
        tables: list[str] | None = None,
        keys: str | list[Any] | None = None,
        chunk_size: int | None = None,
        parallelism: int = 1,
        mode: str | None = None,
        where: str | None = None,
        read_only: bool = False,
    ) -> tuple[DumpRequest, dict[TableRef, tuple[str, ...]]]:
        """A validated request, checked as `dblog dump` checks it (`dump.request`): the
        tables' primary keys, the key values and a filter (`where`, for one table and no
        keys) are judged by the source, which must be set up for dumps (for a `read_only`
        dump: one that can be dumped read-only); the keys come back normalised. Stores
        nothing."""
        self.export_secrets()
        source = source_for(self.config.source).chunk_source(read_only=read_only)
        try:
            return build_request(
                self.config,
                source,
                dump_id=dump_id,
                tables=tables,
                keys=keys,
                chunk_size=chunk_size,
                parallelism=parallelism,
                mode=mode,
                where=where,
            )
        finally:
            source.close()

    def submit_or_resume(
        self, request: DumpRequest, key_columns: dict[TableRef, tuple[str, ...]]
    ) -> DumpStatus:
        """Store the request, or, if a request of that id exists (a task retry), make it
        runnable again so that it resumes from its last completed chunk."""
        store = self.store
        if store.dumps.get(request.dump_id) is None:
            store.dumps.create(request, key_columns)
        else:
            store.dumps.reopen(request.dump_id)
        status = store.dumps.status(request.dump_id)
        assert status is not None
        return status

    def dump_status(self, dump_id: str) -> DumpStatus | None:
        return self.store.dumps.status(dump_id)

    def tailer_health(self) -> TailerHealth | None:
        return self.store.tailer.health()

    # -- for triggers (asyncio) -----------------------------------------------------------------

    @classmethod
    async def async_reader(cls, dblog_conn_id: str) -> tuple[AsyncStateReader, redis.asyncio.Redis]:
        """A reader on an asyncio client; close the client when done."""
        settings = await cls._async_settings(dblog_conn_id)
        client = settings.async_redis_client()
        return AsyncStateReader(client, settings.source_name), client

    @classmethod
    async def async_store(cls, dblog_conn_id: str) -> StateStore:
        """A (blocking) store for the rare writes of a trigger: call it through a thread."""
        settings = await cls._async_settings(dblog_conn_id)
        return StateStore(settings.redis_client(), settings.source_name)

    @classmethod
    async def _async_settings(cls, dblog_conn_id: str) -> DBLogConnection:
        """The connection as the triggerer reads it (the source's password is not needed)."""
        return DBLogConnection.parse(await cls.aget_connection(dblog_conn_id), None)
