"""What the tests of this folder share: a TLS-only Redis with its CA, and `dblog` TOML files
whose `[redis]` section the test spells."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.devservices.tls import TestCA
from airflow_provider_dblog.state import StateStoreUnavailable
from tests.integration.e2e_support import REDIS_PASSWORD_ENV, SourceDatabases


@dataclass(frozen=True)
class TlsRedis:
    """A Redis that speaks TLS only, its certificate for 127.0.0.1 alone, and its CA."""

    info: RedisInfo
    ca: TestCA


def write_redis_config(
    path: Path,
    dbs: SourceDatabases,
    redis: list[str],
    output: dict[str, Any],
    tailer: dict[str, Any] | None = None,
    *,
    source: tuple[str, ...] = (),
    lake: Path | None = None,
) -> Path:
    """A `dblog` TOML for `dbs` whose `[redis]` section is the lines `redis` and the password
    by the name REDIS_PASSWORD_ENV (never the password itself); `source`: more `[source]`
    lines; `lake`: the `[lake] root`."""
    lines = [
        "[source]",
        f'name = "{dbs.config.name}"',
        *dbs.toml_source(),
        *source,
        f'password_env = "{dbs.password_env}"',
        "tables = [" + ", ".join(f'"{t}"' for t in dbs.config.tables) + "]",
        "",
        "[redis]",
        *redis,
        f'password_env = "{REDIS_PASSWORD_ENV}"',
        "",
        "[output]",
        *(f"{k} = {json.dumps(v)}" for k, v in output.items()),
        "",
        "[tailer]",
        *(f"{k} = {json.dumps(v)}" for k, v in (tailer or {}).items()),
        "",
        *([] if lake is None else ["[lake]", f'root = "{lake}"', ""]),
    ]
    path.write_text("\n".join(lines))
    return path


def answered(call: Callable[[], object]) -> bool:
    """Whether `call`, a store call, was answered. Right after a failover a client made before
    it may still hold a connection to the dead primary: that call fails, and the next one asks
    the sentinels again (a condition to wait on)."""
    try:
        call()
    except StateStoreUnavailable:
        return False
    return True
