"""`dblog tail`: run the log tailer, the one writer of the ordered output, until stopped.

It exits 0 on SIGINT/SIGTERM, and 1 with the cause when the tailer stops on an error it cannot
ride through (a supervisor restarts it); outages of the source, Redis or the output are ridden
through with backoff.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from airflow_provider_dblog.cli.common import add_config_option, config_of, setup_logging
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.tailer import Tailer, TailerFailed, tune_gc


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser("tail", help="run the log tailer (a long-running service)")
    add_config_option(parser)
    parser.add_argument("--owner", default=None, help="lease owner name (default: host:pid)")
    parser.set_defaults(func=_tail)


def _tail(args: argparse.Namespace) -> int:
    setup_logging()
    config = config_of(args)
    source_for(config.source).ensure_setup()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    tailer = Tailer.from_config(config, owner=args.owner)
    tune_gc()
    try:
        tailer.run(stop)
    except TailerFailed as exc:
        print(f"dblog: error: {exc}", file=sys.stderr)
        return 1
    return 0
