"""OpenLineage facets of a dump: the source tables it reads, the output the tailer writes.

Optional: without the OpenLineage provider there are none. Naming follows OpenLineage's dataset
conventions (each source names its tables, `Source.lineage_name`: `postgres://host:port` +
`database.schema.table`; `file` + a path). An output whose address is a secret (a Redis Stream
URL, a SQL target DSN, both read from the environment) is named after the source instead,
never by its address. Nothing here may fail a task.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from airflow_provider_dblog.hooks.dblog import DBLogHook
from airflow_provider_dblog.sources.factory import source_for

log = logging.getLogger(__name__)


def dump_lineage(hook: DBLogHook, dump_id: str) -> Any:
    """An `OperatorLineage` for the dump, or None (no OpenLineage, or anything went wrong)."""
    try:
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import Dataset
    except ImportError:
        return None
    try:
        stored = hook.store.dumps.get(dump_id)
        if stored is None:
            return None
        config = hook.config
        source = source_for(config.source)
        inputs = [Dataset(*source.lineage_name(table)) for table in stored.request.tables]
        kind = config.output.get("type")
        if kind == "ndjson":
            output = Dataset("file", str(Path(config.output["directory"]).resolve()))
        else:
            output = Dataset(f"dblog://{config.source.name}", f"output/{kind}")
        return OperatorLineage(inputs=inputs, outputs=[output])
    except Exception as exc:
        log.warning("no OpenLineage facets for dump %s: %s", dump_id, exc)
        return None
