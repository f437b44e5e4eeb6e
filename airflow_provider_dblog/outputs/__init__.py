"""Outputs of the ordered change stream, and `open_output`, which builds one from a config dict.

```
{"type": "ndjson", "directory": "/data/dblog", "max_bytes": 67108864}
```
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow_provider_dblog.outputs.base import (
    Output,
    OutputError,
    OutputUnavailable,
    TargetTableMissing,
)
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput, read_events

__all__ = [
    "NdjsonOutput",
    "Output",
    "OutputError",
    "OutputUnavailable",
    "TargetTableMissing",
    "open_output",
    "read_events",
]


def _ndjson(options: dict[str, Any]) -> Output:
    if "directory" not in options:
        raise OutputError("ndjson output: 'directory' is required")
    return NdjsonOutput(options.pop("directory"), **options)


_OUTPUTS: dict[str, tuple[Callable[[dict[str, Any]], Output], frozenset[str]]] = {
    "ndjson": (_ndjson, frozenset({"directory", "max_bytes"})),
}


def open_output(config: Mapping[str, Any]) -> Output:
    """The output `config["type"]` names, built from the other keys (see the module docstring)."""
    options = dict(config)
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
