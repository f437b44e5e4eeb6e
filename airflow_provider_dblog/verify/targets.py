"""Which target a verify run reads, named by the deployment's configuration: `output`, the
tailer's output, when it is the SQL-apply one; `lake`, the Delta tables the compaction folds
the NDJSON output into (`lake/target_rows.py`). A target verify cannot read (a stream's keyed
view) is refused by name, before anything is stored."""

from __future__ import annotations

import os
from pathlib import Path

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.outputs.ndjson import event_files
from airflow_provider_dblog.outputs.sql_apply.target import TableMap
from airflow_provider_dblog.sources.factory import postgres_target_rows
from airflow_provider_dblog.verify.reader import TargetReader

TARGETS = ("output", "lake")
"""The targets a deployment may have: its `[output]`, and its `[lake]` when it has one."""


def check_target(config: Config, target: str) -> None:
    """Refuse, in one line, a target the deployment does not have or verify cannot read."""
    if target not in TARGETS or (target == "lake" and config.lake_root is None):
        have = "output" if config.lake_root is None else "output, lake"
        raise InvalidRequest(f"unknown target {target!r}: this deployment's targets are {have}")
    kind = config.output.get("type")
    if target == "lake":
        if kind != "ndjson" or not config.output.get("directory"):
            raise InvalidRequest(
                "verify reads the lake the compaction folds the NDJSON output into, but "
                f"[output] is type {kind!r}"
            )
        return
    if kind != "sql_apply":
        raise InvalidRequest(
            f"verify reads the sql_apply output's PostgreSQL tables; it cannot read a {kind} "
            "output (its lake, --target lake, if it has one)"
        )
    dsn_env = config.output.get("dsn_env")
    if not dsn_env or not os.environ.get(str(dsn_env)):
        raise InvalidRequest(
            f"the sql_apply output's environment variable {dsn_env!r} (dsn_env) is not set"
        )


def target_reader_for(config: Config, target: str) -> TargetReader:
    """The reader of `target` (checked by `check_target`), connected."""
    check_target(config, target)
    options = config.output
    if target == "lake":
        # Here, not at the top: it loads pyarrow and deltalake, most of `dblog verify`'s start
        # when it reads the SQL target.
        from airflow_provider_dblog.lake.target_rows import LakeRows

        assert config.lake_root is not None
        events = Path(str(options["directory"]))
        return LakeRows(
            config.lake_root, lambda: {p.name: p.stat().st_size for p in event_files(events)}
        )
    reader: TargetReader = postgres_target_rows(
        os.environ[str(options["dsn_env"])],
        TableMap(options.get("table_map")).target_of,
        config.source,
        connect_timeout=int(options.get("connect_timeout", 10)),
    )
    return reader
