"""`dblog status`: the tailer's health, the compaction follower's (its lake freshness), every
dump and every verify run, for people and for scripts.

The table gives each dump one line, its reason cut to the first line (a database error's
statement and hint follow on lines of their own), then each verify run one line (its counts
over all its tables; `dblog verify --verify-id ID` reports one per table); `--dump ID` shows
one dump whole (request with its filter, progress per table, controls, driver, the full
reason), and `--json` prints the same as JSON.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from airflow_provider_dblog.cli.common import (
    add_config_option,
    config_of,
    first_line,
    option,
    store_of,
)
from airflow_provider_dblog.core import values
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.core.event import JsonValue
from airflow_provider_dblog.state import (
    CompactorHealth,
    StateStore,
    TablesChange,
    TailerHealth,
)
from airflow_provider_dblog.state.verifies import COUNTERS

REASON_WIDTH = 100
_TABLES_SHOWN = 3
"""The newest changes of the captured tables the table shows (`--json` has them all)."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    status = subparsers.add_parser(
        "status", help="tailer and compaction health, dumps and verify runs"
    )
    add_config_option(status)
    status.add_argument(
        "--dump", type=option(values.dump_id), help="one dump in full, its whole reason too"
    )
    status.add_argument("--json", action="store_true", help="JSON for scripts")
    status.set_defaults(func=_status)


def _status(args: argparse.Namespace) -> int:
    store = store_of(config_of(args))
    if args.dump is not None:
        detail = dump_detail(store, args.dump)
        print(json.dumps(detail, indent=2) if args.json else detail_text(detail))
        return 0
    if args.json:
        print(json.dumps(status_json(store), indent=2))
    else:
        print(status_table(store))
    return 0


def status_json(store: StateStore) -> dict[str, JsonValue]:
    """The tailer's and the compaction follower's health (None without a heartbeat), every
    dump's status and every verify run's."""
    health = store.tailer.health()
    compaction = store.compactor.health()
    dumps: list[JsonValue] = []
    for dump in store.dumps.ids():
        status = store.dumps.status(dump)
        if status is not None:
            dumps.append(status.to_json(dump))
    tables: list[JsonValue] = [c.to_json() for c in store.tailer.tables_changes()]
    return {
        "tailer": None if health is None else health.to_json(),
        "compaction": None if compaction is None else compaction.to_json(),
        "tables": tables,
        "dumps": dumps,
        "verifies": [
            run for v in store.verifies.ids() if (run := store.verifies.summary(v)) is not None
        ],
    }


def status_table(store: StateStore) -> str:
    """The tailer on one line, the compaction follower on one if it beats, then one aligned
    line per dump, and one per verify run if there are any."""
    rows = []
    for dump in store.dumps.ids():
        status = store.dumps.status(dump)
        if status is not None:
            rows.append((dump, status))
    width = max([len("dump"), *(len(d) for d, _ in rows)])
    lines = [
        _tailer_line(store.tailer.health()),
        *_tables_lines(store.tailer.tables_changes()),
        *_compaction_line(store.compactor.health()),
        f"{'dump':{width}}  {'state':9} {'chunks':>8} {'rows':>10} {'retried':>7}  reason",
    ]
    cut = []
    for dump, status in rows:
        reason = first_line(status.reason, REASON_WIDTH)
        if reason != status.reason.strip():
            cut.append(dump)
        lines.append(
            f"{dump:{width}}  {status.state:9} {status.chunks:>8} {status.rows:>10} "
            f"{status.windows_retried:>7}  {reason}".rstrip()
        )
    if cut:
        lines.append(f"(the whole reason: dblog status --dump {cut[0] if len(cut) == 1 else 'ID'})")
    lines += _verify_lines(store)
    return "\n".join(lines)


def _verify_lines(store: StateStore) -> list[str]:
    """A header and one aligned line per verify run; none without runs."""
    runs = [run for v in store.verifies.ids() if (run := store.verifies.summary(v)) is not None]
    if not runs:
        return []
    width = max([len("verify"), *(len(str(run["verify_id"])) for run in runs)])
    columns = ("chunks", *COUNTERS)
    header = " ".join(f"{c.replace('_', ' '):>8}" for c in columns)
    repairs = [_repair_cell(run) for run in runs]
    repair_width = max(len(cell) for cell in ["repair", *repairs])
    lines = [f"{'verify':{width}}  {'state':9} {header}  {'repair':{repair_width}}  reason"]
    for run, repair in zip(runs, repairs, strict=True):
        numbers = " ".join(f"{run[c]:>8}" for c in columns)
        reason = first_line(str(run["reason"]), REASON_WIDTH)
        lines.append(
            f"{run['verify_id']:{width}}  {run['state']:9} {numbers}  "
            f"{repair:{repair_width}}  {reason}".rstrip()
        )
    return lines


