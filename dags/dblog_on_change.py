"""dblog_on_change: runs when a captured table changes (inserts, updates and deletes, read from
the change stream) or after a dump or repair of it, and logs what changed.

The tables are the assets `dblog://<source>/<schema>.<table>`, each watched the standard way
of Airflow's event-driven scheduling: an `AssetWatcher` whose trigger is common-messaging's
`MessageQueueTrigger(scheme="dblog", ...)`, which builds DBLog's change trigger. It reads the
Redis Stream output and fires one asset event per batch of changes, with the batch's table,
counts by op and first and last position. Start from this DAG to run work on change: the task
gets every asset event that triggered the run (`assets.dblog_table` builds the same asset in
one call).

The DAG processor's environment names what to watch: DBLOG_SOURCE_NAME (`[source] name`,
default `shop`) and DBLOG_WATCH_TABLES (comma-separated, default `public.orders`); and, as for
the other DAGs, DBLOG_CONN_ID.
"""

from __future__ import annotations

import functools
import logging
import operator
import os
from typing import Any

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_provider_dblog.assets import table_uri
from airflow_provider_dblog.operators.chain import DAG_DEFAULTS, DBLOG_CONN_ID

SOURCE = os.environ.get("DBLOG_SOURCE_NAME", "shop")
TABLES = [t.strip() for t in os.environ.get("DBLOG_WATCH_TABLES", "public.orders").split(",")]

log = logging.getLogger(__name__)


def watched(table: str) -> Asset:
    """The table's asset, its changes watched on the change stream."""
    trigger = MessageQueueTrigger(
        scheme="dblog", source=SOURCE, tables=[table], dblog_conn_id=DBLOG_CONN_ID
    )
    uri = table_uri(SOURCE, table)
    watcher = AssetWatcher(name=f"dblog_{SOURCE}_{table}", trigger=trigger)
    return Asset(name=uri, uri=uri, group="dblog", watchers=[watcher])


def describe(extra: dict[str, Any]) -> dict[str, Any]:
    """What one asset event says: a batch of log changes, or a finished dump."""
    if extra.get("from_trigger"):
        payload: dict[str, Any] = extra["payload"]
        return {"origin": "log", **payload}
    return {"origin": "dump", **extra}


with DAG(
    dag_id="dblog_on_change",
    description="DBLog: run when a captured table changes, deletes included",
    doc_md=__doc__,
    schedule=functools.reduce(operator.or_, [watched(t) for t in TABLES]),
    max_active_runs=1,
    **DAG_DEFAULTS,
) as dag:

    @task
    def log_changes(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """Log each triggering event: table, ops and positions (or the dump), and return
        them."""
        changes = []
        seen = set()  # an event that came through an alias is listed under it too
        for events in (triggering_asset_events or {}).values():
            for event in events:
                uri = event.asset.uri
                if (uri, str(event.timestamp)) in seen:
                    continue
                seen.add((uri, str(event.timestamp)))
                change = describe(dict(event.extra or {}))
                if change["origin"] == "log":
                    log.info(
                        "%s changed: table %s, ops %s, positions %s..%s",
                        uri,
                        change["table"],
                        change["ops"],
                        change["first_position"],
                        change["last_position"],
                    )
                else:
                    log.info(
                        "%s dumped: table %s, dump %s, %s rows",
                        uri,
                        change["table"],
                        change["dump_id"],
                        change["rows"],
                    )
                changes.append(change)
        return changes

    log_changes()
