"""The configuration of a `dblog` deployment: a TOML file, or an Airflow connection.

The commands read the file; Airflow's hook reads the same sections from its connection's
extra instead (`hooks/dblog.py`), so that no worker needs the file. Both go through
`parse_config`, so a mistake is named the same way wherever it was made.

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

    [redis]                            # parsed by state/connection.py
    url = "redis://127.0.0.1:6379/0"   # or sentinels = ["host:26379", ...] + service_name
    password_env = "DBLOG_REDIS_PASSWORD"

    [output]
    type = "ndjson"                    # or "redis_stream", "sql_apply": see targets.py
    directory = "out/events"

    [tailer]                           # optional
    window_ttl_s = 120
    metrics_port = 9187                # optional: serve Prometheus metrics on this port

    [lake]                             # optional: the Delta tables of airflow_provider_dblog.lake
    root = "/var/lib/dblog/lake"       # one table per captured table: <root>/<schema>.<table>
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis import Redis

from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.settings import TailerSettings
from airflow_provider_dblog.sources.base import SourceConfig, SourceError
from airflow_provider_dblog.sources.factory import parse_source_config
from airflow_provider_dblog.state.connection import (
    RedisSettings,
    RedisSettingsError,
    parse_redis_settings,
)


class ConfigError(DBLogError):
    pass


@dataclass(frozen=True)
class Config:
    source: SourceConfig
    redis: RedisSettings
    """`[redis]`: where the state store is (one Redis or a Sentinel service), TLS, user."""
    output: dict[str, Any]
    tailer: TailerSettings
    """`[tailer]`, checked and typed when the file is read; the defaults without one."""
    lake_root: str | None = None
    """`[lake] root`: where the lake tables live (the compaction's output, direct dumps'
    target); None without a `[lake]` section."""

    def redis_client(self) -> Redis:
        try:
            return self.redis.client()
        except RedisSettingsError as exc:
            raise ConfigError(f"[redis] {exc}") from None


def load_config(path: str | Path) -> Config:
    """The file parsed and checked: every error names the file, the section and the key."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    return parse_config(data, f"config file {path}")


def parse_config(data: Mapping[str, Any], where: str) -> Config:
    """The sections checked, whether a TOML file or an Airflow connection holds them (one
    loader, so both are judged alike); every error names `where`, the section and the key."""
    source = _section(where, data, "source")
    redis_section = _section(where, data, "redis")
    output = _section(where, data, "output")
    if "password" in source or "password" in redis_section:
        raise ConfigError(
            f"{where} holds a password: put it in an environment variable and name it with "
            "password_env"
        )
    try:
        source_config = parse_source_config(source)
    except SourceError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    try:
        redis_settings = parse_redis_settings(redis_section)
    except RedisSettingsError as exc:
        raise ConfigError(f"[redis] {exc.key} in {where} {exc.problem}") from None
    return Config(
        source=source_config,
        redis=redis_settings,
        output=output,
        tailer=_tailer_options(where, _section(where, data, "tailer", required=False)),
        lake_root=_lake_root(where, data),
    )


_LAKE_KEYS = ("root",)


def _lake_root(where: str, data: Mapping[str, Any]) -> str | None:
    if "lake" not in data:
        return None
    section = _section(where, data, "lake")
    unknown = sorted(set(section) - set(_LAKE_KEYS))
    if unknown:
        raise ConfigError(
            f"[lake] in {where} has unknown option(s) {', '.join(unknown)}; "
            f"known: {', '.join(_LAKE_KEYS)}"
        )
    root = section.get("root")
    if not isinstance(root, str) or not root:
        raise ConfigError(f"[lake] root in {where} must be a non-empty path, got {root!r}")
    return root


def _section(
    where: str, data: Mapping[str, Any], name: str, *, required: bool = True
) -> dict[str, Any]:
    if name not in data:
        if required:
            raise ConfigError(f"{where} has no [{name}] section")
        return {}
    section = data[name]
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: {name} must be a [{name}] section, got {section!r}")
    return dict(section)


def _tailer_options(where: str, section: dict[str, Any]) -> TailerSettings:
    """Known options only: each a positive finite number (a whole one where the setting counts
    things), `metrics_port` a TCP port and `metrics_address` an address to bind."""
    fields = {f.name: f for f in dataclasses.fields(TailerSettings)}
    unknown = sorted(set(section) - set(fields))
    if unknown:
        raise ConfigError(
            f"[tailer] in {where} has unknown option(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(fields))}"
        )
    settings: dict[str, Any] = {}
    for name, value in section.items():
        if name == "metrics_port":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 65536:
                raise ConfigError(
                    f"[tailer] metrics_port in {where} must be a TCP port (1-65535), got {value!r}"
                )
            settings[name] = value
            continue
        if name == "metrics_address":
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(
                    f"[tailer] metrics_address in {where} must be an address to bind, "
                    f'such as "127.0.0.1" or "0.0.0.0", got {value!r}'
                )
            settings[name] = value
            continue
        whole = fields[name].type in ("int", int)
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if number is None or (whole and not isinstance(number, int)):
            number = None
        if number is None or not math.isfinite(number) or number <= 0:
            what = "a whole number" if whole else "a number"
            raise ConfigError(f"[tailer] {name} in {where} must be {what} above 0, got {value!r}")
        settings[name] = number if whole else float(number)
    return TailerSettings(**settings)
