"""Airflow assets for captured tables: a DAG runs when a table changes, deletes included.

URI scheme: `dblog://<source>/<schema>.<table>`, e.g. `dblog://shop/public.orders`; the source
is `[source] name` of the deployment's TOML (the name in events and Redis keys). The asset's
name is its URI. Two things emit an asset's events:

- its watcher, a `DBLogChangeTrigger` reading the change stream (the Redis Stream output), once
  per batch of changes of the table, with the payload `{"source", "table", "ops": {op: count},
  "count", "first_position", "last_position"}` (in the asset event's extra under `payload`);
- a finished dump or repair of the table (`DBLogDumpOperator`, through the `DUMPS` alias
  outlet), with `{"source", "table", "dump_id", "rows", "chunks"}` in the extra, so downstream
  DAGs also run after a backfill.

    from airflow_provider_dblog.assets import dblog_table
    with DAG(dag_id="orders_changed", schedule=[dblog_table("shop", "public.orders")]): ...
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import SplitResult

from airflow.sdk import Asset, AssetAlias, AssetWatcher

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.hooks.dblog import DBLogHook
from airflow_provider_dblog.triggers.changes import DEFAULT_OPS, DBLogChangeTrigger

SCHEME = "dblog"

DUMPS = AssetAlias("dblog_dumps")
"""The dump operator's outlet: when a dump or repair finishes, it adds an event of each dumped
table's asset through this alias."""


def table_uri(source: str, table: str) -> str:
    """`dblog://<source>/<schema>.<table>`; raises ValueError on a malformed table name."""
    if not source or "/" in source or "@" in source or ":" in source:
        raise ValueError(f"a DBLog source name has no '/', '@' or ':', got {source!r}")
    return f"{SCHEME}://{source}/{TableRef.parse(table)}"


def sanitize_uri(parts: SplitResult) -> SplitResult:
    """Airflow's URI handler for the `dblog` scheme (`asset-uris` in the provider info): an
    asset URI of another shape fails the DAG's parse, naming the URI."""
    table = parts.path.removeprefix("/")
    try:
        table_uri(parts.netloc, table)
    except ValueError as exc:
        raise ValueError(
            f"{parts.geturl()!r} is not a DBLog table URI (dblog://<source>/<schema>.<table>): "
            f"{exc}"
        ) from None
    return parts


def dblog_table(
    source: str,
    table: str,
    *,
    dblog_conn_id: str = "dblog_default",
    ops: Iterable[str] = DEFAULT_OPS,
    max_changes: int = 1000,
    max_wait_s: float = 2.0,
) -> Asset:
    """The asset of a captured table, watched on the change stream: schedule a DAG on it to
    run when the table changes. `ops` are the change kinds that count (c, u, d; add r for rows
    a dump re-sends through the stream); a batch holds at most `max_changes` changes and waits
    at most `max_wait_s` after its first one. Bad arguments fail the DAG's parse; a connection,
    source, table or output that does not fit fails the trigger when it starts, naming it."""
    uri = table_uri(source, table)
    trigger = DBLogChangeTrigger(
        dblog_conn_id=dblog_conn_id,
        source=source,
        tables=[table],
        ops=list(ops),
        max_changes=max_changes,
        max_wait_s=max_wait_s,
    )
    watcher = AssetWatcher(name=f"dblog_{source}_{TableRef.parse(table)}", trigger=trigger)
    return Asset(name=uri, uri=uri, group="dblog", watchers=[watcher])


def table_asset(source: str, table: str) -> Asset:
    """The same asset without a watcher: what an outlet names."""
    uri = table_uri(source, table)
    return Asset(name=uri, uri=uri, group="dblog")


def announce_dump(context: Any, outlets: Iterable[Any], hook: DBLogHook, outcome: Any) -> None:
    """Add an event of each table of a finished dump (`outcome`, its `DumpOutcome`) to the
    `DUMPS` alias, if the task has that alias as an outlet (and runs in Airflow: `execute`
    called by hand has no `outlet_events`)."""
    if "outlet_events" not in context:
        return
    if not any(isinstance(o, AssetAlias) and o.name == DUMPS.name for o in outlets):
        return
    stored = hook.store.dumps.get(outcome.dump_id)
    if stored is None:
        return
    source = hook.settings.source_name
    events = context["outlet_events"][DUMPS]
    for table in stored.request.tables:
        extra: dict[str, Any] = {
            "source": source,
            "table": str(table),
            "dump_id": outcome.dump_id,
            "rows": outcome.rows,
            "chunks": outcome.chunks,
        }
        events.add(table_asset(source, str(table)), extra=extra)
