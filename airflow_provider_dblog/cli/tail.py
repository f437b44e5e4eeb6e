"""`dblog tail`: run the log tailer, the one writer of the ordered output, until stopped.

It exits 0 on SIGINT/SIGTERM, its last log line naming the signal and the position it
acknowledged last (a SIGINT while it starts ends it as any command: `cli/interrupts.py`), and 1
when the tailer stops on an error it cannot ride through, its last log line naming the cause (a
supervisor restarts it). Outages of the source, Redis or the output are
ridden through with backoff, at startup too (a server still starting); a source that refuses
its setup (no logical `wal_level`, a missing table or grant) ends it at once with one line
(`dblog: error: ...`, exit 2).

SIGHUP reloads the TOML: a new `[source] tables` (and `unique_keys`) list is set up (a table
added joins the publication) and followed from the next transaction boundary without giving up
the lease (`Tailer.reload`); with `--dump-added` each table added is then dumped by this process.
Any other change, or a reload that fails its checks, is logged and changes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import threading
import time
from typing import Any

from airflow_provider_dblog.cli.common import add_config_option, config_of, setup_logging
from airflow_provider_dblog.config import Config, ConfigError
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.dump.request import IN_PROCESS_CHUNK_SIZE, build_request
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer, TailerFailed, tune_gc

log = logging.getLogger(__name__)
RELOADABLE = ("tables", "unique_keys")
"""The `[source]` options a reload takes; any other change needs a restart."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser("tail", help="run the log tailer (a long-running service)")
    add_config_option(parser)
    parser.add_argument("--owner", default=None, help="lease owner name (default: host:pid)")
    parser.add_argument(
        "--dump-added",
        action="store_true",
        help="after a reload (SIGHUP) adds tables, dump each of them from this process",
    )
    parser.set_defaults(func=_tail)


def _tail(args: argparse.Namespace) -> int:
    setup_logging()
    config = config_of(args)
    stop = threading.Event()
    stopped_by: list[str] = []

    def stopping(number: int, _: object) -> None:
        stopped_by.append(signal.Signals(number).name)
        stop.set()

    reload_asked = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stopping)
    signal.signal(signal.SIGHUP, lambda *_: reload_asked.set())
    tailer = Tailer.from_config(config, owner=args.owner)
    if not tailer.set_up(stop):
        log.info("tailer %s stopped on %s waiting for its source", tailer.owner, stopped_by[0])
        return 0
    reloads = threading.Thread(
        target=_reloads,
        args=(args, config, tailer, reload_asked, stop),
        name="dblog-reload",
        daemon=True,
    )
    reloads.start()
    tune_gc()
    try:
        tailer.run(stop)
    except TailerFailed:  # logged by the tailer, as its last line
        return 1
    where = (
        "as a standby"
        if tailer.acknowledged is None
        else f"at acknowledged position {tailer.acknowledged}"
    )
    log.info("tailer %s stopped on %s %s", tailer.owner, stopped_by[0], where)
    return 0


def _reloads(
    args: argparse.Namespace,
    config: Config,
    tailer: Tailer,
    asked: threading.Event,
    stop: threading.Event,
) -> None:
    """Take each SIGHUP's reload, one at a time, until `stop`."""
    while not stop.is_set():
        if not asked.wait(0.5):
            continue
        asked.clear()
        try:
            fresh = config_of(args)
            check_reloadable(config, fresh)
            source = source_for(fresh.source)
            source.ensure_setup()
        except DBLogError as exc:
            log.error("reload refused, the tailer goes on as it was: %s", exc)
            continue
        added = [t for t in fresh.source.tables if t not in config.source.tables]
        tailer.reload(source)
        config = fresh
        if args.dump_added and added:
            threading.Thread(
                target=_dump_added, args=(config, added, stop), name="dblog-dump-added"
            ).start()


def check_reloadable(current: Config, fresh: Config) -> None:
    """`ConfigError` unless `fresh` differs from `current` in `RELOADABLE` options only."""
    changed = [
        f"[source] {f.name}"
        for f in dataclasses.fields(current.source)  # type: ignore[arg-type]
        if f.name not in RELOADABLE
        and getattr(current.source, f.name) != getattr(fresh.source, f.name, None)
    ]
    if type(current.source) is not type(fresh.source):
        changed = ["[source] type"]
    for section, before, after in (
        ("[redis]", current.redis, fresh.redis),
        ("[output]", current.output, fresh.output),
        ("[tailer]", current.tailer, fresh.tailer),
        ("[lake]", current.lake_root, fresh.lake_root),
    ):
        if before != after:
            changed.append(section)
    if changed:
        raise ConfigError(
            f"a reload takes [source] {' and '.join(RELOADABLE)} only; {', '.join(changed)} "
            "changed: restart dblog tail for that"
        )


def _dump_added(config: Config, tables: list[TableRef], stop: threading.Event) -> None:
    """Dump each added table once the tailer follows it (it recorded the reload)."""
    store = StateStore(config.redis_client(), config.source.name)
    deadline = time.monotonic() + 300
    while not any(set(tables) <= set(c.added) for c in store.tailer.tables_changes()[:1]):
        if stop.wait(0.2) or time.monotonic() > deadline:
            log.error("the tailer did not take the reload of %s: no dump", tables)
            return
    source = source_for(config.source)
    for table in tables:
        dump_id = f"added.{table}.{int(time.time() * 1000)}"
        chunks = source.chunk_source()
        try:
            request, key_columns = build_request(
                config,
                chunks,
                dump_id=dump_id,
                tables=[str(table)],
                keys=None,
                chunk_size=None,
                parallelism=1,
                mode="sequenced",
                default_chunk_sizes=IN_PROCESS_CHUNK_SIZE,
            )
            store.dumps.create(request, key_columns)
        except DBLogError as exc:
            log.error("cannot dump the added table %s: %s", table, exc)
            continue
        finally:
            chunks.close()
        log.info("dumping the added table %s as dump %s", table, dump_id)
        try:
            state = run_dump(store, source.chunk_source, dump_id, stop=stop)
        except DBLogError as exc:
            log.error("the dump of the added table %s failed: %s", table, exc)
            continue
        log.info("dump %s of the added table %s: %s", dump_id, table, state)
