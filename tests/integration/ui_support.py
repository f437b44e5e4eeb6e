"""`dblog ui` for the tests: a subprocess on a free port, served once its snapshot answers,
stopped with SIGTERM, which must end it cleanly."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from airflow_provider_dblog.devservices.process import free_port
from tests.integration.e2e_support import DBLOG, wait_until


@contextmanager
def running_ui(config: Path, env: dict[str, str], work: Path) -> Iterator[str]:
    """`dblog ui --config CONFIG` in `env`; its URL. Its output goes to `work/ui.log`."""
    port = free_port()
    log_path = work / "ui.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [DBLOG, "ui", "--config", str(config), "--port", str(port), "--interval", "0.2"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def serving() -> bool:
        assert process.poll() is None, log_path.read_text()
        try:
            return httpx.get(f"{url}/api/snapshot", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(serving, 30, "dblog ui serving")
        yield url
    finally:
        process.terminate()
        assert process.wait(30) == 0, log_path.read_text()
        log.close()
