"""Where a deployment's rows go, opened from its configuration: the tailer's output
(`open_output`, from the `[output]` section) and direct dumps' target (`direct_target_for`).

```
{"type": "ndjson", "directory": "/data/dblog", "max_bytes": 67108864, "lock_timeout_s": 5}
{"type": "redis_stream", "url_env": "DBLOG_OUTPUT_REDIS_URL",
 "per_table": false, "maxlen": 1000000, "max_age_s": null, "prefix": "dblog"}
{"type": "sql_apply", "dsn_env": "DBLOG_TARGET_DSN", "monotonic": true,
 "table_map": {"app.users": "replica.users"}, "connect_timeout": 10}
```
Connection strings carry passwords, so a config names the environment variable that holds one
(`url_env`, `dsn_env`), never the value: configs can be logged and stored as they are. One
lookup (`_secret`) reads them for the outputs and the direct targets alike.

This module composes `outputs/` and `lake/` and sits above them and `dump/`: the tailer, the
`dblog` commands and the Spark applications open what they need here and hand it down; nothing
in those packages imports it. Which direct target a deployment has, and the protocol it
implements, are `direct_target.py`'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import redis

from airflow_provider_dblog.direct_target import (
    DirectTarget,
    check_direct_target,
    direct_target_kind,
)
from airflow_provider_dblog.outputs.base import Output, OutputError
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput
from airflow_provider_dblog.outputs.redis_stream import RedisStreamOutput
from airflow_provider_dblog.outputs.sql_apply import SqlApplyOutput, SqlDirectTarget

if TYPE_CHECKING:  # config.py imports the tailer, which imports this
    from airflow_provider_dblog.config import Config


def _secret(kind: str, options: dict[str, Any], option: str) -> str:
    """The value of the environment variable `options[option]` names (the option removed)."""
    name = options.pop(option, None)
    if not name:
        raise OutputError(f"{kind} output: '{option}' (the environment variable) is required")
    value = os.environ.get(name)
    if not value:
        raise OutputError(f"{kind} output: environment variable {name} ({option}) is not set")
    return value


def _ndjson(options: dict[str, Any]) -> Output:
    if "directory" not in options:
        raise OutputError("ndjson output: 'directory' is required")
    return NdjsonOutput(options.pop("directory"), **options)


def _redis_stream(options: dict[str, Any]) -> Output:
    client = redis.Redis.from_url(_secret("redis_stream", options, "url_env"))
    return RedisStreamOutput(client, **options)


def _sql_apply(options: dict[str, Any]) -> Output:
    return SqlApplyOutput(_secret("sql_apply", options, "dsn_env"), **options)


_OUTPUTS: dict[str, tuple[Callable[[dict[str, Any]], Output], frozenset[str]]] = {
    "ndjson": (_ndjson, frozenset({"directory", "max_bytes", "lock_timeout_s"})),
    "redis_stream": (
        _redis_stream,
        frozenset({"url_env", "per_table", "maxlen", "max_age_s", "prefix"}),
    ),
    "sql_apply": (
        _sql_apply,
        frozenset({"dsn_env", "monotonic", "table_map", "connect_timeout"}),
    ),
}
"""Each output type: what opens it from its options, and the options it knows."""


def _options(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The output's type and its other options, each checked to be one the type knows."""
    options = dict(config)
    kind = options.pop("type", None)
    if kind not in _OUTPUTS:
        raise OutputError(f"unknown output type {kind!r}; one of: {', '.join(sorted(_OUTPUTS))}")
    known = _OUTPUTS[kind][1]
    for name in sorted(options):
        if name not in known:
            raise OutputError(
                f"{kind} output: unknown option {name!r}; known: {', '.join(sorted(known))}"
            )
    return kind, options


def open_output(config: Mapping[str, Any], *, max_wait_s: float | None = None) -> Output:
    """The output `config["type"]` names, built from the other keys (see the module docstring).
    `max_wait_s` caps how long a call may wait on another writer's lock (the NDJSON directory's):
    a tailer must keep renewing its lease meanwhile."""
    kind, options = _options(config)
    if max_wait_s is not None and kind == "ndjson":
        options["lock_timeout_s"] = min(options.get("lock_timeout_s", max_wait_s), max_wait_s)
    return _OUTPUTS[kind][0](options)


def direct_target_for(config: Config) -> DirectTarget:
    """The deployment's direct target, connected with the secrets its configuration names."""
    check_direct_target(config)
    if direct_target_kind(config) == "lake":
        # Here, not at the top: pyarrow and deltalake (the `lake` extra) cost a process that
        # never writes a lake, such as the tailer, about 80 MiB and a second of start-up.
        from airflow_provider_dblog.lake.direct import LakeDirectTarget

        return LakeDirectTarget.from_config(config)
    _, options = _options(config.output)
    del options["monotonic"]  # a direct target of SQL apply is monotonic
    dsn = _secret("sql_apply", options, "dsn_env")
    return SqlDirectTarget(dsn, config.source.name, **options)
