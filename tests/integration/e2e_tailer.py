"""The tailer writing two outputs at once, in its own process, for the end-to-end tests.

    python -m tests.integration.e2e_tailer CONFIG OWNER

`dblog tail` writes one output. This runs the same `Tailer` on the `dblog` TOML at CONFIG and
writes its `[output]` and, beside it through `FanOut`, a monotonic SQL-apply output into the
database whose DSN is in `$E2E_TARGET_DSN`, until SIGTERM (exit 0); a test may SIGKILL it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from airflow_provider_dblog.cli.common import setup_logging
from airflow_provider_dblog.config import load_config
from airflow_provider_dblog.outputs import Output, SqlApplyOutput
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer
from airflow_provider_dblog.targets import open_output
from tests.integration.e2e_support import FanOut


def main(config_path: str, owner: str) -> int:
    setup_logging()
    config = load_config(config_path)
    source = source_for(config.source)
    source.ensure_setup()
    settings = config.tailer

    def outputs() -> Output:
        sql = SqlApplyOutput(os.environ["E2E_TARGET_DSN"], monotonic=True)
        return FanOut(sql, open_output(config.output, max_wait_s=settings.lease_ttl_ms / 4000))

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    store = StateStore(config.redis_client(), source.name)
    Tailer(source, store, outputs, owner=owner, settings=settings).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
