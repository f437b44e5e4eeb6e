"""The one TOML configuration file of a `dblog` deployment.

Secrets are never in the file: each password is read from the environment variable the file
names (`password_env`), so it never appears on a command line, in a log line or in an event.

    [source]
    type = "postgres"                  # parsed by that type: see sources/factory.py
    name = "shop"                      # the source name in events and in Redis keys
    dsn = "host=127.0.0.1 port=5432 dbname=shop user=dblog"
    password_env = "DBLOG_SOURCE_PASSWORD"
    tables = ["public.accounts", "public.orders"]
    slot = "dblog"                     # optional
    publication = "dblog"              # optional

    [redis]
    url = "redis://127.0.0.1:6379/0"
    password_env = "DBLOG_REDIS_PASSWORD"

    [output]
    type = "ndjson"                    # or "redis_stream", "sql_apply": see outputs/
    directory = "out/events"

    [tailer]                           # optional
    window_ttl_s = 120
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.sources.base import SourceConfig, SourceError
from airflow_provider_dblog.sources.factory import parse_source_config
from airflow_provider_dblog.tailer.settings import TailerSettings


class ConfigError(DBLogError):
    pass


@dataclass(frozen=True)
class Config:
    source: SourceConfig
    redis_url: str
    redis_password_env: str | None
    output: dict[str, Any]
    tailer: dict[str, Any]

    def redis_client(self) -> redis.Redis:
        password = _secret(self.redis_password_env) if self.redis_password_env else None
        return redis.Redis.from_url(self.redis_url, password=password)


def _secret(env: str) -> str:
    value = os.environ.get(env)
    if value is None:
        raise ConfigError(f"environment variable {env} (named by password_env) is not set")
    return value


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    try:
        source = data["source"]
        redis_section = data["redis"]
        output = dict(data["output"])
    except KeyError as missing:
        raise ConfigError(f"config file {path} has no [{missing.args[0]}] section") from None
    if "password" in source or "password" in redis_section:
        raise ConfigError(
            f"{path} holds a password: put it in an environment variable and name it with "
            "password_env"
        )
    try:
        source_config = parse_source_config(source)
    except SourceError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    return Config(
        source=source_config,
        redis_url=redis_section.get("url", "redis://127.0.0.1:6379/0"),
        redis_password_env=redis_section.get("password_env"),
        output=output,
        tailer=_tailer_options(path, data.get("tailer", {})),
    )


def _tailer_options(path: Path, section: dict[str, Any]) -> dict[str, Any]:
    known = {f.name for f in dataclasses.fields(TailerSettings)}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ConfigError(
            f"[tailer] in {path} has unknown option(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
    return dict(section)
