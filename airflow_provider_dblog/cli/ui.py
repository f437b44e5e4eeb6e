"""`dblog ui`: the live view of a source in a browser (see `airflow_provider_dblog/ui/`).

It reads only Redis (the config's `[redis]` and `[source] name`), so it runs anywhere the
state store is reachable, beside or away from the tailer, and as many times as wanted. Only a
failed or cancelled dump resumed from the page needs more: it runs as `dblog dump --resume`
with the same config, so the source must be reachable from here for that.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from airflow_provider_dblog.cli.common import (
    add_config_option,
    config_of,
    option,
    setup_logging,
)
from airflow_provider_dblog.core import values

DEFAULT_PORT = 8765


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    ui = subparsers.add_parser("ui", help="a live view of windows, events and dumps")
    add_config_option(ui)
    ui.add_argument(
        "--port", type=option(values.whole_number(0)), default=DEFAULT_PORT, help="0: any free one"
    )
    ui.add_argument(
        "--address",
        default="127.0.0.1",
        help="where to listen (default %(default)s: this machine only; the page can pause, "
        "throttle and cancel dumps)",
    )
    ui.add_argument(
        "--interval",
        type=option(values.finite_number(0.05)),
        default=0.5,
        help="seconds between snapshots while someone watches (default %(default)s)",
    )
    ui.set_defaults(func=_ui)


def _ui(args: argparse.Namespace) -> int:
    # Imported here: the view's server uses the CLI's value checks (cli.common), and the other
    # commands need none of it.
    from airflow_provider_dblog.ui.rerun import Rerunner
    from airflow_provider_dblog.ui.server import serve, shutdown
    from airflow_provider_dblog.ui.snapshot import LiveView

    setup_logging()
    config = config_of(args)
    view = LiveView(config.redis_client(), config.source.name, config.tailer.heartbeat_s)
    server = serve(view, args.address, args.port, args.interval, Rerunner(args.config))
    url = f"http://{server.host}:{server.port}/"
    print(f"dblog ui: {url} (source {config.source.name})", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        shutdown(server)
    return 0
