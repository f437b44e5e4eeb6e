"""Airflow and the live view link to each other: a dump task's extra link opens its dump's
page in `dblog ui`, and the dump records the DAG run that asked for it, which the live view
links back to.

The live view's base URL is the `ui_url` extra of the `dblog` connection. Its page of one dump
is `<ui_url>/#dump=<id>`. Airflow 3 calls `get_link` on the worker when the task ends and
keeps the answer in XCom under the link's `xcom_key`; the dump operator also pushes it there
as soon as the dump is requested, so the link works while the dump runs. The api-server
answers from that XCom alone (the serialized DAG names the link and its key; the provider
info's `extra-links` only lists it for `airflow providers links`), and the UI shows a link,
in the task instance's Details tab, only when it has an http(s) URL: without a `ui_url` the
REST API lists it with no URL and the page shows none, which the task log says.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseOperatorLink, Context, conf
from airflow.sdk.types import TaskInstanceKey

from airflow_provider_dblog.config import ConfigError
from airflow_provider_dblog.core.event import JsonValue
from airflow_provider_dblog.hooks.dblog import DBLogHook, connection_extras
from airflow_provider_dblog.operators.request import dump_id_for

log = logging.getLogger(__name__)


def live_view_url(ui_url: str, dump_id: str) -> str:
    """The page of one dump in the live view at `ui_url`."""
    return f"{ui_url.rstrip('/')}/#dump={quote(dump_id, safe='')}"


def ui_url_of(hook: DBLogHook) -> str | None:
    """The connection's `ui_url` extra, checked: an http(s) URL, or None when not set."""
    conn = hook.get_connection(hook.dblog_conn_id)
    url = connection_extras(conn).get("ui_url")
    if url is None:
        return None
    parts = urlsplit(str(url).strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"connection {conn.conn_id!r}: ui_url must be the live view's http(s) URL, such "
            f"as http://dblog-ui.internal:8765/, got {url!r}"
        )
    return parts.geturl()


class DBLogLiveViewLink(BaseOperatorLink):
    """The dump task's dump in the live view: the operator's `dump_id`, or the one the task
    instance gets by default (`dump_id_for`)."""

    name = "DBLog live view"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        ui_url = ui_url_of(DBLogHook(operator.dblog_conn_id))
        if ui_url is None:
            return ""
        dump_id = operator.dump_id or dump_id_for(
            ti_key.dag_id, ti_key.run_id, ti_key.task_id, ti_key.map_index
        )
        return live_view_url(ui_url, dump_id)


def airflow_origin(ti: Any) -> dict[str, JsonValue]:
    """The task instance that asked for a dump, with the URLs of its DAG run and of itself in
    Airflow's UI (`[api] base_url`)."""
    base = conf.get("api", "base_url", fallback="http://localhost:8080/").rstrip("/")
    run_url = f"{base}/dags/{quote(ti.dag_id, safe='')}/runs/{quote(ti.run_id, safe='')}"
    map_index = getattr(ti, "map_index", -1)
    mapped = f"/mapped/{map_index}" if map_index is not None and map_index >= 0 else ""
    return {
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "map_index": map_index,
        "run_url": run_url,
        "task_url": f"{run_url}/tasks/{quote(ti.task_id, safe='')}{mapped}",
    }


def link_dump_and_task(hook: DBLogHook, context: Context, dump_id: str) -> None:
    """As the dump is requested: record the task instance as its origin, and the live view's
    link in the task's XCom (without a `ui_url`, a log line says why there is none). Nothing
    outside a task run (no `ti` in the context); a `ui_url` that is not a URL raises
    `ConfigError`."""
    ti = context.get("ti")
    if ti is None:
        return
    hook.store.dumps.record_origin(dump_id, airflow_origin(ti))
    ui_url = ui_url_of(hook)
    if ui_url is None:
        log.info(
            "no DBLog live view link: connection %s has no ui_url extra (the URL where "
            "dblog ui is reached)",
            hook.dblog_conn_id,
        )
        return
    ti.xcom_push(key=DBLogLiveViewLink().xcom_key, value=live_view_url(ui_url, dump_id))
