"""`dblog tail` with a journal of the batches its output accepted, for the lossy failover test.

    python -m tests.integration.redis_ha.journaled_tailer CONFIG OWNER

Runs the `Tailer` of the `dblog` TOML at CONFIG as `dblog tail` does, its output wrapped so
that each batch the output accepted appends `{"token", "start", "end"}` to
`$E2E_BATCH_JOURNALS/<OWNER>.ndjson` (`start` and `end` on CLOCK_MONOTONIC, one clock for every
process of the host), and each it refused as fenced `{"refused": token, ...}`. Until SIGTERM
(exit 0); a test may SIGSTOP or SIGKILL it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from airflow_provider_dblog.cli.common import setup_logging
from airflow_provider_dblog.config import load_config
from airflow_provider_dblog.core.event import Event
from airflow_provider_dblog.core.lines import Lines
from airflow_provider_dblog.outputs import Output
from airflow_provider_dblog.outputs.base import OutputFenced
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer
from airflow_provider_dblog.targets import open_output

JOURNALS_ENV = "E2E_BATCH_JOURNALS"


class JournaledOutput(Output):
    """`inner`, each batch it accepted or refused as fenced recorded in `journal`."""

    def __init__(self, inner: Output, journal: Path) -> None:
        self._inner, self._journal = inner, journal

    def write(self, events: Sequence[Event], token: int) -> None:
        self.write_items(events, token)

    def write_items(self, items: Sequence[Event | Lines], token: int) -> None:
        start = time.monotonic()
        try:
            self._inner.write_items(items, token)
        except OutputFenced:
            self._record({"refused": token, "start": start, "end": time.monotonic()})
            raise
        if items:
            self._record({"token": token, "start": start, "end": time.monotonic()})

    def _record(self, entry: dict[str, float]) -> None:
        with self._journal.open("a") as journal:
            journal.write(json.dumps(entry) + "\n")

    def fence(self, source: str) -> int | None:
        return self._inner.fence(source)

    def close(self) -> None:
        self._inner.close()


def main(config_path: str, owner: str) -> int:
    setup_logging()
    config = load_config(config_path)
    source = source_for(config.source)
    source.ensure_setup()
    settings = config.tailer
    journal = Path(os.environ[JOURNALS_ENV]) / f"{owner}.ndjson"

    def output() -> Output:
        inner = open_output(config.output, max_wait_s=settings.lease_ttl_ms / 4000)
        return JournaledOutput(inner, journal)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    store = StateStore(config.redis_client(), source.name)
    Tailer(source, store, output, owner=owner, settings=settings).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
