"""The change stream as a common-messaging queue, so that Airflow's standard entry point of
event-driven scheduling, `MessageQueueTrigger`, watches captured tables.

Registered under `queues` in the provider info. Two forms reach it:

- `MessageQueueTrigger(scheme="dblog", source="shop", tables=["public.orders"])`: the keyword
  arguments are `DBLogChangeTrigger`'s (`dblog_conn_id` defaults to `dblog_default`; `ops`,
  `max_changes`, `max_wait_s`);
- `MessageQueueTrigger(queue="dblog://shop/public.orders?conn_id=dblog_default")`, the queue
  URI form (deprecated by common-messaging 2, still served): the table asset's URI
  (`assets.table_uri`), its connection in the optional `conn_id`; further keyword arguments
  are the trigger's other settings.

`MessageQueueTrigger` serializes as the trigger it built: the triggerer runs
`DBLogChangeTrigger` itself, in ack mode (at least once), whichever form the DAG used.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider

from airflow_provider_dblog.assets import SCHEME, table_uri
from airflow_provider_dblog.hooks.dblog import DBLogHook
from airflow_provider_dblog.triggers.changes import DBLogChangeTrigger

URI_FORM = "dblog://<source>/<schema>.<table>[?conn_id=<dblog connection id>]"
FROM_URI = ("dblog_conn_id", "source", "tables")
"""The trigger's arguments a queue URI gives."""


def parse_queue_uri(queue: str) -> dict[str, Any]:
    """The trigger arguments a `dblog://` queue URI names (source, its one table, connection
    id); raises ValueError naming what is wrong with the URI."""
    parts = urlsplit(queue)

    def bad(problem: str) -> ValueError:
        return ValueError(f"queue {queue!r} is not a DBLog queue URI ({URI_FORM}): {problem}")

    if parts.scheme != SCHEME:
        raise bad(f"its scheme is {parts.scheme!r}, not {SCHEME!r}")
    if not parts.netloc:
        raise bad("it names no source")
    table = parts.path.removeprefix("/")
    if "/" in table:
        raise bad(f"one table per queue, got {table!r}")
    if parts.fragment:
        raise bad(f"it has a fragment, #{parts.fragment}")
    try:
        table_uri(parts.netloc, table)
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise bad(str(exc)) from None
    unknown = sorted(set(query) - {"conn_id"})
    if unknown:
        raise bad(f"unknown query parameter(s) {', '.join(unknown)}; the one known is conn_id")
    conn_ids = query.get("conn_id", [DBLogHook.default_conn_name])
    if len(conn_ids) != 1 or not conn_ids[0]:
        raise bad(f"conn_id must be one connection id, got {conn_ids}")
    return {"dblog_conn_id": conn_ids[0], "source": parts.netloc, "tables": [table]}


class DBLogMessageQueueProvider(BaseMessageQueueProvider):
    """The `dblog` scheme and `dblog://` queue URIs, served by `DBLogChangeTrigger`."""

    scheme = SCHEME

    def queue_matches(self, queue: str) -> bool:
        """Every `dblog:` URI, so that a malformed one fails with `parse_queue_uri`'s reason
        instead of "not recognized by any provider"."""
        return urlsplit(queue).scheme == SCHEME

    def trigger_class(self) -> type[DBLogChangeTrigger]:
        return DBLogChangeTrigger

    def trigger_kwargs(self, queue: str, **kwargs: Any) -> dict[str, Any]:
        both = sorted(set(kwargs) & set(FROM_URI))
        if both:
            raise ValueError(
                f"queue {queue!r} names the source, the table and the connection itself "
                f"({URI_FORM}): drop the keyword argument(s) {', '.join(both)}"
            )
        return parse_queue_uri(queue)
