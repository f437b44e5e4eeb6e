"""Outputs of the ordered change stream, and `open_output`, which builds one from a config dict.

```
{"type": "ndjson", "directory": "/data/dblog", "max_bytes": 67108864, "lock_timeout_s": 5}
{"type": "redis_stream", "url_env": "DBLOG_OUTPUT_REDIS_URL",
 "per_table": false, "maxlen": 1000000, "max_age_s": null, "prefix": "dblog"}
{"type": "sql_apply", "dsn_env": "DBLOG_TARGET_DSN", "monotonic": true,
 "table_map": {"app.users": "replica.users"}, "connect_timeout": 10}
```
Connection strings carry passwords, so a config names the environment variable that holds one
(`url_env`, `dsn_env`), never the value: configs can be logged and stored as they are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import redis

from airflow_provider_dblog.outputs.base import (
    Output,
    OutputError,
    OutputFenced,
    OutputUnavailable,
    TargetTableMissing,
)
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput, read_events
from airflow_provider_dblog.outputs.redis_stream import RedisStreamOutput
from airflow_provider_dblog.outputs.sql_apply import SqlApplyOutput

__all__ = [
    "NdjsonOutput",
    "Output",
    "OutputError",
    "OutputFenced",
    "OutputUnavailable",
    "RedisStreamOutput",
    "SqlApplyOutput",
    "TargetTableMissing",
    "open_output",
    "read_events",
]


def _secret(kind: str, options: dict[str, Any], option: str) -> str:
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


def open_output(config: Mapping[str, Any], *, max_wait_s: float | None = None) -> Output:
    """The output `config["type"]` names, built from the other keys (see the module docstring).
    `max_wait_s` caps how long a call may wait on another writer's lock (the NDJSON directory's):
    a tailer must keep renewing its lease meanwhile."""
    options = dict(config)
    if max_wait_s is not None and options.get("type") == "ndjson":
        options["lock_timeout_s"] = min(options.get("lock_timeout_s", max_wait_s), max_wait_s)
    kind = options.pop("type", None)
    if kind not in _OUTPUTS:
        raise OutputError(f"unknown output type {kind!r}; one of: {', '.join(sorted(_OUTPUTS))}")
    make, known = _OUTPUTS[kind]
    for name in sorted(options):
        if name not in known:
            raise OutputError(
                f"{kind} output: unknown option {name!r}; known: {', '.join(sorted(known))}"
            )
    return make(options)
