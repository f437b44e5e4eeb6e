"""`dblog dump`, `status`, `pause`, `resume`, `cancel`, `throttle`: dumps and their controls.

`dump` registers a request in Redis and runs it in this process (`dump/runner.py`, each chunk
read between watermarks by `dump/chunk.py`); a dump of the same `--dump-id` run again resumes
from its last completed chunk (one whose process died, for instance). A failed or cancelled dump
resumes only when asked with `--resume`, as an Airflow retry does; a done one never. The controls
act on a running dump from anywhere: it reads them between chunks.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import Any

from airflow_provider_dblog.cli.common import add_config_option, config_of, store_of
from airflow_provider_dblog.core.dump_plan import TableProgress
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.dump.request import build_request
from airflow_provider_dblog.dump.retry import SOURCE_PATIENCE_S
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import DumpState, StateStore


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    dump = subparsers.add_parser("dump", help="dump all tables, one table, or keys of a table")
    add_config_option(dump)
    dump.add_argument("--table", help="one table, 'schema.table' (default: all captured tables)")
    dump.add_argument("--keys", help="primary keys of --table: '1,2,3' or JSON '[[1,\"a\"]]'")
    dump.add_argument("--chunk-size", type=int, default=1000)
    dump.add_argument("--parallelism", type=int, default=1)
    dump.add_argument("--max-rows-per-s", type=float, help="rate limit (dblog throttle changes it)")
    dump.add_argument("--dump-id", help="resume this dump, or give a new one its id")
    dump.add_argument(
        "--resume",
        action="store_true",
        help="with --dump-id: run a failed or cancelled dump again from its last completed chunk",
    )
    dump.add_argument("--window-timeout", type=float, default=60.0, help="seconds")
    dump.add_argument("--source-patience", type=float, default=SOURCE_PATIENCE_S, help="seconds")
    dump.set_defaults(func=_dump)

    status = subparsers.add_parser("status", help="tailer health and dumps")
    add_config_option(status)
    status.set_defaults(func=_status)

    for name, help_text in (
        ("pause", "pause a dump after its current chunk"),
        ("resume", "resume a paused dump"),
        ("cancel", "cancel a dump after its current chunk"),
    ):
        control = subparsers.add_parser(name, help=help_text)
        add_config_option(control)
        control.add_argument("dump_id")
        control.set_defaults(func=_control, action=name)

    throttle = subparsers.add_parser("throttle", help="change a dump's pace while it runs")
    add_config_option(throttle)
    throttle.add_argument("dump_id")
    throttle.add_argument("--chunk-size", type=int)
    throttle.add_argument("--delay-ms", type=int, help="pause between chunks")
    throttle.add_argument("--max-rows-per-s", type=float, help="0 removes the limit")
    throttle.set_defaults(func=_throttle)


def _dump(args: argparse.Namespace) -> int:
    config = config_of(args)
    store = store_of(config)
    dump_id = args.dump_id or uuid.uuid4().hex[:12]
    if args.max_rows_per_s is not None and args.max_rows_per_s < 0:
        raise DBLogError(f"--max-rows-per-s must not be negative, got {args.max_rows_per_s}")
    source = source_for(config.source)
    if store.dumps.get(dump_id) is None:
        if args.resume:
            raise DBLogError(f"--resume: there is no dump {dump_id} to resume")
        chunks = source.chunk_source()
        try:
            if args.keys is not None and args.table is None:
                raise DBLogError("--keys needs --table")
            request, key_columns = build_request(
                config,
                chunks,
                dump_id=dump_id,
                tables=None if args.table is None else [args.table],
                keys=args.keys,
                chunk_size=args.chunk_size,
                parallelism=args.parallelism,
            )
        finally:
            chunks.close()
        store.dumps.create(request, key_columns)
    elif not _runnable_again(store, dump_id, args.resume):
        return 1
    if args.max_rows_per_s is not None:
        store.dumps.throttle(dump_id, max_rows_per_s=args.max_rows_per_s)
    print(f"dump {dump_id}: running (dblog pause|resume|cancel|throttle {dump_id})")
    state = run_dump(
        store,
        source.chunk_source,
        dump_id,
        window_timeout_s=args.window_timeout,
        source_patience_s=args.source_patience,
        on_progress=_print_progress,
    )
    print(f"\ndump {dump_id}: {state}")
    return 0 if state == "done" else 1


def _runnable_again(store: StateStore, dump_id: str, resume: bool) -> bool:
    """Whether a stored dump may run again, reopened if it failed or was cancelled and
    `--resume` asks for it; says why not on stderr. An unfinished dump (its process died, or it
    is paused) just runs on from its progress."""
    status = store.dumps.status(dump_id)
    assert status is not None, f"dump {dump_id} has a request but no status"
    if status.state is DumpState.DONE:
        print(f"dump {dump_id} is done: there is nothing left to resume", file=sys.stderr)
        return False
    if not status.state.finished:
        return True
    if not resume:
        reason = f" ({one_line(status.reason)})" if status.reason else ""
        print(
            f"dump {dump_id} is {status.state}{reason}; to run it again from its last "
            f"completed chunk: dblog dump --dump-id {dump_id} --resume",
            file=sys.stderr,
        )
        return False
    if not store.dumps.reopen(dump_id):
        print(f"dump {dump_id} is done: there is nothing left to resume", file=sys.stderr)
        return False
    return True


def _print_progress(dump_id: str, progress: TableProgress) -> None:
    state = "done" if progress.done else "running"
    line = f"{progress.table}: {progress.chunks_done} chunks, {progress.rows_done} rows, {state}"
    sys.stdout.write(f"\r  {line}   ")
    sys.stdout.flush()


def _status(args: argparse.Namespace) -> int:
    config = config_of(args)
    store = store_of(config)
    print(status_table(store))
    return 0


def status_table(store: StateStore) -> str:
    lines = []
    health = store.tailer.health()
    if health is None:
        lines.append("tailer: no heartbeat (not running?)")
    else:
        lines.append(f"tailer: {health.owner}, heartbeat {health.age_ms} ms ago, {health.metrics}")
    lines.append(f"{'dump':14} {'state':10} {'chunks':>8} {'rows':>10} {'retried':>8}  reason")
    for dump_id in store.dumps.ids():
        status = store.dumps.status(dump_id)
        if status is None:
            continue
        lines.append(
            f"{dump_id:14} {status.state:10} {status.chunks:>8} {status.rows:>10} "
            f"{status.windows_retried:>8}  {one_line(status.reason)}"
        )
    return "\n".join(lines)


def one_line(reason: str) -> str:
    """A reason on one line of the table: a database error's lines (its statement, the caret
    under it) joined with " | "."""
    return " | ".join(line.strip() for line in reason.splitlines() if line.strip())


def _control(args: argparse.Namespace) -> int:
    store = store_of(config_of(args))
    action = {
        "pause": store.dumps.pause,
        "resume": store.dumps.resume,
        "cancel": store.dumps.cancel,
    }
    if not action[args.action](args.dump_id):
        print(f"dump {args.dump_id} is finished or unknown", file=sys.stderr)
        return 1
    print(f"dump {args.dump_id}: {args.action} requested")
    return 0


def _throttle(args: argparse.Namespace) -> int:
    store = store_of(config_of(args))
    changed = store.dumps.throttle(
        args.dump_id,
        chunk_size=args.chunk_size,
        delay_ms=args.delay_ms,
        max_rows_per_s=args.max_rows_per_s,
    )
    if not changed:
        print(f"dump {args.dump_id} is finished or unknown", file=sys.stderr)
        return 1
    print(f"dump {args.dump_id}: throttle updated")
    return 0
