"""Outputs of the ordered change stream: NDJSON files, a Redis Stream, SQL apply. Each
implements `Output` (`base.py`); `targets.open_output` opens the one a configuration names."""

from __future__ import annotations

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
    "read_events",
]
