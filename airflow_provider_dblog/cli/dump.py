"""`dblog dump`, `pause`, `resume`, `cancel`, `throttle`: dumps and their controls.

`dump` checks the whole request first (options, the source being set up, tables, key values
against their columns' types: see `dump/request.py`), so a bad one exits 2 with nothing
stored; a source or Redis it cannot reach for those checks is waited for as a running dump
waits (`--source-patience`), then it exits 2 saying what was away. Then it registers the
request in Redis and runs it in this process (`dump/runner.py`, each chunk read between
watermarks by `dump/chunk.py`), showing a progress bar per table on a terminal and a plain
line per step otherwise (`progress.py`). A dump of the same `--dump-id` run again resumes
from its last completed chunk (one whose process died, for instance), unless a live process
still runs it, read-only or not as it was first asked (`--read-only`: its chunk sources write
nothing). A failed or cancelled dump resumes only when asked with `--resume`, as an Airflow
retry does; a done one never. The controls act on a running dump from anywhere: it reads
them between chunks.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from airflow_provider_dblog.cli import interrupts
from airflow_provider_dblog.cli.common import (
    add_config_option,
    config_of,
    control,
    first_line,
    option,
    setup_logging,
    store_of,
)
from airflow_provider_dblog.cli.progress import DumpProgressView
from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core import values
from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.dump_plan import DumpRequest
from airflow_provider_dblog.core.errors import DBLogError, InvalidRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.dump.direct import InProcessDirectReader
from airflow_provider_dblog.dump.request import IN_PROCESS_CHUNK_SIZE, build_request
from airflow_provider_dblog.dump.retry import SOURCE_PATIENCE_S, Patience
from airflow_provider_dblog.dump.runner import gone_from_this_host, run_dump
from airflow_provider_dblog.sources.base import Source, SourceUnavailable
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import DumpState, StateStore, StateStoreUnavailable
from airflow_provider_dblog.targets import direct_target_for

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    dump = subparsers.add_parser("dump", help="dump all tables, one table, or keys of a table")
    add_config_option(dump)
    dump.add_argument("--table", help="one table, 'schema.table' (default: all captured tables)")
    dump.add_argument("--keys", help="primary keys of --table: '1,2,3' or JSON '[[1,\"a\"]]'")
    dump.add_argument(
        "--where",
        help="only the rows of --table matching this condition, in the source's SQL "
        "(e.g. \"region = 'eu' AND updated_at >= '2026-11-23'\")",
    )
    dump.add_argument(
        "--chunk-size",
        type=option(values.whole_number(1)),
        help="rows a chunk (default: 1,000 sequenced, 100,000 direct)",
    )
    dump.add_argument(
        "--parallelism",
        type=option(values.whole_number(1)),
        default=1,
        help="chunks read at once, each from its own key range of the table: faster, and more "
        "load on the source (default: %(default)s)",
    )
    dump.add_argument(
        "--mode",
        choices=[m.value for m in DumpMode],
        help="direct: this process writes the rows into the target (the [lake] root, or an "
        "SQL-apply output in monotonic mode; the default with a lake); sequenced (the default "
        "otherwise): the tailer emits them into the ordered output",
    )
    dump.add_argument(
        "--read-only",
        action="store_true",
        help="write nothing to the source: the watermarks are log positions the tailer arms "
        "(PostgreSQL, MariaDB; sequenced; what every dump of a [source] read_only source does)",
    )
    dump.add_argument(
        "--max-rows-per-s",
        type=option(values.finite_number(0)),
        help="rate limit (dblog throttle changes it)",
    )
    dump.add_argument(
        "--dump-id", type=option(values.dump_id), help="resume this dump, or give a new one its id"
    )
    dump.add_argument(
        "--resume",
        action="store_true",
        help="with --dump-id: run a failed or cancelled dump again from its last completed chunk",
    )
    dump.add_argument(
        "--window-timeout",
        type=option(values.finite_number(0, above=True)),
        default=60.0,
        help="seconds a chunk waits for the tailer to send its rows before it is read again "
        "(default: %(default)s; a stopped or lagging tailer makes chunks wait)",
    )
    dump.add_argument(
        "--source-patience",
        type=option(values.finite_number(0)),
        default=SOURCE_PATIENCE_S,
        help="seconds the dump waits for a source or Redis it cannot reach (a restart, a "
        "failover; at its start too) before it fails (default: %(default)s)",
    )
    dump.set_defaults(func=_dump)

    for name, help_text in (
        ("pause", "pause a dump after its current chunk"),
        ("resume", "resume a paused dump"),
        ("cancel", "cancel a dump after its current chunk"),
    ):
        control = subparsers.add_parser(name, help=help_text)
        add_config_option(control)
        control.add_argument("dump_id", type=option(values.dump_id))
        control.set_defaults(func=_control, action=name)

    throttle = subparsers.add_parser("throttle", help="change a dump's pace while it runs")
    add_config_option(throttle)
    throttle.add_argument("dump_id", type=option(values.dump_id))
    throttle.add_argument(
        "--chunk-size", type=option(values.whole_number(1)), help="rows the next chunks read"
    )
    throttle.add_argument(
        "--delay-ms", type=option(values.whole_number(0)), help="pause between chunks"
    )
    throttle.add_argument(
        "--max-rows-per-s", type=option(values.finite_number(0)), help="0 removes the limit"
    )
    throttle.set_defaults(func=_control, action="throttle")


def _dump(args: argparse.Namespace) -> int:
    """Check the whole request (options, source, tables, keys) before anything is stored; a
    dump already stored runs again only if no live process runs it. Its log (on stderr) says
    when the source or Redis goes away and when it is back."""
    setup_logging()
    if args.keys is not None and args.table is None:
        raise InvalidRequest("--keys needs --table")
    if args.resume and args.dump_id is None:
        raise InvalidRequest("--resume needs --dump-id: the dump to resume")
    config = config_of(args)
    store = store_of(config)
    dump_id = args.dump_id or uuid.uuid4().hex[:12]
    source = source_for(config.source)

    def patiently(call: Callable[[], T]) -> T:
        return _patiently(call, f"dump {dump_id}", args.source_patience)

    stored = patiently(lambda: store.dumps.get(dump_id))
    if stored is None:
        if args.resume:
            raise InvalidRequest(f"--resume: there is no dump {dump_id} to resume")
        store.dumps.create(*patiently(lambda: _checked_request(config, source, dump_id, args)))
    else:
        if args.read_only and not (stored.request.read_only or config.source.read_only):
            raise InvalidRequest(
                f"--read-only: dump {dump_id} writes watermarks into the source; it runs on "
                "as it was asked (leave out --read-only), or give a read-only dump another "
                "--dump-id"
            )
        if args.table is not None:
            request, _ = patiently(lambda: _checked_request(config, source, dump_id, args))
            if _what(request) != _what(stored.request):
                raise InvalidRequest(
                    f"--dump-id {dump_id} is a dump of {_describe(stored.request)}, not of "
                    f"{_describe(request)}: give the new dump another --dump-id, or leave out "
                    "--table and --keys to run this one again"
                )
        driver = _live_driver(store, dump_id)
        if driver is not None:
            raise DBLogError(
                f"dump {dump_id} is running in {driver}: act on it with dblog "
                f"pause|resume|cancel|throttle {dump_id}"
            )
        if not _runnable_again(store, dump_id, args.resume):
            return 1
    interrupts.resumable(f"dblog dump --dump-id {dump_id}")
    if args.max_rows_per_s is not None:
        store.dumps.throttle(dump_id, max_rows_per_s=args.max_rows_per_s)
    print(f"dump {dump_id}: running (dblog pause|resume|cancel|throttle {dump_id})")
    stored = store.dumps.get(dump_id)
    assert stored is not None, f"dump {dump_id} was stored a moment ago"
    view = DumpProgressView(stored.request, store.dumps.load_progress(dump_id), sys.stdout)
    direct = None
    if stored.request.mode is DumpMode.DIRECT:
        direct = InProcessDirectReader(direct_target_for(config))
    try:
        state = run_dump(
            store,
            source.chunk_source,
            dump_id,
            window_timeout_s=args.window_timeout,
            source_patience_s=args.source_patience,
            on_progress=view.update,
            direct=direct,
        )
    finally:
        if direct is not None:
            direct.target.close()
    print(f"dump {dump_id}: {state}")
    return 0 if state == "done" else 1


def _patiently(call: Callable[[], T], label: str, patience_s: float) -> T:
    """`call()`, a source or Redis it cannot reach waited for as a running dump waits for one
    (a warning when it goes, a line when it is back), at most `patience_s`: a dump scheduled
    while its source restarts starts late rather than fails. Past the patience, a
    `DBLogError` saying what was away and for how long."""
    patience = Patience(patience_s, label=label)
    while True:
        try:
            result = call()
        except (SourceUnavailable, StateStoreUnavailable) as exc:
            delay = patience.away(exc)
            if delay is None:
                raise DBLogError(f"{label} cannot start: {patience.verdict()}") from None
            time.sleep(delay)
        else:
            patience.back()
            return result


def _checked_request(
    config: Config, source: Source, dump_id: str, args: argparse.Namespace
) -> tuple[DumpRequest, dict[TableRef, tuple[str, ...]]]:
    chunks = source.chunk_source(read_only=args.read_only)
    try:
        return build_request(
            config,
            chunks,
            dump_id=dump_id,
            tables=None if args.table is None else [args.table],
            keys=args.keys,
            chunk_size=args.chunk_size,
            parallelism=args.parallelism,
            mode=args.mode,
            where=args.where,
            default_chunk_sizes=IN_PROCESS_CHUNK_SIZE,
        )
    finally:
        chunks.close()


def _what(request: DumpRequest) -> tuple[object, ...]:
    """What a request dumps (not how fast): two runs of one dump id must agree on it."""
    return request.kind, request.tables, request.keys, request.where


def _describe(request: DumpRequest) -> str:
    tables = ", ".join(str(t) for t in request.tables)
    keys = f" ({len(request.keys)} keys)" if request.keys else ""
    where = f" where {request.where}" if request.where else ""
    return f"{tables}{keys}{where}"


def _live_driver(store: StateStore, dump_id: str) -> str | None:
    """The process that beats for the dump, unless it is a dead process of this host (one
    killed a moment ago: its beat outlives it by up to the driver TTL)."""
    driver = store.dumps.driver(dump_id)
    return None if driver is None or gone_from_this_host(driver) else driver


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
        reason = f" ({first_line(status.reason)})" if status.reason else ""
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


def _control(args: argparse.Namespace) -> int:
    store = store_of(config_of(args))
    return control(store.dumps, "dump", args.dump_id, args)
