"""The DBLog hook: one Airflow connection for one DBLog deployment (one source).

The connection (type `dblog`) is the Redis state store where dumps are requested, controlled
and followed: host, port, login, password and schema (the Redis database number). Its extras
name the source (`source_name`, as in events and Redis keys) and the deployment's TOML file
(`config_path`, the same file the tailer and the Spark dump read). The source's password comes
from `source_password`, or from the password of another connection (`source_conn_id`, e.g. an
existing postgres or mysql connection); both stay in Airflow's secrets. They reach the Spark
dump only through the environment variables the TOML names (`password_env`), never argv or
properties.

Nothing here touches the network until a method is called.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret

from airflow_provider_dblog.config import Config, ConfigError, load_config
from airflow_provider_dblog.core.dump_plan import DumpRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.dump.request import build_request
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import AsyncStateReader, DumpStatus, StateStore, TailerHealth


def connection_extras(conn: Any) -> dict[str, Any]:
    """The connection's extras by field name; forms of older UIs store them prefixed
    (`extra__dblog__source_name`).

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
    return {k.removeprefix(prefix): v for k, v in extra.items() if v not in ("", None)}


@dataclass(frozen=True)
class DBLogConnection:
    """What a `dblog` connection holds, read once."""

    host: str
    port: int
    db: int
    username: str | None
    password: str | None = field(repr=False)
    ssl: bool
    source_name: str
    config_path: str
    source_password: str | None = field(repr=False)

    @classmethod
    def parse(cls, conn: Any, source_password: str | None) -> DBLogConnection:
        extra = connection_extras(conn)
        missing = [name for name in ("source_name", "config_path") if not extra.get(name)]
        if missing:
            raise ConfigError(
                f"connection {conn.conn_id!r} needs {' and '.join(missing)} in its extras"
            )
        schema = conn.schema or "0"
        if not str(schema).isdigit():
            raise ConfigError(
                f"connection {conn.conn_id!r}: schema is the Redis database number, got {schema!r}"
            )
        return cls(
            host=conn.host or "127.0.0.1",
            port=int(conn.port or 6379),
            db=int(schema),
            username=conn.login or None,
            password=conn.password or None,
            ssl=str(extra.get("ssl", "false")).lower() in ("true", "1", "yes"),
            source_name=extra["source_name"],
            config_path=extra["config_path"],
            source_password=source_password,
        )

    def redis_kwargs(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "db": self.db,
            "username": self.username,
            "password": self.password,
            "ssl": self.ssl,
            "socket_timeout": 30,
            "socket_connect_timeout": 10,
        }


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
        """The deployment's TOML, checked to describe the same source and Redis as the
        connection (the Spark dump reads the TOML: both must point at one store)."""
        settings = self.settings
        config = load_config(settings.config_path)
        if config.source.name != settings.source_name:
            raise ConfigError(
                f"connection {self.dblog_conn_id!r} names source {settings.source_name!r} but "
                f"{settings.config_path} configures source {config.source.name!r}"
            )
        url = urlsplit(config.redis_url)
        toml_db = int(url.path.strip("/") or 0)
        toml_at = (url.hostname or "127.0.0.1", url.port or 6379, toml_db)
        if toml_at != (settings.host, settings.port, settings.db):
            raise ConfigError(
                f"connection {self.dblog_conn_id!r} points at Redis "
                f"{settings.host}:{settings.port}/{settings.db} but {settings.config_path} at "
                f"{toml_at[0]}:{toml_at[1]}/{toml_at[2]}: the dump would report elsewhere"
            )
        return config

    def secret_env(self) -> dict[str, str]:
        """The passwords under the environment variable names the TOML gives them: what the
        Spark dump (driver and local executors) needs. Never log or template it."""
        config, settings = self.config, self.settings
        env = {}
        if config.redis_password_env and settings.password:
            env[config.redis_password_env] = settings.password
        if config.source.password_env and settings.source_password:
            env[config.source.password_env] = settings.source_password
        return env

    def export_secrets(self) -> None:
        """Put `secret_env()` into this process's environment (a task process), for the source
        reads done here and for the `spark-submit` it starts, which inherits it."""
        os.environ.update(self.secret_env())

    def get_conn(self) -> StateStore:
        return StateStore(redis.Redis(**self.settings.redis_kwargs()), self.settings.source_name)

    @cached_property
    def store(self) -> StateStore:
        return self.get_conn()

    def test_connection(self) -> tuple[bool, str]:
        """Reach Redis and read the TOML; what the UI's Test button shows.

        The UI tests a copy of the form under a random connection id (Airflow's
        `POST /connections/test`), never under the id the user gave: a message says "this
        connection" instead of naming that random id."""
        try:
            store = self.get_conn()
            health = store.tailer.health()
            config = self.config
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
    ) -> tuple[DumpRequest, dict[TableRef, tuple[str, ...]]]:
        """A validated request, checked as `dblog dump` checks it (`dump.request`): the
        tables' primary keys, the key values and a filter (`where`, for one table and no
        keys) are judged by the source, which must be set up for dumps; the keys come back
        normalised. Stores nothing."""
        self.export_secrets()
        source = source_for(self.config.source).chunk_source()
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
        client = redis.asyncio.Redis(**settings.redis_kwargs())
        return AsyncStateReader(client, settings.source_name), client

    @classmethod
    async def async_store(cls, dblog_conn_id: str) -> StateStore:
        """A (blocking) store for the rare writes of a trigger: call it through a thread."""
        settings = await cls._async_settings(dblog_conn_id)
        return StateStore(redis.Redis(**settings.redis_kwargs()), settings.source_name)

    @classmethod
    async def _async_settings(cls, dblog_conn_id: str) -> DBLogConnection:
        """The connection as the triggerer reads it (the source's password is not needed)."""
        return DBLogConnection.parse(await cls.aget_connection(dblog_conn_id), None)
