"""`dblog tail`: run the log tailer, the one writer of the ordered output, until stopped."""

from __future__ import annotations

import argparse
import signal
import socket
import threading
from typing import Any

from airflow_provider_dblog.cli.common import add_config_option, config_of, setup_logging, store_of
from airflow_provider_dblog.outputs import open_output
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.tailer import Tailer, TailerSettings


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser("tail", help="run the log tailer (a long-running service)")
    add_config_option(parser)
    parser.add_argument("--owner", default=None, help="lease owner name (default: host:pid)")
    parser.set_defaults(func=_tail)


def _tail(args: argparse.Namespace) -> int:
    setup_logging()
    config = config_of(args)
    source = source_for(config.source)
    source.ensure_setup()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    owner = args.owner or f"{socket.gethostname()}:{threading.get_native_id()}"
    tailer = Tailer(
        source.name,
        source.database(),
        source.log_reader,
        store_of(config),
        # Opened once the lease is held: a standby must not take the output (NDJSON locks its
        # directory, so a standby opening it first would exit instead of waiting).
        lambda: open_output(config.output),
        owner,
        TailerSettings(**config.tailer),
    )
    tailer.run(stop)
    return 0
