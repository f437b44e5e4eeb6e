"""The PostgreSQL source: pgoutput over streaming replication for the log, keyset chunks for dumps.

Both paths turn values into JSON with the same converters (`converters.py`), from the text
PostgreSQL's output functions print, so a row read by a dump and by the log is the same JSON.
"""
# ruff: noqa: E402  (the compiled modules' finder goes first: see `compiled`)

from airflow_provider_dblog.sources.postgres.compiled import use_plain_python_if_asked

use_plain_python_if_asked()

from airflow_provider_dblog.sources.postgres.chunks import PostgresChunkSource
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig
from airflow_provider_dblog.sources.postgres.replication import PostgresLogReader
from airflow_provider_dblog.sources.postgres.setup import ensure_setup, preflight

__all__ = [
    "PostgresChunkSource",
    "PostgresLogReader",
    "PostgresSourceConfig",
    "ensure_setup",
    "preflight",
]