def _repair_cell(run: dict[str, JsonValue]) -> str:
    """A run's repair: the extra keys it removed and its key dumps; `-` without a repair."""
    dumps = run["repair_dumps"]
    if not isinstance(dumps, list):
        return "-"
    return ",".join([f"removed:{run['removed']}", *(str(d) for d in dumps)])


def _tables_lines(changes: list[TablesChange]) -> list[str]:
    """The captured tables' changes a running tailer took (SIGHUP), the newest first."""
    lines = []
    for change in changes[:_TABLES_SHOWN]:
        at = datetime.fromtimestamp(change.at_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
        added = ", ".join(f"+{t}" for t in change.added)
        removed = ", ".join(f"-{t}" for t in change.removed)
        what = ", ".join(part for part in (added, removed) if part) or "no change"
        lines.append(f"tables: {what} (reloaded {at} UTC by {change.owner})")
    return lines


def _tailer_line(health: TailerHealth | None) -> str:
    if health is None:
        return "tailer: no heartbeat (not running?)"
    m = health.metrics
    parts = [f"tailer: {health.owner}, heartbeat {health.age_ms} ms ago"]
    for key, label in (
        ("state", "state {}"),
        ("lag_ms", "lag {} ms"),
        ("events", "{} events"),
        ("open_windows", "{} open windows"),
        ("windows_failed", "{} windows failed"),
    ):
        if key in m:
            parts.append(label.format(m[key]))
    return ", ".join(parts)


def _compaction_line(health: CompactorHealth | None) -> list[str]:
    """The folding follower's line; none without a heartbeat (a lake compacted in batches, or
    none at all)."""
    if health is None:
        return []
    m = health.summary()
    freshness = m["freshness_s"]
    return [
        ", ".join(
            [
                f"compaction: {m['owner']}, heartbeat {m['age_ms']} ms ago",
                "freshness unknown" if freshness is None else f"freshness {freshness:.1f} s",
                f"{m['events']} events folded",
                f"{m['pending_bytes']} bytes pending",
            ]
        )
    ]


def dump_detail(store: StateStore, dump: str) -> dict[str, JsonValue]:
    """One dump whole; `DBLogError` if there is none."""
    stored = store.dumps.get(dump)
    status = store.dumps.status(dump)
    if stored is None or status is None:
        raise DBLogError(f"no dump {dump} (dblog status lists them)")
    request = stored.request
    controls = store.dumps.controls(dump)
    detail = status.to_json(dump)
    detail["request"] = {
        "kind": request.kind.value,
        "tables": [str(t) for t in request.tables],
        "keys": [list(k) for k in request.keys],
        "where": request.where,
        "read_only": request.read_only,
        "chunk_size": request.chunk_size,
        "parallelism": request.parallelism,
    }
    detail["progress"] = [p.to_json() for p in store.dumps.load_progress(dump).values()]
    detail["controls"] = None if controls is None else controls.to_json()
    detail["driver"] = store.dumps.driver(dump)
    return detail


def detail_text(detail: dict[str, Any]) -> str:
    request = detail["request"]
    keys = f", {len(request['keys'])} keys" if request["keys"] else ""
    lines = [
        f"dump {detail['dump_id']}: {detail['state']}",
        f"  request   {request['kind']} of {', '.join(request['tables'])}{keys}, "
        f"chunk size {request['chunk_size']}, parallelism {request['parallelism']}"
        f"{', read-only' if request.get('read_only') else ''}",
    ]
    if request.get("where"):  # the filter, a line of its text to a line of output
        first, *rest = request["where"].splitlines()
        lines += [f"  where     {first}", *(f"            {line}" for line in rest)]
    lines += [
        f"  done      {detail['chunks']} chunks, {detail['rows']} rows, "
        f"{detail['windows_retried']} windows retried",
        f"  driver    {detail['driver'] or 'none beating'}",
    ]
    controls = detail["controls"]
    if controls is not None:
        rate = controls["max_rows_per_s"]
        lines.append(
            f"  controls  {'paused, ' if controls['paused'] else ''}"
            f"{'cancelled, ' if controls['cancelled'] else ''}chunk size "
            f"{controls['chunk_size']}, delay {controls['delay_ms']} ms, "
            f"{'no rate limit' if rate is None else f'{rate:g} rows/s'}"
        )
    for progress in detail["progress"]:
        state = "done" if progress["done"] else "started" if progress["started"] else "waiting"
        lines.append(
            f"  table     {progress['table']}: {progress['chunks_done']} chunks, "
            f"{progress['rows_done']} rows, {state}"
        )
    if detail["reason"]:
        lines.append("  reason")
        lines += [f"    {line}" for line in detail["reason"].splitlines()]
    return "\n".join(lines)
